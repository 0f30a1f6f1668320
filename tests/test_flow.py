import math
from types import SimpleNamespace

import pytest
import torch
from conftest import sample_with
from torch import nn

from tinydit.api import resolve_labels
from tinydit.errors import TinyDiTError
from tinydit.flow import flow_loss, interpolate, velocity_target
from tinydit.flow.generate import class_cycle, generate
from tinydit.flow.grids import time_grid
from tinydit.flow.guidance import guided_velocity
from tinydit.flow.settings import SamplingSettings
from tinydit.models.dit import DiT, DiTConfig


class Field(nn.Module):
    """A 'model' with a known velocity field v = fn(x, t, y)."""

    def __init__(self, fn, n_classes=2):
        super().__init__()
        self.fn = fn
        self.config = SimpleNamespace(n_classes=n_classes)
        self.calls = 0

    def forward(self, x, t, y):
        self.calls += 1
        return self.fn(x, t, y)

    def null_condition(self, y):
        return torch.full_like(y, self.config.n_classes)  # the null label, as DiT.null_condition


def test_path_endpoints_follow_the_time_convention():
    x0, noise = torch.randn(4, 3, 8, 8), torch.randn(4, 3, 8, 8)
    assert torch.equal(interpolate(x0, noise, torch.zeros(4)), x0)  # t = 0 is data
    assert torch.equal(interpolate(x0, noise, torch.ones(4)), noise)  # t = 1 is noise
    mid = interpolate(x0, noise, torch.full((4,), 0.25))
    assert torch.allclose(mid, 0.75 * x0 + 0.25 * noise)


def test_velocity_is_the_time_derivative_of_the_path():
    x0, noise = torch.randn(2, 1, 4, 4), torch.randn(2, 1, 4, 4)
    t, h = torch.full((2,), 0.4), 1e-3
    fd = (interpolate(x0, noise, t + h) - interpolate(x0, noise, t - h)) / (2 * h)
    assert torch.allclose(fd, velocity_target(x0, noise), atol=1e-3)


def test_loss_is_zero_for_the_true_velocity_and_positive_otherwise():
    x0, noise = torch.randn(3, 1, 4, 4), torch.randn(3, 1, 4, 4)
    oracle = Field(lambda x, t, y: noise - x0)
    assert flow_loss(oracle, x0, None, torch.rand(3), noise).item() == 0
    zero = Field(lambda x, t, y: torch.zeros_like(x))
    per = flow_loss(zero, x0, None, torch.rand(3), noise, reduce=False)
    assert per.shape == (3,) and torch.allclose(per, (noise - x0).pow(2).flatten(1).mean(1))


def test_time_grid_runs_from_noise_to_data():
    g = time_grid(4)
    assert g.tolist() == [1.0, 0.75, 0.5, 0.25, 0.0]


def test_euler_on_linear_field_matches_closed_form_and_converges():
    # dx/dt = x from t = 1 to 0: exact x(0) = x(1) / e; Euler gives x(1) (1 - 1/n)^n.
    x1 = torch.ones(1, 1, 1, 1)
    field = Field(lambda x, t, y: x)
    errors = []
    for n in (4, 8, 16, 32):
        res = sample_with("euler", field, x1, torch.zeros(1, dtype=torch.long), steps=n)
        assert res.nfe == n
        assert math.isclose(res.x.item(), (1 - 1 / n) ** n, rel_tol=1e-5)
        errors.append(abs(res.x.item() - math.exp(-1)))
    ratios = [a / b for a, b in zip(errors, errors[1:], strict=False)]
    assert all(1.8 < r < 2.2 for r in ratios), ratios  # first order: error halves as steps double


@pytest.mark.parametrize("steps", [1, 3, 10])
def test_perfect_model_of_one_point_lands_on_it_in_any_number_of_steps(steps):
    # For data = {x0}, the ideal velocity is (x_t - x0) / t: straight lines, so Euler is exact.
    x0 = torch.randn(1, 3, 4, 4)
    field = Field(lambda x, t, y: (x - x0) / t.view(-1, 1, 1, 1))
    res = sample_with("euler", field, torch.randn(5, 3, 4, 4), torch.zeros(5, dtype=torch.long), steps=steps)
    assert torch.allclose(res.x, x0.expand(5, -1, -1, -1), atol=1e-5)


def test_guidance_scale_one_is_the_conditional_prediction_with_one_evaluation():
    torch.manual_seed(0)
    model = DiT(DiTConfig(dim=32, depth=1, n_heads=2, n_classes=3))
    for p in model.parameters():
        p.data.add_(0.05 * torch.randn_like(p))
    x, t, y = torch.randn(2, 3, 32, 32), torch.rand(2), torch.tensor([0, 2])
    v, evals = guided_velocity(model, x, t, y, 1.0)
    assert evals == 1 and torch.equal(v, model(x, t, y))
    v0, evals = guided_velocity(model, x, t, y, 0.0)
    assert evals == 2 and torch.allclose(v0, model(x, t, torch.tensor([3, 3])), atol=1e-5)
    v3, _ = guided_velocity(model, x, t, y, 3.0)
    cond, uncond = model(x, t, y), model(x, t, torch.tensor([3, 3]))
    assert torch.allclose(v3, uncond + 3 * (cond - uncond), atol=1e-5)


def test_nfe_counts_guidance_pass():
    field = Field(lambda x, t, y: torch.zeros_like(x))
    res = sample_with("euler", field, torch.zeros(2, 1, 2, 2), torch.zeros(2, dtype=torch.long), steps=5, cfg_scale=2.0)
    assert res.nfe == 10 and field.calls == 5  # two evaluations per image per step, one batched call


def test_same_seed_same_samples_different_seed_different():
    torch.manual_seed(0)
    model = DiT(DiTConfig(dim=32, depth=1, n_heads=2)).eval()
    for p in model.parameters():
        p.data.add_(0.05 * torch.randn_like(p))
    y = class_cycle(6, 10)
    euler = SamplingSettings("euler", 3, 2.0)
    a = generate(model, y, euler, seed=7, batch_size=4).x
    b = generate(model, y, euler, seed=7, batch_size=6).x
    c = generate(model, y, euler, seed=8).x
    assert torch.allclose(a, b, atol=1e-5)  # independent of batching
    assert not torch.allclose(a, c)


@pytest.mark.parametrize("steps, cfg, match", [(0, 1.0, "`steps` must be >= 1"), (4, -1.0, "guidance scale")])
def test_bad_sampler_arguments(steps, cfg, match):
    field = Field(lambda x, t, y: x)
    with pytest.raises(TinyDiTError, match=match):
        sample_with(
            "euler", field, torch.zeros(1, 1, 1, 1), torch.zeros(1, dtype=torch.long), steps=steps, cfg_scale=cfg
        )


def test_class_cycle_is_balanced_and_labels_resolve():
    assert class_cycle(7, 3).tolist() == [0, 1, 2, 0, 1, 2, 0]
    classes = ["circle", "square", "triangle"]
    assert resolve_labels(None, classes, 4).tolist() == [0, 1, 2, 0]
    assert resolve_labels(["Square", "0"], classes, 3).tolist() == [1, 0, 1]
    assert resolve_labels(["triangle,1"], classes, 2).tolist() == [2, 1]
    with pytest.raises(TinyDiTError, match="unknown class 'hexagon'.*circle, square, triangle"):
        resolve_labels(["hexagon"], classes, 2)
    with pytest.raises(TinyDiTError, match="unknown class '3'"):
        resolve_labels(["3"], classes, 2)


def test_training_time_distributions():
    from tinydit.flow import sample_t

    gen = torch.Generator().manual_seed(0)
    u = sample_t(100_000, gen)
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01 and abs(u.std() - (1 / 12) ** 0.5) < 0.01
    ln = sample_t(100_000, gen, kind="logit-normal", loc=0.5, scale=0.8)
    logit = torch.log(ln / (1 - ln))
    assert abs(logit.mean() - 0.5) < 0.01 and abs(logit.std() - 0.8) < 0.01  # logit(t) ~ N(loc, scale^2)
    shifted = sample_t(100_000, gen, shift=3.0)
    assert abs(shifted.median() - 0.75) < 0.01  # the median 1/2 maps to s / (s + 1)
    with pytest.raises(TinyDiTError, match="unknown time sampling"):
        sample_t(2, gen, kind="beta")
