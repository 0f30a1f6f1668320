"""Samplers: integrate the learned velocity from noise (t = 1) to data (t = 0).

See ``tinydit.flow`` for the time convention. Every sampler has the same signature,

    sampler(model, noise, y, steps, cfg_scale) -> SampleResult(x, nfe)

and reports ``nfe``: the exact number of model evaluations per image. With guidance on, one step
evaluates the model on the conditional and the unconditional input (batched into one forward pass),
so it counts as two.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tinydit.errors import TinyDiTError

__all__ = ["SampleResult", "check_sampler_args", "time_grid", "guided_velocity", "euler_sample", "generate",
           "class_cycle", "resolve_labels"]


@dataclass
class SampleResult:
    x: torch.Tensor  # (N, C, H, W) samples in about [-1, 1]
    nfe: int  # model evaluations per image


def time_grid(steps: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """Uniform grid from t = 1 (noise) down to t = 0 (data): (steps + 1,)."""
    return torch.linspace(1.0, 0.0, steps + 1, device=device)


def check_sampler_args(steps: int, cfg_scale: float) -> None:
    if steps < 1:
        raise TinyDiTError(f"--steps must be >= 1, got {steps}")
    if cfg_scale < 0:
        raise TinyDiTError(f"--cfg (the guidance scale) must be >= 0, 1 = off; got {cfg_scale}")


def guided_velocity(
    model: nn.Module, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, cfg_scale: float, null_class: int
) -> tuple[torch.Tensor, int]:
    """Classifier-free guidance (Ho & Salimans 2022): v = v_uncond + s (v_cond - v_uncond).

    x: (N, C, H, W), t and y: (N,). Returns (v, model evaluations per image). At s = 1 this is the
    conditional prediction alone, computed with one evaluation.
    """
    if cfg_scale == 1.0:
        return model(x, t, y), 1
    null = torch.full_like(y, null_class)
    v = model(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, null]))  # one batched pass (2N, ...)
    v_cond, v_uncond = v.chunk(2)
    return v_uncond + cfg_scale * (v_cond - v_uncond), 2


@torch.no_grad()
def euler_sample(
    model: nn.Module, noise: torch.Tensor, y: torch.Tensor, steps: int = 32, cfg_scale: float = 1.0
) -> SampleResult:
    """Euler's method on dx/dt = v from t = 1 to t = 0: x_{t - dt} = x_t - dt v(x_t, t)."""
    check_sampler_args(steps, cfg_scale)
    null_class = model.config.n_classes
    ts = time_grid(steps, noise.device)
    x, nfe = noise, 0
    for i in range(steps):
        t = ts[i].expand(x.shape[0])  # (N,)
        v, evals = guided_velocity(model, x, t, y, cfg_scale, null_class)
        x = x + (ts[i + 1] - ts[i]) * v  # dt is negative: we walk from noise to data
        nfe += evals
    return SampleResult(x, nfe)


def class_cycle(n: int, n_classes: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """Labels 0, 1, ..., n_classes-1, 0, 1, ... so any n is as class-balanced as it can be: (n,)."""
    return torch.arange(n, device=device) % n_classes


@torch.no_grad()
def generate(
    model: nn.Module,
    y: torch.Tensor,
    steps: int = 32,
    cfg_scale: float = 1.0,
    seed: int = 0,
    batch_size: int = 256,
) -> SampleResult:
    """Samples for labels y (N,), in batches; the same seed gives the same images on the same device.

    The noise for all N images is drawn first from one generator seeded with ``seed``, so image i
    does not depend on the batch size.
    """
    cfg = model.config
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(len(y), cfg.in_channels, cfg.img_size, cfg.img_size, generator=gen)  # on the CPU
    out, nfe = [], 0
    for i in range(0, len(y), batch_size):
        res = euler_sample(
            model, noise[i : i + batch_size].to(device), y[i : i + batch_size].to(device), steps, cfg_scale
        )
        out.append(res.x.cpu())
        nfe = res.nfe
    if not out:
        raise TinyDiTError("nothing to sample: ask for at least one image (n >= 1)")
    return SampleResult(torch.cat(out), nfe)


def resolve_labels(specs: list[str] | None, classes: list[str], n: int) -> torch.Tensor:
    """Labels (n,) for class names or ids given by a user, cycled to length n; all classes if none.

    ``specs`` items may be names ("sneaker") or ids ("7"); names match case-insensitively.
    """
    if n < 1:
        raise TinyDiTError(f"--n must be >= 1, got {n}")
    if not specs:
        return class_cycle(n, len(classes))
    lookup = {name.lower(): i for i, name in enumerate(classes)}
    ids = []
    for spec in specs:
        for item in str(spec).split(","):
            item = item.strip()
            if item.isdigit() and int(item) < len(classes):
                ids.append(int(item))
            elif item.lower() in lookup:
                ids.append(lookup[item.lower()])
            else:
                raise TinyDiTError(
                    f"unknown class {item!r}: this model knows {', '.join(classes)} (or ids 0-{len(classes) - 1})"
                )
    return torch.tensor(ids, dtype=torch.long)[torch.arange(n) % len(ids)]
