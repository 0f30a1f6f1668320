"""Shortcut models: the step-size conditioning, the self-consistency target and few-step sampling."""

import math

import pytest
import torch
from conftest import fast_config, sample_with

from tinydit.checkpoints.checkpoint import load_model
from tinydit.cli import main
from tinydit.flow.shortcut import FINEST_STEP, LEVELS, n_self_consistency, shortcut_loss
from tinydit.models.dit import DiT, DiTConfig
from tinydit.train import Trainer

CFG = DiTConfig(dim=32, depth=1, n_heads=2, shortcut=True)


def test_step_size_conditioning_starts_neutral_and_then_matters():
    torch.manual_seed(0)
    model = DiT(CFG)
    x, t, y = torch.randn(2, 3, 32, 32), torch.rand(2), torch.tensor([0, 1])
    assert torch.count_nonzero(model(x, t, y, torch.full((2,), 0.5))) == 0  # adaLN-Zero still holds
    for p in model.parameters():  # move off the zero init
        p.data.add_(0.05 * torch.randn_like(p))
    # d = None means d = 0 (the instantaneous velocity), and the step size changes the prediction.
    torch.testing.assert_close(model(x, t, y), model(x, t, y, torch.zeros(2)))
    assert not torch.allclose(model(x, t, y, torch.zeros(2)), model(x, t, y, torch.ones(2)))


class Spy(torch.nn.Module):
    """A constant velocity field that records every call: (t, d, grad enabled, batch size)."""

    def __init__(self, value: float = 0.3):
        super().__init__()
        self.config = CFG
        self.value = torch.nn.Parameter(torch.tensor(value))
        self.calls: list[tuple[torch.Tensor, torch.Tensor | None, bool, int]] = []

    def forward(self, x, t, y, d=None):
        self.calls.append((t.clone(), None if d is None else d.clone(), torch.is_grad_enabled(), x.shape[0]))
        return self.value * torch.ones_like(x)

    def null_condition(self, y):
        return torch.full_like(y, self.config.n_classes)  # the null label, as DiT.null_condition


def test_self_consistency_targets_two_half_steps_and_trains_the_double_step():
    spy = Spy()
    b = 16
    x0, noise = torch.randn(b, 3, 32, 32), torch.randn(b, 3, 32, 32)
    t, y = torch.rand(b), torch.zeros(b, dtype=torch.long)
    loss = shortcut_loss(spy, x0, y, t, noise, generator=torch.Generator().manual_seed(0), reduce=False)
    (t1, d1, grad1, n1), (t2, d2, grad2, n2), (t3, d3, grad3, n3) = spy.calls
    assert (n1, n2, n3) == (4, 4, b) and not grad1 and not grad2 and grad3  # targets without gradients
    levels = -torch.log2(d1)
    assert torch.equal(levels, levels.round()) and levels.min() >= 1 and levels.max() <= LEVELS
    assert torch.all(t1 >= 2 * d1) and torch.all(t1 <= 1)  # two steps of d stay on [0, 1]
    torch.testing.assert_close(t2, t1 - d1)  # the second half step starts where the first ends
    assert torch.equal(d2, d1)
    # flow matching at the finest step, and 2d for self-consistency
    assert torch.equal(d3[:12], torch.full((12,), FINEST_STEP)) and torch.equal(d3[12:], 2 * d1)
    assert torch.equal(t3[:12], t[:12]) and torch.equal(t3[12:], t1)
    # A constant field is exactly self-consistent: those images have zero loss; flow matching does not.
    assert torch.all(loss[12:] == 0) and torch.all(loss[:12] > 0)
    flow = (0.3 - (noise[:12] - x0[:12])).pow(2).flatten(1).mean(1)
    torch.testing.assert_close(loss[:12], flow)


def test_the_finest_step_self_consistency_asks_for_is_one_flow_matching_trains():
    """The base of the chain of levels: the step the finest self-consistency target is computed with is a
    step the flow-matching part of the loss feeds the model (the official code's flow-matching index)."""
    spy, b = Spy(), 256
    x0, noise = torch.randn(b, 3, 32, 32), torch.randn(b, 3, 32, 32)
    t, y = torch.rand(b), torch.zeros(b, dtype=torch.long)
    shortcut_loss(spy, x0, y, t, noise, generator=torch.Generator().manual_seed(0))
    (_, asked, _, _), _, (_, trained, _, _) = spy.calls
    n_fm = b - n_self_consistency(b)
    assert asked.min().item() == 2.0**-LEVELS == FINEST_STEP  # the finest level is drawn
    assert asked.min().item() in set(trained[:n_fm].tolist())


def test_a_step_below_the_finest_reaches_the_model_as_the_finest():
    """So that 256 Euler steps, or Heun's d = 0, ask for an input the loss trained; a model written before
    ``finest_step`` (0) is told every step as it is, as it was trained."""
    torch.manual_seed(0)
    model = DiT(DiTConfig(dim=32, depth=1, n_heads=2, shortcut=True, finest_step=FINEST_STEP))
    for p in model.parameters():  # move off the zero init, where d changes nothing
        p.data.add_(0.05 * torch.randn_like(p))
    x, t, y = torch.randn(2, 3, 32, 32), torch.rand(2), torch.tensor([0, 1])
    finest = model(x, t, y, torch.full((2,), FINEST_STEP))
    for d in (None, torch.zeros(2), torch.full((2,), 1 / 256)):
        torch.testing.assert_close(model(x, t, y, d), finest)
    assert not torch.allclose(model(x, t, y, torch.full((2,), 1 / 64)), finest)  # a trained level stays its own
    old = DiT(DiTConfig(dim=32, depth=1, n_heads=2, shortcut=True))
    old.load_state_dict(model.state_dict())
    assert old.config.finest_step == 0 and not torch.allclose(old(x, t, y, torch.zeros(2)), finest)


def test_euler_tells_a_shortcut_model_its_step_size_and_heun_asks_for_the_velocity():
    noise, y = torch.randn(2, 3, 32, 32), torch.tensor([0, 1])
    for steps in (1, 2, 4):
        spy = Spy()
        res = sample_with("euler", spy, noise, y, steps=steps, cfg_scale=1.0)
        assert res.nfe == steps and [c[1].tolist() for c in spy.calls] == [[1 / steps] * 2] * steps
        torch.testing.assert_close(res.x, noise - 0.3)  # a constant field, integrated over [0, 1]
    spy = Spy()
    sample_with("euler", spy, noise, y, steps=2, cfg_scale=2.0)  # guided: one batched pass of 2N, d for both halves
    assert [c[3] for c in spy.calls] == [4, 4] and spy.calls[0][1].tolist() == [0.5] * 4
    spy = Spy()
    sample_with("heun", spy, noise, y, steps=2, cfg_scale=1.0)
    assert all(c[1].abs().sum() == 0 for c in spy.calls)  # d = 0: the instantaneous velocity


def test_shortcut_training_resumes_exactly_and_samples_in_one_step(tmp_path, capsys):
    kw = dict(steps=4, batch_size=8, limit=24, objective="shortcut")
    straight = Trainer(fast_config(tmp_path / "a", **kw), progress=False)
    straight.fit()
    Trainer(fast_config(tmp_path / "b", **{**kw, "steps": 2}), progress=False).fit()
    resumed = Trainer(fast_config(tmp_path / "b", **kw), progress=False)
    resumed.fit()
    for k, v in straight.run.model.state_dict().items():
        assert torch.equal(v, resumed.run.model.state_dict()[k]), k
    model, _ = load_model(tmp_path / "a" / "checkpoint.pt")
    assert model.config.shortcut and model.d_embed is not None and model.config.finest_step == FINEST_STEP
    code = main(
        [
            "sample",
            "--checkpoint",
            str(tmp_path / "a" / "checkpoint.pt"),
            "--steps",
            "1",
            "--cfg",
            "1",
            "--n",
            "4",
            "--precision",
            "fp32",
            "--out",
            str(tmp_path / "one.png"),
        ]
    )
    assert code == 0 and "1 model evaluations per image" in capsys.readouterr().err
    with pytest.raises(Exception, match="objective: 'shortcut' -> 'flow'"):
        Trainer(fast_config(tmp_path / "a", **{**kw, "objective": "flow", "steps": 5}), progress=False)


def test_shortcut_loss_falls_in_a_short_run(tmp_path):
    trainer = Trainer(
        fast_config(tmp_path, steps=30, batch_size=32, limit=256, objective="shortcut", log_every=10), progress=False
    )
    first = trainer.validation_losses(trainer.run.ema)[0]
    result = trainer.fit()
    assert math.isfinite(result.val_loss) and result.val_loss < 0.8 * first
