"""Checkpoints written before the package moved into subpackages still load and sample bit-identically.

``tests/fixtures/{dit,mmdit}-0.2m.pt`` were written by ``Trainer`` at commit 5936954 (60 steps on shapes,
``tests/conftest.py``'s fast config), and ``*-samples.pt`` holds what ``generate`` drew from them then:
4 steps, guidance 2, seed 0, with Euler, Heun (guided on [0.1, 0.8]) and the ancestral sampler.
"""

from pathlib import Path

import pytest
import torch

from tinydit.flow.generate import generate
from tinydit.models.checkpoint import load_model

FIXTURES = Path(__file__).parent / "fixtures"
SAMPLERS = {"euler": {}, "heun": {"cfg_interval": (0.1, 0.8)}, "ancestral": {}}


@pytest.mark.parametrize("name", ["dit", "mmdit"])
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_an_old_checkpoint_samples_bit_identically(name, sampler):
    model, _ = load_model(FIXTURES / f"{name}-0.2m.pt")
    expected = torch.load(FIXTURES / f"{name}-0.2m-samples.pt", weights_only=True)
    x = generate(model, expected["y"], steps=4, cfg_scale=2.0, seed=0, sampler=sampler, **SAMPLERS[sampler]).x
    assert x.abs().max() > 0.3  # a real picture, not an untrained model's near-zeros
    assert torch.equal(x, expected[sampler])
