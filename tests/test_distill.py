import math

import pytest
import torch
from conftest import built_once, fast_config, sample_with

from tinydit.checkpoints.checkpoint import load_model
from tinydit.cli import main
from tinydit.config import TrainConfig
from tinydit.errors import TinyDiTError
from tinydit.flow.distill import KNOTS, STUDENT_STEPS, distill_loss, distill_losses_by_steps, init_student
from tinydit.flow.samplers import sample_path
from tinydit.flow.settings import SamplingSettings
from tinydit.models.dit import DiT, DiTConfig
from tinydit.train import Trainer
from tinydit.train.resolve import resolve

TINY = dict(img_size=8, in_channels=1, patch_size=4, dim=32, depth=1, n_heads=2, n_classes=3)
DISTILL = dict(objective="distill", distill_paths=24, teacher_steps=8, batch_size=8)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A briefly trained shapes teacher: its checkpoint path."""

    def build(out):
        Trainer(fast_config(out, steps=6), progress=False).fit()

    return built_once(tmp_path_factory, "teacher", build) / "checkpoint.pt"


@pytest.mark.parametrize("name", ["euler", "heun", "midpoint"])
def test_sample_path_is_the_sampler_run_with_every_knot_kept(name):
    torch.manual_seed(0)
    model = DiT(DiTConfig(**TINY)).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.05)  # a non-trivial field
    noise, y = torch.randn(3, 1, 8, 8), torch.tensor([0, 1, 2])
    settings = SamplingSettings(name, 8, 2.0, cfg_interval=(0.2, 0.8))
    states, nfe = sample_path(settings, model, noise, y, knots=4)
    full = sample_with(name, model, noise, y, steps=8, cfg_scale=2.0, cfg_interval=(0.2, 0.8))
    assert states.shape == (5, 3, 1, 8, 8) and nfe == full.nfe
    assert torch.equal(states[4], noise) and torch.allclose(states[0], full.x, atol=1e-6)
    half = sample_path(settings, model, noise, y, knots=2)[0]
    assert torch.allclose(half[1], states[2], atol=1e-6)  # t = 1/2 is the same point of the same path
    with pytest.raises(TinyDiTError, match="fixed-step sampler"):
        sample_path(SamplingSettings("dopri5", 8, 1.0), model, noise, y, knots=4)
    with pytest.raises(TinyDiTError, match="a multiple of it"):
        sample_path(settings, model, noise, y, knots=3)


class StraightLine(torch.nn.Module):
    """The exact average velocity of paths x_t = t * noise (data at 0): v = x_t / t for every step size."""

    def forward(self, x, t, y, d):
        assert d.shape == t.shape and ((d > 0) & (d <= t + 1e-6)).all()  # a jump never passes t = 0
        return x / t.view(-1, 1, 1, 1)


def test_distill_loss_targets_the_teachers_next_knot():
    noise = torch.randn(16, 1, 4, 4)
    k = torch.arange(KNOTS + 1).float() / KNOTS
    states = k.view(1, -1, 1, 1, 1) * noise.unsqueeze(1)  # (16, KNOTS + 1, 1, 4, 4): x at t = k / KNOTS
    y = torch.zeros(16, dtype=torch.long)
    exact = distill_loss(StraightLine(), states, y, torch.Generator().manual_seed(0))
    assert exact.item() < 1e-10
    assert distill_losses_by_steps(StraightLine(), states, y, batch_size=5) == pytest.approx([0.0] * 4, abs=1e-10)
    # A model that stands still misses by the whole average velocity, noise itself, at every step count.
    zero = distill_losses_by_steps(lambda x, t, y, d: torch.zeros_like(x), states, y)
    assert zero == pytest.approx([noise.pow(2).mean().item()] * len(STUDENT_STEPS), rel=1e-5)


def test_the_student_starts_as_the_teacher_for_every_step_size():
    torch.manual_seed(0)
    teacher = DiT(DiTConfig(**TINY))
    for p in teacher.parameters():
        p.data.normal_(0, 0.05)
    student = DiT(DiTConfig(**TINY, shortcut=True))
    init_student(student, teacher.state_dict())
    x, t, y = torch.randn(4, 1, 8, 8), torch.rand(4), torch.tensor([0, 1, 2, 3])
    for d in (0.0, 0.125, 1.0):
        assert torch.allclose(student(x, t, y, torch.full((4,), d)), teacher(x, t, y), atol=1e-6)
    other = DiT(DiTConfig(**{**TINY, "dim": 64}, shortcut=True))
    with pytest.raises(TinyDiTError, match="do not fit the student"):
        init_student(other, teacher.state_dict())


def test_distill_settings_are_checked_before_any_work(tmp_path, teacher):
    # checked as the run's config is resolved, the first thing a run does (the objective owns the checks)
    with pytest.raises(TinyDiTError, match="`teacher`"):
        resolve(TrainConfig(objective="distill"))
    with pytest.raises(TinyDiTError, match="multiple of 8"):
        resolve(TrainConfig(objective="distill", teacher=str(teacher), teacher_steps=12))
    with pytest.raises(TinyDiTError, match="only used with `objective` distill"):
        resolve(TrainConfig(teacher=str(teacher)))
    with pytest.raises(TinyDiTError, match="copies the teacher's architecture"):
        resolve(TrainConfig(objective="distill", teacher=str(teacher), mlp="gelu"))
    with pytest.raises(TinyDiTError, match="trained on shapes"):
        Trainer(fast_config(tmp_path, data="fashion-mnist", teacher=str(teacher), **DISTILL), progress=False)


def test_distillation_resumes_exactly_reuses_its_paths_and_samples_in_one_step(tmp_path, teacher, capsys):
    kw = dict(steps=4, teacher=str(teacher), preset="dit-1.9m", **DISTILL)  # the preset follows the teacher
    straight = Trainer(fast_config(tmp_path / "a", **kw), progress=False)
    assert straight.model_config.shortcut and straight.model_config.dim == 64 and len(straight.teacher.paths) == 24
    teacher_model, _ = load_model(teacher)
    x, t, y = torch.randn(2, 3, 32, 32), torch.rand(2), torch.tensor([0, 1])
    assert torch.allclose(straight.run.model(x, t, y, torch.ones(2)), teacher_model(x, t, y), atol=1e-5)
    straight.fit()
    Trainer(fast_config(tmp_path / "b", **{**kw, "steps": 2}), progress=False).fit()
    capsys.readouterr()
    resumed = Trainer(fast_config(tmp_path / "b", **kw), progress=False)
    assert "sampling" not in capsys.readouterr().err  # the cached paths are read back, not sampled again
    resumed.fit()
    for k, v in straight.run.model.state_dict().items():
        assert torch.equal(v, resumed.run.model.state_dict()[k]), k
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
    err = capsys.readouterr().err
    assert code == 0 and "1 model evaluations per image" in err and "warning" not in err  # trained settings
    main(
        [
            "sample",
            "--checkpoint",
            str(tmp_path / "a" / "checkpoint.pt"),
            "--sampler",
            "heun",
            "--n",
            "2",
            "--precision",
            "fp32",
            "--out",
            str(tmp_path / "heun.png"),
        ]
    )
    assert "warning: this checkpoint is a distilled student" in capsys.readouterr().err
    with pytest.raises(TinyDiTError, match="teacher_cfg: 3.0 -> 2.0"):
        Trainer(fast_config(tmp_path / "a", **{**kw, "teacher_cfg": 2.0, "steps": 5}), progress=False)


def test_the_distillation_loss_falls_in_a_short_run(tmp_path, teacher):
    trainer = Trainer(
        fast_config(tmp_path, steps=40, teacher=str(teacher), **{**DISTILL, "distill_paths": 64}), progress=False
    )
    # The barely trained teacher's paths are nearly straight, so the student starts close to them: knock
    # it off first, so that there is something to learn.
    torch.manual_seed(1)
    with torch.no_grad():
        for p in trainer.run.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    trainer.run.ema.load_state_dict(trainer.run.model.state_dict())
    first = trainer.validation_losses(trainer.run.ema)[0]
    result = trainer.fit()
    assert math.isfinite(result.val_loss) and result.val_loss < 0.8 * first
