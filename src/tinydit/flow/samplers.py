"""Sampling as a ``SamplingSettings`` says: the one entry point from checked settings to images.

    sample(settings, model, noise, y, generator=None, on_step=None) -> SampleResult(x, nfe)
    sample_path(settings, model, noise, y, knots)                   -> (states, nfe)   for distillation

``settings`` (``tinydit.flow.settings.SamplingSettings``) were checked once, when they were built, and
are not checked again here: ``sample`` builds the time grid and the guided field, runs the sampler the
settings name and reports ``nfe``, the exact number of model evaluations per image. With guidance on, one
velocity evaluates the model on the conditional and the unconditional input (batched into one forward
pass), so it counts as two; outside the guidance interval it counts as one. All images of a batch share one
time t, so guidance is switched on or off for the whole batch.

The samplers themselves, their one signature and their per-step callback ``on_step(i, t, x, x0)`` are in
``tinydit.flow.solvers``; their names are exported here too, where callers have always found them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tinydit.errors import TinyDiTError
from tinydit.flow.grids import checked_time_grid
from tinydit.flow.guidance import Velocity
from tinydit.flow.settings import SamplingSettings
from tinydit.flow.solvers import (
    DEFAULT_ETA,
    DEFAULT_TOL,
    FIXED_STEP_SAMPLERS,
    SAMPLER_NAMES,
    SAMPLERS,
    OnStep,
    ancestral,
    dopri5,
    euler,
    heun,
    heun_first,
    midpoint,
)

__all__ = [
    "SampleResult",
    "sample",
    "sample_path",
    "SAMPLERS",
    "SAMPLER_NAMES",
    "FIXED_STEP_SAMPLERS",
    "OnStep",
    "euler",
    "heun",
    "midpoint",
    "heun_first",
    "ancestral",
    "dopri5",
    "DEFAULT_TOL",
    "DEFAULT_ETA",
]


@dataclass
class SampleResult:
    x: torch.Tensor  # (N, C, H, W) samples in about [-1, 1]
    nfe: int | float  # model evaluations per image (``generate`` averages over batches, see there)


def sample(
    settings: SamplingSettings,
    model: nn.Module,
    noise: torch.Tensor,
    y: torch.Tensor,
    *,
    generator: torch.Generator | None = None,
    on_step: OnStep | None = None,
) -> SampleResult:
    """Run ``settings``' sampler from ``noise`` (N, C, H, W) at t = 1 for conditions ``y`` (labels (N,) or
    caption ids (N, L)) on its time grid, guided by its scale in its interval. ``generator`` (CPU) draws the
    ancestral sampler's fresh noise; ``on_step(i, t, x, x0)`` sees every step (``tinydit.flow.solvers``)."""
    velocity = Velocity(model, y, settings.cfg_scale, settings.cfg_interval)
    grid = checked_time_grid(settings.steps, settings.grid, settings.shift)
    own = {  # the sampler's own options; None: its default
        "ancestral": {"eta": settings.eta, "generator": generator},
        "dopri5": {"rtol": settings.rtol, "atol": settings.atol},
    }.get(settings.sampler, {})
    x = SAMPLERS[settings.sampler](velocity, noise, grid, on_step=on_step, **own)
    return SampleResult(x, velocity.nfe)


@torch.no_grad()
def sample_path(
    settings: SamplingSettings, model: nn.Module, noise: torch.Tensor, y: torch.Tensor, knots: int
) -> tuple[torch.Tensor, int]:
    """A fixed-step sampler's path recorded at ``knots`` + 1 evenly spaced times (for distillation).

    Runs ``settings``' sampler (euler, heun or midpoint, on the uniform grid of its steps, a multiple of
    ``knots``) one knot's piece of the grid at a time, which is exactly ``sample(settings, ...)``, and keeps
    x at t = k / knots. Returns (states (knots + 1, N, C, H, W), where states[k] is x at t = k / knots, so
    states[knots] is the noise and states[0] the sample; model evaluations per image).
    """
    if settings.sampler not in FIXED_STEP_SAMPLERS or settings.grid != "uniform":
        raise TinyDiTError(
            f"a recorded path needs a fixed-step sampler ({', '.join(FIXED_STEP_SAMPLERS)}) on the uniform grid, "
            f"got {settings.sampler!r} on the {settings.grid} grid"
        )
    if knots < 1 or settings.steps % knots:
        raise TinyDiTError(f"a path kept at {knots} knots needs `steps` a multiple of it, got {settings.steps}")
    per_knot = settings.steps // knots
    velocity = Velocity(model, y, settings.cfg_scale, settings.cfg_interval)
    ts = checked_time_grid(settings.steps, "uniform", None)
    x, states = noise, [noise]
    for k in range(knots):
        x = SAMPLERS[settings.sampler](velocity, x, ts[k * per_knot : (k + 1) * per_knot + 1])
        states.append(x)
    return torch.stack(states[::-1]), velocity.nfe
