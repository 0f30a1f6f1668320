"""Trajectory distillation: a few-step student from a trained flow model, the teacher.

Shortcut models (``tinydit.flow.shortcut``) learn large steps with no teacher, by making one step of 2d
agree with two of d, level by level; the one-step level comes last in that chain, so a short run trains
it least. With a trained model at hand there is a shorter way: run its best sampler, guidance
included, and have a student jump straight along the paths it records.

1. **Teacher paths** (``tinydit.train.teacher``). For N noise images and class-balanced labels, the
   teacher's sampler (Heun by
   default, with guidance) runs from t = 1 to t = 0, and x is recorded at the ``KNOTS`` + 1 times
   t = k / KNOTS. The map from noise to image is then fixed, so the student's targets are exact: no
   averaging over the images a noise could have become, which is what blurs one-step flow models.
2. **The student** is the teacher's network plus the shortcut models' step-size input d, and starts
   from the teacher's EMA weights with the d embedding's last layer zeroed (so it starts as the teacher).
   For each image it learns one jump of a random size d = 1/n, n in ``STUDENT_STEPS``, from a knot
   t = j / KNOTS (a multiple of d) to the knot t - d:

       s(x_t, t, y, d)  ->  (x_t - x_{t-d}) / d           so that   x_{t-d} = x_t - d s

   which is what ``tinydit sample --steps n`` takes with Euler on the uniform grid. Guidance is in
   the paths, so the student samples at guidance 1: one evaluation per step.

This is knowledge distillation (Luhman & Luhman 2021) at several step sizes, on the fixed couplings
of reflow (Liu et al. 2023) with the shortcut models' step-size conditioning (Frans et al. 2024).
Its extra cost is the teacher's sampling (``teacher_nfe`` evaluations per path) plus the student's
training.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from tinydit.errors import TinyDiTError

__all__ = [
    "KNOTS",
    "STUDENT_STEPS",
    "STEP_PROBS",
    "distill_loss",
    "distill_losses_by_steps",
    "init_student",
    "warn_if_untrained_settings",
]

KNOTS = 8  # the teacher's path is kept at t = 0, 1/8, ..., 1
STUDENT_STEPS = (1, 2, 4, 8)  # the step counts the student learns; each divides KNOTS
STEP_PROBS = (0.39, 0.28, 0.19, 0.14)  # how often each step count is trained: about 1 / sqrt(steps)


def init_student(student: nn.Module, teacher_weights: dict) -> None:
    """Load the teacher's weights into a student that also has the step-size embedding ``d_embed``,
    and zero that embedding's output layer so the student starts out computing what the teacher does."""
    hint = "distill from a checkpoint of the same architecture"
    try:
        missing, unexpected = student.load_state_dict(teacher_weights, strict=False)
    except RuntimeError as err:  # a shape mismatch
        raise TinyDiTError(f"the teacher's weights do not fit the student ({err}); {hint}") from err
    if unexpected or any(not k.startswith("d_embed.") for k in missing):
        raise TinyDiTError(
            f"the teacher's weights do not fit the student (missing {missing}, unexpected {unexpected}); {hint}"
        )
    last = student.d_embed.mlp[2]
    nn.init.zeros_(last.weight)
    nn.init.zeros_(last.bias)


def _jump(model: nn.Module, states: torch.Tensor, y: torch.Tensor, n_steps: torch.Tensor, j: torch.Tensor):
    """Per-image loss (N,) of one jump of size 1 / n_steps from knot j to knot j - KNOTS / n_steps.

    states: (N, KNOTS + 1, C, H, W); y, n_steps, j: (N,)."""
    rows = torch.arange(len(y), device=states.device)
    span = KNOTS // n_steps  # (N,) knots per jump
    x_t = states[rows, j].float()  # (N, C, H, W)
    x_end = states[rows, j - span].float()
    d = 1.0 / n_steps.float()  # (N,)
    target = (x_t - x_end) / d.view(-1, 1, 1, 1)  # the average velocity over the jump
    pred = model(x_t, j.float() / KNOTS, y, d)
    return (pred.float() - target).pow(2).flatten(1).mean(1)


def distill_loss(
    model: nn.Module,
    states: torch.Tensor,
    y: torch.Tensor,
    generator: torch.Generator | None = None,
    reduce: bool = True,
) -> torch.Tensor:
    """The student's loss on a batch of teacher paths: one jump per image, of a step count drawn from
    ``STUDENT_STEPS`` with probabilities ``STEP_PROBS`` and a start drawn uniformly from that count's knots.

    states: (N, KNOTS + 1, C, H, W) on the model's device; y: (N,). Returns the mean, or (N,) with reduce=False.
    """
    b, dev = len(y), states.device
    choice = torch.multinomial(torch.tensor(STEP_PROBS), b, replacement=True, generator=generator)  # (N,)
    n_steps = torch.tensor(STUDENT_STEPS)[choice]  # (N,)
    r = (torch.rand(b, generator=generator) * n_steps).long() + 1  # (N,) which jump, 1..n_steps
    j = r * (KNOTS // n_steps)  # (N,) the start knot
    per_image = _jump(model, states, y, n_steps.to(dev), j.to(dev))
    return per_image.mean() if reduce else per_image


@torch.no_grad()
def distill_losses_by_steps(
    model: nn.Module, states: torch.Tensor, y: torch.Tensor, batch_size: int = 256
) -> list[float]:
    """The student's loss for each step count of ``STUDENT_STEPS``, averaged over every jump of that
    count and every path: deterministic, for validation. states: (N, KNOTS + 1, C, H, W); y: (N,)."""
    out, n, dev = [], len(y), states.device
    for n_steps in STUDENT_STEPS:
        span, total = KNOTS // n_steps, 0.0
        for r in range(1, n_steps + 1):
            for i in range(0, n, batch_size):
                b = len(y[i : i + batch_size])
                steps_b, j = torch.full((b,), n_steps, device=dev), torch.full((b,), r * span, device=dev)
                total += _jump(model, states[i : i + batch_size], y[i : i + batch_size], steps_b, j).sum().item()
        out.append(total / (n_steps * n))
    return out


def warn_if_untrained_settings(distilled: bool, settings) -> None:
    """Warn when a distilled student (``distilled``) is sampled in a way it never learned: it takes 1, 2, 4
    or 8 Euler steps on the uniform grid at guidance 1 (the teacher's guidance is in its paths). ``settings``:
    the ``tinydit.flow.settings.SamplingSettings`` it is sampled with."""
    if not distilled:
        return
    s = settings
    if s.sampler != "euler" or s.steps not in STUDENT_STEPS or s.cfg_scale != 1.0 or s.grid != "uniform":
        warnings.warn(
            f"this checkpoint is a distilled student, trained for {', '.join(map(str, STUDENT_STEPS))} "
            f"euler steps on the uniform grid at guidance 1 (`cfg_scale` 1); {s.sampler} with {s.steps} steps, "
            f"{s.grid} grid and guidance {s.cfg_scale:g} were never trained",
            stacklevel=2,
        )
