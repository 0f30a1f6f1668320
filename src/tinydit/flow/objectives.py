"""What a training step minimises: one object per objective (``TrainConfig.objective``), which carries all
that a run of it needs beyond the training loop:

- its loss, ``objective(forward, model, batch) -> StepLoss``;
- the model's extra inputs (``model_fields``: the step size of shortcut models, a mean-flow model's time scale);
- its own random draws (``draw_times``: a mean-flow run's interval [r, t]), and where its batches come from
  (``teacher``: a trained model's paths instead of images);
- the sampler settings a new checkpoint records (``sampling``);
- whether it takes REPA's alignment (``aligned``);
- its checks, of the run's config (``check``) and of the built model (``check_model``).

The trainer asks the object and never tests its name. A caller may hand the trainer another loss
(``Trainer(cfg, objective=f)``), which is how an experiment tries one without touching the loop: a plain
function (forward, model, batch) -> StepLoss takes the place of the run's objective's loss and keeps the
rest (``with_loss``); an ``Objective`` is used whole, and must be the one the config names.

    flow       rectified flow's loss (``tinydit.flow.path``)
    shortcut   flow matching and the shortcut models' self-consistency (``tinydit.flow.shortcut``)
    meanflow   the mean-flow identity, guidance folded into its target (``tinydit.flow.meanflow``)
    distill    a few-step student on a trained model's paths (``tinydit.flow.distill``)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tinydit.compiling import unwrap
from tinydit.errors import TinyDiTError
from tinydit.flow.distill import KNOTS, distill_loss
from tinydit.flow.meanflow import MEANFLOW_CFG, TIME_SCALE, FoldedGuidance, check_jvp, draw_interval, meanflow_loss
from tinydit.flow.path import flow_loss
from tinydit.flow.shortcut import FINEST_STEP, n_self_consistency, shortcut_loss
from tinydit.flow.solvers import FIXED_STEP_SAMPLERS

__all__ = [
    "StepBatch",
    "PathBatch",
    "StepLoss",
    "Loss",
    "Objective",
    "FlowMatching",
    "Shortcut",
    "MeanFlow",
    "Distill",
    "OBJECTIVES",
    "DEFAULT_OBJECTIVE",
    "flow_matching",
    "shortcut",
    "mean_flow",
    "distillation",
    "objective_named",
    "with_loss",
    "check_objective",
]


@dataclass
class StepBatch:
    """This rank's share of one step's draws (n images), guidance dropout applied to ``y`` already."""

    x: torch.Tensor  # (n, C, H, W) clean images
    y: torch.Tensor  # (n,) labels or (n, L) caption ids
    t: torch.Tensor  # (n,) times, 0 = data, 1 = noise
    r: torch.Tensor  # (n,) the start of the interval [r, t]: t itself where the objective draws none
    noise: torch.Tensor  # (n, C, H, W)
    drop: torch.Tensor  # (n,) bool: the condition dropped for guidance
    null: torch.Tensor  # the null condition, shaped like y
    generator: torch.Generator  # for the draws inside a loss (seeded per step, and per rank under several)
    guidance: float | None = None  # the guidance a mean-flow run folds into its target (``meanflow_cfg``)


@dataclass
class PathBatch:
    """This rank's share of a student's teacher paths (``Objective.teacher``); no guidance dropout: the
    teacher's guidance is in its paths."""

    states: torch.Tensor  # (n, KNOTS + 1, C, H, W): states[:, k] is x at t = k / KNOTS
    y: torch.Tensor  # (n,) labels
    generator: torch.Generator  # for the draws inside the loss


@dataclass
class StepLoss:
    minimised: torch.Tensor  # () what the update minimises, before the alignment's term
    reported: torch.Tensor  # () what is logged: plain flow matching's loss where the objective has one
    per_sample: torch.Tensor  # (n,) each image's loss
    # the images trained by plain flow matching at their time t, binned by t in the log; None: none are
    at_t: slice | torch.Tensor | None


Loss = Callable[[Callable, torch.nn.Module, StepBatch], StepLoss]  # (forward, model, batch) -> StepLoss


class Objective:
    """An objective: plain flow matching unless a subclass says otherwise. Stateless: one instance serves
    every run."""

    name = "flow"  # its name in `objective`
    aligned = True  # takes REPA's alignment (``tinydit.train.repa``)
    teacher = False  # learns from a trained model's paths (``PathBatch``) instead of images (``StepBatch``)
    # The sampler settings a new checkpoint of it records (``tinydit.flow.settings.SamplingSettings.from_json``);
    # None: the measured record for its data set and preset
    sampling: dict | None = None
    own_fields: tuple[str, ...] = ()  # the `TrainConfig` fields (None by default) that only this objective reads

    def __call__(self, forward: Callable, model: torch.nn.Module, batch) -> StepLoss:
        """The loss of this rank's share of a step: ``forward`` is the run's trained callable (compiled, DDP),
        ``model`` the module under it."""
        per_sample = flow_loss(forward, batch.x, batch.y, batch.t, batch.noise, reduce=False)  # (n,)
        loss = per_sample.mean()
        return StepLoss(loss, loss, per_sample, slice(None))

    def model_fields(self) -> dict:
        """The model config's fields it sets (``tinydit.models.dit_config.DiTConfig``)."""
        return {}

    def draw_times(
        self, t: torch.Tensor, draw_t: Callable[[], torch.Tensor], generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(r, t) (N,) each for the global batch, from its times t (N,); ``draw_t()`` draws N more times as the
        run does, ``generator`` anything else (both the step's, so that ranks agree). Default: r = t."""
        return t, t

    def check(self, cfg) -> None:
        """Refuse a run's config (resolved) that this objective cannot train, naming the parameter."""

    def resolved(self, cfg) -> dict:
        """The fields of its own it fills where ``cfg`` leaves them None."""
        return {}

    def check_model(self, model: torch.nn.Module, device: torch.device, precision_context) -> None:
        """Refuse a built model (the plain module) this objective cannot train, before training."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class FlowMatching(Objective):
    """Rectified flow's loss, ||v(x_t, t) - (noise - x)||^2 (``tinydit.flow.path.flow_loss``)."""


class Shortcut(Objective):
    """The shortcut model's loss (``tinydit.flow.shortcut``): flow matching at the finest step on the first
    images, the self-consistency of two half steps on the rest."""

    name, aligned = "shortcut", False

    def __call__(self, forward, model, batch) -> StepLoss:
        b = batch
        finest = unwrap(model).config.finest_step  # where this model learns flow matching
        per_sample = shortcut_loss(
            forward, b.x, b.y, b.t, b.noise, generator=b.generator, reduce=False, finest_step=finest
        )  # (n,)
        at_t = slice(len(b.x) - n_self_consistency(len(b.x)))  # the rest are self-consistency examples
        loss = per_sample.mean()
        return StepLoss(loss, loss, per_sample, at_t)

    def model_fields(self) -> dict:
        return {"shortcut": True, "finest_step": FINEST_STEP}


class MeanFlow(Objective):
    """The mean-flow identity's loss (``tinydit.flow.meanflow``), guidance folded into its target; what is
    reported is the squared error at r = t (against the guided target), or of all images in a share with
    none at r = t."""

    name = "meanflow"
    sampling = {  # the average velocity over [0, 1]: one step, guidance folded into training
        "sampler": "euler",
        "steps": 1,
        "cfg_scale": 1.0,
        "source": "a mean-flow model samples in one Euler step of its average velocity, guided in training",
    }
    own_fields = ("meanflow_cfg",)

    def __call__(self, forward, model, batch) -> StepLoss:
        b = batch
        guidance = FoldedGuidance(b.guidance, ~b.drop, b.null)
        weighted, per_sample = meanflow_loss(forward, unwrap(model), b.x, b.y, b.r, b.t, b.noise, guidance)
        at_t = b.r == b.t  # (n,) bool; its target's JVP has synchronised the device already
        reported = (per_sample[at_t] if at_t.any() else per_sample).mean()
        return StepLoss(weighted.mean(), reported, per_sample, at_t)

    def model_fields(self) -> dict:
        return {"shortcut": True, "time_scale": TIME_SCALE}

    def draw_times(self, t, draw_t, generator):
        return draw_interval(t, draw_t(), generator)

    def resolved(self, cfg) -> dict:
        return {"meanflow_cfg": MEANFLOW_CFG if cfg.meanflow_cfg is None else cfg.meanflow_cfg}

    def check_model(self, model, device, precision_context) -> None:
        check_jvp(model, device, precision_context)  # a model that cannot carry a tangent, before training


class Distill(Objective):
    """A few-step student on its teacher's paths (``tinydit.flow.distill``): one jump per path, of a drawn
    step count. The paths are sampled and kept by the trainer (``tinydit.train.teacher``)."""

    name, aligned, teacher = "distill", False, True
    sampling = {  # guidance is in the teacher's paths, and the student learned Euler jumps
        "sampler": "euler",
        "steps": 4,
        "cfg_scale": 1.0,
        "source": "a distilled student takes 1, 2, 4 or 8 Euler steps at guidance 1",
    }
    own_fields = ("teacher",)

    def __call__(self, forward, model, batch: PathBatch) -> StepLoss:
        per_sample = distill_loss(forward, batch.states, batch.y, generator=batch.generator, reduce=False)  # (n,)
        loss = per_sample.mean()
        return StepLoss(loss, loss, per_sample, None)

    def model_fields(self) -> dict:
        return {"shortcut": True}  # the teacher's architecture, plus the step size

    def check(self, cfg) -> None:
        if cfg.teacher is None:
            raise TinyDiTError("`objective` distill learns from a trained model: pass its checkpoint.pt with `teacher`")
        if cfg.arch_overrides():
            raise TinyDiTError(
                f"the student copies the teacher's architecture; drop "
                f"{', '.join('`' + k + '`' for k in cfg.arch_overrides())}"
            )
        if cfg.cond != "class":
            raise TinyDiTError("`objective` distill works with class-conditional models for now; drop `cond` text")
        if cfg.teacher_sampler not in FIXED_STEP_SAMPLERS:
            raise TinyDiTError(
                f"`teacher_sampler` must be {', '.join(FIXED_STEP_SAMPLERS)}, got {cfg.teacher_sampler!r}"
            )
        if cfg.teacher_steps < 1 or cfg.teacher_steps % KNOTS:
            raise TinyDiTError(
                f"`teacher_steps` must be a positive multiple of {KNOTS} (the teacher's path is "
                f"kept at t = k/{KNOTS}), got {cfg.teacher_steps}"
            )


flow_matching, shortcut, mean_flow, distillation = FlowMatching(), Shortcut(), MeanFlow(), Distill()
OBJECTIVES: dict[str, Objective] = {o.name: o for o in (flow_matching, shortcut, mean_flow, distillation)}
DEFAULT_OBJECTIVE = flow_matching.name


def objective_named(name: str) -> Objective:
    """The objective called ``name``; a ``TinyDiTError`` listing the names for another."""
    if name not in OBJECTIVES:
        raise TinyDiTError(f"unknown `objective` {name!r}: use one of {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]


def check_objective(cfg) -> Objective:
    """The objective a run's config names, checked against it: a field that only another objective reads is
    refused, then the objective's own checks run. ``cfg``: a resolved ``TrainConfig``."""
    objective = objective_named(cfg.objective)
    for other in OBJECTIVES.values():
        for name in other.own_fields:
            if other is not objective and getattr(cfg, name) is not None:
                raise TinyDiTError(
                    f"`{name}` is only used with `objective` {other.name}; add it or drop `{name}` "
                    f"(`objective` is {cfg.objective})"
                )
    objective.check(cfg)
    return objective


class _WithLoss(Objective):
    """An objective with another loss: everything else is its base's."""

    def __init__(self, base: Objective, loss: Loss):
        self.base, self.loss = base, loss
        self.name, self.aligned, self.teacher = base.name, base.aligned, base.teacher
        self.sampling, self.own_fields = base.sampling, base.own_fields

    def __call__(self, forward, model, batch) -> StepLoss:
        return self.loss(forward, model, batch)

    def model_fields(self) -> dict:
        return self.base.model_fields()

    def draw_times(self, t, draw_t, generator):
        return self.base.draw_times(t, draw_t, generator)

    def check(self, cfg) -> None:
        self.base.check(cfg)

    def resolved(self, cfg) -> dict:
        return self.base.resolved(cfg)

    def check_model(self, model, device, precision_context) -> None:
        self.base.check_model(model, device, precision_context)

    def __repr__(self) -> str:
        return f"{self.base!r} with the loss {getattr(self.loss, '__name__', self.loss)!r}"


def with_loss(name: str, given: Objective | Loss | None = None) -> Objective:
    """The objective a run trains with: the one ``name`` names, or ``given``. An ``Objective`` given must be
    that one (its model and draws are the run's); a plain function replaces its loss and keeps the rest.
    A student's loss is on its teacher's paths: it takes no plain function."""
    objective = objective_named(name)
    if given is None:
        return objective
    if isinstance(given, Objective):
        if given.name != name:
            raise TinyDiTError(
                f"the objective given is {given.name}, but the run's `objective` is {name}: set `objective` "
                f"{given.name} (its model and draws differ)"
            )
        return given
    if objective.teacher:
        raise TinyDiTError(f"`objective` {name} trains on its teacher's paths: it takes no loss function")
    return _WithLoss(objective, given)
