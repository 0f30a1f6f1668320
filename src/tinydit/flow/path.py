"""Flow matching on the straight line between data and noise (rectified flow; Lipman et al. 2023,
Liu et al. 2023), in the time convention of SD3 and minRF.

Time convention, used everywhere in TinyDiT:

    t = 0 is data, t = 1 is pure Gaussian noise.
    x_t = (1 - t) * x0 + t * noise                       (the path, ``interpolate``)
    v   = d x_t / d t = noise - x0                       (the target velocity, ``velocity_target``)

Training regresses the model's v(x_t, t, y) onto ``noise - x0`` with a mean squared error. Sampling
starts from noise at t = 1 and integrates dx/dt = v backwards to t = 0 (``tinydit.flow.samplers``).
"""

from __future__ import annotations

import torch
from torch import nn

from tinydit.errors import TinyDiTError

__all__ = ["interpolate", "velocity_target", "sample_t", "flow_loss", "t_bins", "T_SAMPLINGS", "N_T_BINS"]

T_SAMPLINGS = ("uniform", "logit-normal")  # how training times are drawn (`sample_t`)
N_T_BINS = 10  # losses are also reported in this many equal bins of t: where along the path the model errs


def interpolate(x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """x_t = (1 - t) x0 + t noise.  x0, noise: (N, C, H, W); t: (N,) -> (N, C, H, W)"""
    t = t.view(-1, *([1] * (x0.dim() - 1)))  # (N, 1, 1, 1)
    return (1 - t) * x0 + t * noise


def velocity_target(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The constant velocity of the straight path: d x_t / d t = noise - x0."""
    return noise - x0


def sample_t(
    n: int,
    generator: torch.Generator | None = None,
    device: str | torch.device = "cpu",
    kind: str = "uniform",
    loc: float = 0.0,
    scale: float = 1.0,
    shift: float = 1.0,
) -> torch.Tensor:
    """Training times (n,) in [0, 1].

    ``uniform``: t ~ U[0, 1). ``logit-normal`` (SD3, Esser et al. 2024, eq. 19): t = sigmoid(u) with
    u ~ N(loc, scale^2), which spends more of training on the middle of the path. ``shift`` > 1 then
    moves times towards noise, t' = shift t / (1 + (shift - 1) t) (SD3 eq. 23), where the global
    layout of an image is decided.
    """
    if kind == "uniform":
        t = torch.rand(n, generator=generator)
    elif kind == "logit-normal":
        t = torch.sigmoid(loc + scale * torch.randn(n, generator=generator))
    else:
        raise TinyDiTError(f"unknown time sampling {kind!r}: use one of {', '.join(T_SAMPLINGS)}")
    if shift != 1.0:
        t = shift * t / (1 + (shift - 1) * t)
    return t.to(device)


def flow_loss(
    model: nn.Module,
    x0: torch.Tensor,
    y: torch.Tensor | None,
    t: torch.Tensor,
    noise: torch.Tensor,
    reduce: bool = True,
) -> torch.Tensor:
    """Conditional flow-matching loss || v(x_t, t, y) - (noise - x0) ||^2.

    x0, noise: (N, C, H, W); y, t: (N,). Returns the mean, or per-sample losses (N,) with reduce=False.
    """
    x_t = interpolate(x0, noise, t)
    err = (model(x_t, t, y) - velocity_target(x0, noise)).pow(2)  # (N, C, H, W)
    per_sample = err.flatten(1).mean(1)  # (N,)
    return per_sample.mean() if reduce else per_sample


def t_bins(t: torch.Tensor, n_bins: int = N_T_BINS) -> torch.Tensor:
    """Index (N,) of the equal-width bin of [0, 1] each time falls in, for losses reported per bin of t."""
    return (t * n_bins).long().clamp_(0, n_bins - 1)
