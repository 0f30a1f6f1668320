"""Mean flows (Geng, Deng, Bai, Kolter & He 2025, "Mean Flows for One-step Generative Modeling"): one network
that samples in one evaluation, trained from scratch with no teacher.

The network learns the average velocity over an interval [r, t] of the flow (t = 1 is noise, see
``tinydit.flow.path``) instead of the instantaneous one:

    u(z_t, r, t) = 1 / (t - r) * integral_r^t v(z_s, s) ds,   so that   z_r = z_t - (t - r) u(z_t, r, t)

and one step from noise is z_0 = z_1 - u(z_1, 0, 1). Differentiating (t - r) u = integral_r^t v ds in t
gives the mean-flow identity, which needs no integral:

    u(z_t, r, t) = v(z_t, t) - (t - r) d/dt u(z_t, r, t),    d/dt u = v . grad_z u + du/dt   (r fixed)

Training regresses u_theta onto the right-hand side with u_theta in it, detached (the paper's stop-gradient,
eq. 10). The total derivative is a Jacobian-vector product of u_theta along (dz, dr, dt) = (v, 0, 1), taken
in forward mode (``torch.autograd.forward_ad``): one pass that carries the tangent beside the values.

How TinyDiT fits it in:

- The network is a shortcut-conditioned DiT or MMDiT (``config.shortcut``): it embeds t and the step
  d = t - r, as the paper's best variant does (t, t - r); d = 0 is the instantaneous velocity. The samplers
  already tell such a model the step they take (``tinydit.flow.samplers.euler``), so 1, 2 or 4 Euler steps
  sample a mean-flow model with no new code.
- The target needs no gradients, so its Jacobian-vector product runs without them, eagerly, on the rows
  with r < t only, through the kernels that carry a tangent (plain BLAS linear layers, attention written
  out as matmuls). The trained forward is the run's ordinary one: compiled, under DDP, as any other run.
- Where r = t the identity's second term vanishes and the loss is plain flow matching.
- Classifier-free guidance is folded into the target (paper, sec. 4.2): the velocity learned for a label
  is the guided one, v~ = w v + (1 - w) u_theta(z_t, t, t | null), so one evaluation samples guided.
  Rows whose label was dropped learn the unguided v.
- The adaptive loss weight (paper, eq. 22, p = 1) divides each image's squared error by its own detached
  size, which keeps the rare large errors of the JVP target from dominating a batch.

Shapes: z, x0, noise, v, u (N, C, H, W); t, r, d (N,); y (N,) labels or (N, L) token ids.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from dataclasses import dataclass

import torch
import torch.autograd.forward_ad as fwAD
from torch import nn

from tinydit.errors import TinyDiTError
from tinydit.flow.path import interpolate, velocity_target

__all__ = [
    "R_NEQ_T",
    "ADAPTIVE_C",
    "MEANFLOW_CFG",
    "TIME_SCALE",
    "TANGENTS",
    "FoldedGuidance",
    "draw_interval",
    "jvp_du_dt",
    "meanflow_target",
    "meanflow_loss",
    "check_jvp",
]

R_NEQ_T = 0.25  # the share of images trained on an interval r < t; the rest have r = t (paper, table 1a)
ADAPTIVE_C = 1e-3  # the adaptive weight 1 / (error + c) (paper, eq. 22 with p = 1), per pixel: see meanflow_loss
# The guidance a mean-flow run folds into its target when `meanflow_cfg` is not given (docs/few_step.md
# measures it): a one-step sampler cannot guide afterwards, so the guided field is what it learns.
MEANFLOW_CFG = 2.0
# The time embedding's scale for a mean-flow model (DiTConfig.time_scale; DiT's 1000 elsewhere). The target
# holds du/dt, and features of 1000 t turn so fast that the network's derivative in t, not the flow's, makes
# up nearly all of it (docs/few_step.md shows the measurement).
TIME_SCALE = 30.0
# What the target's derivative follows: the pair's velocity noise - x0 (the paper, and the trainer), or the
# model's own instantaneous velocity (improved mean flows, Geng et al. 2025b; docs/few_step.md measures it).
TANGENTS = ("conditional", "predicted")


def draw_interval(
    t: torch.Tensor, s: torch.Tensor, generator: torch.Generator | None = None, share: float = R_NEQ_T
) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, t) (N,) each from two times t and s (N,) drawn by the run's t sampling: ``share`` of the images
    (chosen with ``generator``, on the CPU, for the whole batch, so that ranks agree) take the interval
    (r, t) = (min, max) of their two times, as the paper samples; the rest keep r = t."""
    interval = (torch.rand(t.shape[0], generator=generator) < share).to(t.device)  # (N,) bool
    return torch.where(interval, torch.minimum(t, s), t), torch.where(interval, torch.maximum(t, s), t)


@contextlib.contextmanager
def _tangent_kernels():
    """The kernels that carry a forward-mode tangent: BLAS linear layers and attention as matmuls (PyTorch's
    fused CPU attention and TinyDiT's oneDNN linear op have no forward-mode formula), run eagerly."""
    from tinydit.compiling import eagerly
    from tinydit.models.attention import attention_backend
    from tinydit.models.linear import linear_backend

    _import_forward_mode_decompositions()
    with eagerly(), linear_backend("blas"), attention_backend("matmul"):
        yield


@functools.cache  # once per process, not at every step's tangent
def _import_forward_mode_decompositions() -> None:
    """Forward mode's first use imports PyTorch's decompositions for it, which PyTorch builds with torch.jit.script
    and so warns, in every mean-flow run, that torch.jit.script is deprecated: PyTorch's warning, not the user's."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated", category=FutureWarning)
        import torch._decomp.decompositions_for_jvp  # noqa: F401


def jvp_du_dt(
    model: nn.Module,
    z: torch.Tensor,
    r: torch.Tensor,
    t: torch.Tensor,
    y: torch.Tensor,
    v: torch.Tensor,
    along_t: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """u_theta(z, r, t | y) and its total derivative in t along the flow v: the Jacobian-vector product of
    u_theta along (dz, dr, dt) = (v, 0, 1), in forward mode. Returns (u, du/dt), (N, C, H, W) each.
    ``along_t`` False: the part along z alone, (v, 0, 0) (a diagnostic, scripts/meanflow_derivative.py)."""
    with _tangent_kernels(), fwAD.dual_level():
        z_dual = fwAD.make_dual(z, v)
        t_dual = fwAD.make_dual(t, torch.ones_like(t) if along_t else torch.zeros_like(t))
        # d = t - r carries dd/dt = 1 (r is fixed); the model embeds t and d.
        u, du_dt = fwAD.unpack_dual(model(z_dual, t_dual, y, t_dual - r))
    return u, du_dt


@dataclass(frozen=True)
class FoldedGuidance:
    """Guidance folded into the target: the rows where ``guided`` (N,) bool (their label was not dropped)
    learn v~ = scale v + (1 - scale) u_theta(z, t, t | null); ``null`` (shaped like y) is the
    unconditional input."""

    scale: float
    guided: torch.Tensor
    null: torch.Tensor


def meanflow_target(
    model: nn.Module,
    z: torch.Tensor,
    r: torch.Tensor,
    t: torch.Tensor,
    y: torch.Tensor,
    v: torch.Tensor,
    guidance: FoldedGuidance | None = None,
    tangent: str = "conditional",
) -> torch.Tensor:
    """The detached regression target u_tgt = v~ - (t - r) d/dt u_theta(z, r, t | y) (N, C, H, W).

    ``v`` (N, C, H, W): the path's velocity, noise - x0; v~ is v, or its guided form (``FoldedGuidance``).
    ``tangent``: the direction the derivative follows, the pair's velocity v~ ("conditional", the paper) or
    the model's own instantaneous velocity u_theta(z, t, t | y) ("predicted", improved mean flows).
    ``model``: the plain module (not DDP), which this calls without gradients."""
    if tangent not in TANGENTS:
        raise TinyDiTError(f"unknown mean-flow tangent {tangent!r}: use one of {', '.join(TANGENTS)}")
    with torch.no_grad():
        v = v.float()
        if guidance is not None and guidance.scale != 1.0:
            w = guidance.scale
            with _tangent_kernels():
                v_null = model(z, t, guidance.null, torch.zeros_like(t)).float()  # (N, C, H, W): d = 0
            v = torch.where(guidance.guided.view(-1, 1, 1, 1), w * v + (1 - w) * v_null, v)
        target = v.clone()
        rows = (r < t).nonzero().flatten()  # (k,): only intervals need the derivative
        if len(rows):
            zk, tk, yk = z[rows], t[rows], y[rows]
            if tangent == "predicted":
                with _tangent_kernels():
                    along = model(zk, tk, yk, torch.zeros_like(tk))  # (k, C, H, W): d = 0
            else:
                along = v[rows]
            _, du_dt = jvp_du_dt(model, zk, r[rows], tk, yk, along.to(z.dtype))
            gap = (t[rows] - r[rows]).view(-1, 1, 1, 1)  # (k, 1, 1, 1)
            target[rows] = v[rows] - gap * du_dt.float()
    return target


def meanflow_loss(
    forward: nn.Module,
    model: nn.Module,
    x0: torch.Tensor,
    y: torch.Tensor,
    r: torch.Tensor,
    t: torch.Tensor,
    noise: torch.Tensor,
    guidance: FoldedGuidance | None = None,
    tangent: str = "conditional",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean-flow loss of a batch: ``forward`` (the trained callable: compiled, DDP) predicts
    u(z_t, r, t | y); ``model`` (the same weights, a plain module) computes the detached target.

    Returns (weighted, error), (N,) each: the adaptively weighted per-image loss to minimise, and the plain
    mean squared error, which is the flow-matching loss where r = t (what logs and bins report)."""
    z = interpolate(x0, noise, t)  # (N, C, H, W)
    target = meanflow_target(model, z, r, t, y, velocity_target(x0, noise), guidance, tangent)
    u = forward(z, t, y, t - r)  # (N, C, H, W)
    error = (u.float() - target).pow(2).flatten(1).mean(1)  # (N,)
    # error is a per-pixel mean: error / (error + c) = sum / (sum + c C H W), the paper code's summed loss with c C H W
    weighted = error / (error.detach() + ADAPTIVE_C)  # (N,)
    return weighted, error


def check_jvp(model: nn.Module, device: torch.device, precision_context=contextlib.nullcontext) -> None:
    """Take one Jacobian-vector product of ``model`` on a tiny input, so that a model that cannot carry a
    tangent is refused before training, with the reason."""
    c = model.config
    if not getattr(c, "shortcut", False):
        raise TinyDiTError("a mean-flow model embeds the interval t - r: build it with `shortcut` True")
    z = torch.randn(1, c.in_channels, c.img_size, c.img_size, device=device)
    t = torch.full((1,), 0.75, device=device)
    text = getattr(c, "cond", "class") == "text"
    y = model.null_condition(torch.zeros((1, c.text_len) if text else (1,), dtype=torch.long, device=device))
    try:
        with torch.no_grad(), precision_context():
            _, du_dt = jvp_du_dt(model, z, t / 2, t, y, torch.randn_like(z))
    except RuntimeError as err:
        raise TinyDiTError(
            f"`objective` meanflow needs the derivative of the model along the flow (forward-mode autodiff), "
            f"and {type(model).__name__} cannot give it here: {str(err).splitlines()[0]}"
        ) from err
    if du_dt is None:
        raise TinyDiTError(f"{type(model).__name__} dropped the tangent of its input: `objective` meanflow needs it")
