"""Classifier-free guidance (Ho & Salimans 2022), optionally limited to an interval of t (Kynkäänniemi
et al. 2024), and the guided velocity field the samplers integrate.

    guided_velocity(model, x, t, y, s)   v = v_uncond + s (v_cond - v_uncond), both halves in one batch of 2N
    Velocity(model, y, s, interval)      the field dx/dt = v(x, t) of one batch, counting model evaluations
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["null_condition", "guided_velocity", "Velocity"]


def null_condition(model: nn.Module, y: torch.Tensor) -> torch.Tensor:
    """The unconditional input for y, shaped like it, as the model defines it (``DiT.null_condition``: the
    null label, or the empty caption of a text model). Guidance, the trainer's label dropout and the
    distillation teacher all take it from here."""
    return model.null_condition(y)


def guided_velocity(
    model: nn.Module,
    x: torch.Tensor,
    t: torch.Tensor,
    y: torch.Tensor,
    cfg_scale: float,
    d: torch.Tensor | None = None,
    *,
    null: torch.Tensor | None = None,
) -> tuple[torch.Tensor, int]:
    """Classifier-free guidance (Ho & Salimans 2022): v = v_uncond + s (v_cond - v_uncond).

    x: (N, C, H, W), t: (N,), y: (N,) labels or (N, L) caption ids. The unconditional input is ``null``
    (shaped like y) if given, else ``null_condition(model, y)`` (the empty caption for text models).
    Returns (v, model evaluations per image). At s = 1 this is the
    conditional prediction alone, computed with one evaluation; otherwise the conditional and the
    unconditional inputs go through the model as one batch of 2N. ``d`` (N,): the step size, passed
    only to shortcut models (``tinydit.flow.shortcut``).
    """
    extra = () if d is None else (d,)
    if cfg_scale == 1.0:
        return model(x, t, y, *extra), 1
    if null is None:
        null = null_condition(model, y)
    extra = () if d is None else (torch.cat([d, d]),)
    v = model(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, null]), *extra)  # one pass (2N, C, H, W)
    v_cond, v_uncond = v.chunk(2)  # (N, C, H, W) each
    return v_uncond + cfg_scale * (v_cond - v_uncond), 2


class Velocity:
    """The model as the field dx/dt = v(x, t) of one batch, guided inside the interval, counting evaluations.

    Guidance in a limited interval (Kynkäänniemi et al. 2024): guided for LO <= t <= HI, conditional
    only (one evaluation) elsewhere. At s = 1 guidance is off everywhere.
    """

    def __init__(
        self, model: nn.Module, y: torch.Tensor, cfg_scale: float = 1.0, cfg_interval: tuple[float, float] | None = None
    ):
        self.model, self.y, self.cfg_scale = model, y, cfg_scale
        self.null = null_condition(model, y) if cfg_scale != 1.0 else None  # the same at every step
        self.lo, self.hi = (0.0, 1.0) if cfg_interval is None else (float(cfg_interval[0]), float(cfg_interval[1]))
        self.nfe = 0  # model evaluations per image so far

    def guided_at(self, t: float) -> bool:
        return self.cfg_scale != 1.0 and self.lo <= t <= self.hi

    def __call__(self, x: torch.Tensor, t: float, guided: bool | None = None, d: float | None = None) -> torch.Tensor:
        """x: (N, C, H, W) at time t -> v: (N, C, H, W). ``guided`` overrides the interval test; ``d``
        is the step the caller will take, which a shortcut model is told (others ignore it)."""
        guided = self.guided_at(t) if guided is None else guided
        tt = torch.full((x.shape[0],), t, dtype=x.dtype, device=x.device)  # (N,): one time for the batch
        scale = self.cfg_scale if guided else 1.0
        dd = None
        if getattr(self.model.config, "shortcut", False):
            dd = torch.full_like(tt, 0.0 if d is None else d)  # (N,); 0 = the instantaneous velocity
        v, evals = guided_velocity(self.model, x, tt, self.y, scale, d=dd, null=self.null)
        self.nfe += evals
        return v
