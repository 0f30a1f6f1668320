"""Classifier-free guidance (Ho & Salimans 2022), optionally limited to an interval of t (Kynkäänniemi
et al. 2024), and the guided velocity field the samplers integrate.

    guided_velocity(model, x, t, y, s)   v = v_uncond + s (v_cond - v_uncond), both halves in one batch of 2N
    Velocity(model, y, s, interval)      the field dx/dt = v(x, t) of one batch, counting model evaluations
    unclipped_scale(model, t)            what turns an x-prediction's clipped velocity into the path's own
"""

from __future__ import annotations

import torch
from torch import nn

from tinydit.models.dit import X_PRED_T_MIN

__all__ = ["null_condition", "guided_velocity", "Velocity", "unclipped_scale", "singular_below"]


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


def unclipped_scale(model: nn.Module, t: float) -> float:
    """The factor that turns the velocity an x-prediction model returns at time t into the straight path's
    own, v = (x_t - x0) / t, for the model's predicted clean image x0; 1 for a velocity model.

    An x-prediction model returns (x_t - x0) / max(t, X_PRED_T_MIN) (``tinydit.models.dit``): the clip keeps
    its training loss finite near the data, where training rarely draws t. Integrated as it is, a step
    that ends at t' < t < X_PRED_T_MIN goes only (t - t') / X_PRED_T_MIN of the way to x0, so a last step to
    t = 0 returns a mix of x_t (and its noise) and x0. With the factor max(t, X_PRED_T_MIN) / t the Euler
    step to t = 0 is x0 itself, and every step near the data interpolates between x_t and x0 as the path
    does (DDIM's step). The field is stiff there (its x-derivative grows as 1/t), so dopri5 crosses the
    times below ``singular_below(model)`` in that one step rather than adapting its steps to them.
    """
    t_min = singular_below(model)
    return t_min / t if 0.0 < t < t_min else 1.0


def singular_below(model: nn.Module) -> float:
    """The time below which the samplers' field of ``model`` is an x-prediction's (x_t - x0) / t, singular at
    t = 0 (``unclipped_scale``); 0 for a velocity model."""
    return X_PRED_T_MIN if getattr(model.config, "pred", "v") == "x" else 0.0


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
        self.singular_below = singular_below(model)  # x-prediction: (x - x0) / t below this t (``unclipped_scale``)

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
        factor = unclipped_scale(self.model, t)  # guidance is linear in v: the same for both halves
        return v if factor == 1.0 else v * factor
