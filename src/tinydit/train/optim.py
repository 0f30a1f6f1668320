"""The optimizer side of training: AdamW, the EMA of the weights, the schedules, and the seeded draws.

Exact resumption rests on ``step_generator``: every random draw of step s (which images, their flips,
times, noise and guidance dropout) comes from a generator seeded with (seed, s), and the batch order
of epoch e from one seeded with (seed, e), so a checkpoint needs no RNG stream to continue exactly.
"""

from __future__ import annotations

import torch
from torch import nn

from tinydit.config import TrainConfig

__all__ = ["adamw", "ema_update", "lr_at", "ema_decay_at", "step_generator"]


def adamw(
    params, device: torch.device, lr: float, weight_decay: float = 0.0, fused: bool | None = None
) -> torch.optim.AdamW:
    """The trainer's AdamW (betas 0.9, 0.99); ``fused`` None: PyTorch's fused kernel where it has one (CPU, CUDA).

    The fused kernel does one pass over all parameters instead of a loop per tensor, which is faster.
    Both compute the same update but round differently, so an exact resume needs the
    same one: a continued run keeps the one its checkpoint was written with (``tinydit.train.trainer``).
    """
    if fused is None:
        fused = device.type in ("cpu", "cuda")
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), weight_decay=weight_decay, fused=fused or None)


@torch.no_grad()
def ema_update(ema: nn.Module, model: nn.Module, decay: float) -> None:
    """ema <- decay * ema + (1 - decay) * model, for every parameter (buffers are copied)."""
    ema_params = [p for p in ema.parameters()]
    params = [p.detach() for p in model.parameters()]
    torch._foreach_lerp_(ema_params, params, 1.0 - decay)
    for b_ema, b in zip(ema.buffers(), model.buffers(), strict=True):
        b_ema.copy_(b)


def lr_at(cfg: TrainConfig, step: int, plan: dict | None = None) -> float:
    """Linear warm-up to the peak, then constant (DiT trains at a constant rate); with ``cooldown`` C a
    linear fall over the last C steps, to lr / C at the last step (warmup-stable-decay). A time-budget
    run's ``plan`` ({"steps", "cooldown"}, ``tinydit.train.budget``) sets them once its rate is known (an
    extension's plan has none before that: the peak rate)."""
    lr = cfg.lr * min(1.0, (step + 1) / max(1, cfg.warmup))
    steps, cooldown = (plan.get("steps"), plan.get("cooldown", 0)) if plan else (cfg.steps, cfg.cooldown)
    if cooldown and step >= steps - cooldown:
        lr *= max(steps - step, 1) / cooldown
    return lr


def ema_decay_at(cfg: TrainConfig, step: int) -> float:
    """EMA warm-up: early averages forget the random initialisation quickly."""
    return min(cfg.ema_decay, (1 + step) / (10 + step))


def step_generator(*keys: int) -> torch.Generator:
    """A CPU generator seeded from integer keys, independent of any global RNG state."""
    seed = 0
    for k in keys:
        seed = (seed * 1_000_003 + k) % (2**62)
    return torch.Generator().manual_seed(seed)
