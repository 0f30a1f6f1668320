"""Shortcut models (Frans, Hafner, Levine & Abbeel 2024, "One Step Diffusion via Shortcut Models"):
one network that samples in 1, 2, 4, ... steps, trained from scratch with no teacher.

The model also sees the step size d its sampler will take, and predicts the average velocity s over
that step, so that x_{t-d} = x_t - d s(x_t, t, d) (t = 1 is noise, see ``tinydit.flow.path``). Training mixes

- flow matching at the finest level's step d = 2^-``levels`` (the instantaneous velocity, ``noise - x0``,
  as the official code gives its flow-matching targets the smallest step's index), for 1 - ``sc_fraction``
  of each batch, and
- self-consistency for the rest: one step of 2d must land where two steps of d land,

      s(x_t, t, 2d)  <-  ( s(x_t, t, d) + s(x_t - d s(x_t, t, d), t - d, d) ) / 2      (paper, eq. 5)

  with the target computed without gradients, for d = 2^-k, k = 1..``levels``, and t in [2d, 1].

The finest self-consistency level queries s(., ., 2^-levels), which flow matching trains, so the chain of
levels rests on a trained input. A smaller step (more than 2^levels sampling steps, or d = 0 from the
samplers that do not pass a step) is given to the model as the finest one (``DiTConfig.finest_step``).

Cost per step: the two target evaluations run on ``sc_fraction`` of the batch without a backward
pass, and a forward pass is about a third of a training step's compute, so the default 1/4 adds about
2 x 1/4 x 1/3 = 17%. No Jacobian-vector products are needed, so it runs on any device with any
attention kernel.
"""

from __future__ import annotations

import torch
from torch import nn

from tinydit.flow.path import interpolate, velocity_target

__all__ = ["shortcut_loss", "n_self_consistency", "LEVELS", "FINEST_STEP", "SC_FRACTION"]

LEVELS = 7  # the smallest self-consistency step is 2^-7: 128 steps
# where flow matching is trained: sinusoidal features of time_scale * d tell d = 0 and d = 2^-7 apart, so
# the finest level is trained itself rather than assumed to agree with d = 0
FINEST_STEP = 2.0**-LEVELS
SC_FRACTION = 0.25  # share of each batch trained for self-consistency (the paper's k = 1/4)


def n_self_consistency(batch: int, sc_fraction: float = SC_FRACTION) -> int:
    """How many of a batch's images (the last ones) ``shortcut_loss`` trains for self-consistency."""
    return int(round(batch * sc_fraction))


def shortcut_loss(
    model: nn.Module,
    x0: torch.Tensor,
    y: torch.Tensor,
    t: torch.Tensor,
    noise: torch.Tensor,
    generator: torch.Generator | None = None,
    sc_fraction: float = SC_FRACTION,
    reduce: bool = True,
    finest_step: float = FINEST_STEP,
) -> torch.Tensor:
    """Flow matching at the finest step plus self-consistency targets, in one forward pass with gradients.

    x0, noise: (N, C, H, W); y, t: (N,). The last ``n_self_consistency(N)`` images become
    self-consistency examples with fresh d and t drawn from ``generator``; the others learn flow matching
    told the step ``finest_step`` (the model's ``DiTConfig.finest_step``: 0 for a model written before it
    was recorded, which continues as it began). Returns the mean loss, or per-image losses (N,) with
    reduce=False.
    """
    b = x0.shape[0]
    n_sc = n_self_consistency(b, sc_fraction)
    n_fm = b - n_sc
    dev = x0.device
    k = torch.randint(1, LEVELS + 1, (n_sc,), generator=generator).to(dev)  # (n_sc,)
    d = torch.pow(2.0, -k.float())  # (n_sc,) in {1/2, ..., 1/128}: the target's step; the model's is 2d
    u = torch.rand(n_sc, generator=generator).to(dev)
    t_sc = 2 * d + u * (1 - 2 * d)  # (n_sc,) in [2d, 1]: two steps of d stay within [0, 1]

    x_fm = interpolate(x0[:n_fm], noise[:n_fm], t[:n_fm])  # (n_fm, C, H, W)
    x_sc = interpolate(x0[n_fm:], noise[n_fm:], t_sc)  # (n_sc, C, H, W)
    y_sc = y[n_fm:]
    with torch.no_grad():
        s1 = model(x_sc, t_sc, y_sc, d)  # (n_sc, C, H, W)
        x_mid = x_sc - d.view(-1, 1, 1, 1) * s1  # one step of d towards the data
        s2 = model(x_mid, t_sc - d, y_sc, d)
        target_sc = (s1 + s2).float() / 2

    x_in = torch.cat([x_fm, x_sc])  # (N, C, H, W): both kinds in one forward pass
    t_in = torch.cat([t[:n_fm], t_sc])
    d_in = torch.cat([torch.full((n_fm,), finest_step, device=dev), 2 * d])
    target = torch.cat([velocity_target(x0[:n_fm], noise[:n_fm]), target_sc])
    err = (model(x_in, t_in, y, d_in).float() - target).pow(2)  # (N, C, H, W)
    per_image = err.flatten(1).mean(1)  # (N,)
    return per_image.mean() if reduce else per_image
