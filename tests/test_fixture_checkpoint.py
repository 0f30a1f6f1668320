"""Checkpoints written before the package moved into subpackages still load and sample the same pictures.

``tests/fixtures/{dit,mmdit}-0.2m.pt`` were written by ``Trainer`` at commit 5936954 (60 steps on shapes,
``tests/conftest.py``'s fast config), and ``*-samples.pt`` holds what ``generate`` drew from them then:
4 steps, guidance 2, seed 0, with Euler, Heun (guided on [0.1, 0.8]) and the ancestral sampler.

They were bit-identical on the machine that wrote them, but not across CPUs: another CPU (or another ATen
kernel set, ``ATEN_CPU_CAPABILITY=avx2|default``) sums the fp32 matmuls in another order and moves pixels by
1-3e-6 (measured 2026-12-02, 2-core AMD EPYC, torch 2.14.1). So the check is a tolerance ten times that, far
below what a real change does: one more step moves Euler's pixels by 0.18, guidance 2.1 instead of 2 by 3e-3.
"""

from pathlib import Path

import pytest
import torch

from tinydit.checkpoints.checkpoint import load_model
from tinydit.flow.generate import generate
from tinydit.flow.settings import SamplingSettings

FIXTURES = Path(__file__).parent / "fixtures"
TOLERANCE = 3e-5  # fp32 rounding across CPUs, see above; pixels are in [-1, 1]
SAMPLERS = {"euler": {}, "heun": {"cfg_interval": (0.1, 0.8)}, "ancestral": {}}


@pytest.mark.parametrize("name", ["dit", "mmdit"])
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_an_old_checkpoint_samples_the_same_pictures(name, sampler):
    model, _ = load_model(FIXTURES / f"{name}-0.2m.pt")
    expected = torch.load(FIXTURES / f"{name}-0.2m-samples.pt", weights_only=True)
    x = generate(model, expected["y"], SamplingSettings(sampler, 4, 2.0, **SAMPLERS[sampler]), seed=0).x
    assert x.abs().max() > 0.3  # a real picture, not an untrained model's near-zeros
    torch.testing.assert_close(x, expected[sampler], rtol=0, atol=TOLERANCE)
