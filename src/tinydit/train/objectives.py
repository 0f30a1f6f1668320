"""What a training step minimises, one function per objective (``few_step``): plain flow matching, the
shortcut model's self-consistency, the mean-flow identity. Each takes the run's forward and this rank's
share of the step's draws (``StepBatch``) and returns a ``StepLoss``. The trainer picks one by
``few_step``; a caller may hand it another (``Trainer(cfg, objective=f)``), which is how an experiment
tries a loss without touching the loop. Distillation trains on its teacher's paths instead
(``tinydit.train.teacher``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tinydit.compiling import unwrap
from tinydit.flow.meanflow import FoldedGuidance, meanflow_loss
from tinydit.flow.path import flow_loss
from tinydit.flow.shortcut import n_self_consistency, shortcut_loss

__all__ = ["StepBatch", "StepLoss", "Objective", "OBJECTIVES", "flow_matching", "shortcut", "mean_flow"]


@dataclass
class StepBatch:
    """This rank's share of one step's draws (n images), guidance dropout applied to ``y`` already."""

    x: torch.Tensor  # (n, C, H, W) clean images
    y: torch.Tensor  # (n,) labels or (n, L) caption ids
    t: torch.Tensor  # (n,) times, 0 = data, 1 = noise
    r: torch.Tensor  # (n,) the start of the interval [r, t]: t itself outside mean flows
    noise: torch.Tensor  # (n, C, H, W)
    drop: torch.Tensor  # (n,) bool: the condition dropped for guidance
    null: torch.Tensor  # the null condition, shaped like y
    generator: torch.Generator  # for the draws inside a loss (seeded per step, and per rank under several)
    guidance: float | None = None  # the guidance a mean-flow run folds into its target (``meanflow_cfg``)


@dataclass
class StepLoss:
    minimised: torch.Tensor  # () what the update minimises, before the alignment's term
    reported: torch.Tensor  # () what is logged: plain flow matching's loss where the objective has one
    per_sample: torch.Tensor  # (n,) each image's loss
    at_t: slice | torch.Tensor  # the images trained by plain flow matching at their time t, binned by t in the log


Objective = Callable[[Callable, torch.nn.Module, StepBatch], StepLoss]  # (forward, model, batch) -> StepLoss


def flow_matching(forward: Callable, model: torch.nn.Module, b: StepBatch) -> StepLoss:
    """Rectified flow's loss, ||v(x_t, t) - (noise - x)||^2 (``tinydit.flow.path.flow_loss``)."""
    per_sample = flow_loss(forward, b.x, b.y, b.t, b.noise, reduce=False)  # (n,)
    loss = per_sample.mean()
    return StepLoss(loss, loss, per_sample, slice(None))


def shortcut(forward: Callable, model: torch.nn.Module, b: StepBatch) -> StepLoss:
    """The shortcut model's loss (``tinydit.flow.shortcut``): flow matching at d = 0 on the first images, the
    self-consistency of two half steps on the rest."""
    per_sample = shortcut_loss(forward, b.x, b.y, b.t, b.noise, generator=b.generator, reduce=False)  # (n,)
    at_t = slice(len(b.x) - n_self_consistency(len(b.x)))  # the rest are self-consistency examples
    loss = per_sample.mean()
    return StepLoss(loss, loss, per_sample, at_t)


def mean_flow(forward: Callable, model: torch.nn.Module, b: StepBatch) -> StepLoss:
    """The mean-flow identity's loss (``tinydit.flow.meanflow``), guidance folded into its target; what is
    reported is the squared error at r = t (against the guided target), or of all images in a share with
    none at r = t."""
    guidance = FoldedGuidance(b.guidance, ~b.drop, b.null)
    weighted, per_sample = meanflow_loss(forward, unwrap(model), b.x, b.y, b.r, b.t, b.noise, guidance)
    at_t = b.r == b.t  # (n,) bool; its target's JVP has synchronised the device already
    reported = (per_sample[at_t] if at_t.any() else per_sample).mean()
    return StepLoss(weighted.mean(), reported, per_sample, at_t)


OBJECTIVES: dict[str, Objective] = {"none": flow_matching, "shortcut": shortcut, "meanflow": mean_flow}
