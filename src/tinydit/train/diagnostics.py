"""What a run measures of itself as it trains: the validation losses and the sample grids from fixed noise.
Both are comparable between steps and between runs.

Two validation losses, on the same held-out images with the same noise, differ in their times only:

* **even t**: one time per image spread evenly over [0, 1], also reported per bin of t. Every run of a
  data set is measured at the same times, whatever its training draws, so runs compare with each other.
* **training t**: times drawn once, from a fixed seed, from the run's own training distribution
  (``sample_t`` with its ``t_sampling`` and ``t_shift``): the loss the training loss estimates, so the two
  compare with each other. Training's label dropout is not applied (the labels are kept).

They differ a lot: the loss is a squared velocity error, and x-prediction's velocity error is its image
error over t, so the even-t mean is dominated by t < 0.1, which a logit-normal training rarely draws."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from tinydit.errors import TinyDiTError
from tinydit.flow import distill
from tinydit.flow.generate import class_cycle
from tinydit.flow.path import N_T_BINS, flow_loss, sample_t, t_bins
from tinydit.flow.samplers import sample
from tinydit.flow.settings import SamplingSettings
from tinydit.images import save_grid
from tinydit.train.data import RunData
from tinydit.train.teacher import TeacherPaths

__all__ = ["VAL_SEED", "VAL_T_SEED", "even_times", "training_times", "validation_losses", "sample_grid"]

VAL_SEED = 1234  # fixed noise for the validation loss, the same in every run
VAL_T_SEED = 4321  # the fixed draw of the validation times from the training distribution


def even_times(n: int) -> torch.Tensor:
    """One time (n,) per validation image, spread evenly over [0, 1]: the midpoints of n equal bins."""
    return (torch.arange(n) + 0.5) / n


def training_times(n: int, kind: str, shift: float) -> torch.Tensor:
    """n times (n,) drawn from a run's training distribution (``sample_t`` of ``kind`` and ``shift``), the same
    at every call: the validation loss under the training times is smooth across steps."""
    return sample_t(n, generator=torch.Generator().manual_seed(VAL_T_SEED), kind=kind, shift=shift)


@torch.no_grad()
def validation_losses(
    model: nn.Module,
    data: RunData,
    device: torch.device,
    val_paths: TeacherPaths | None = None,
    t: torch.Tensor | None = None,
) -> tuple[float, list[float]]:
    """The loss on the fixed held-out images with fixed noise at one time per image, ``t`` (n,) (default
    ``even_times``), and the same loss in N_T_BINS equal bins of t (with even times each bin holds as many
    images; a bin no time falls in reads 0). Distillation: the student's loss on the teacher's validation
    paths, and the same for each step count of ``distill.STUDENT_STEPS``."""
    was_training = model.training
    model.eval()
    try:
        if val_paths is not None:
            by_steps = distill.distill_losses_by_steps(model, val_paths.states.to(device), val_paths.y.to(device))
            return sum(by_steps) / len(by_steps), by_steps
        n = len(data.val_set)
        g = torch.Generator().manual_seed(VAL_SEED)
        noise = torch.randn(data.val_set.images.shape, generator=g)  # (n, C, H, W)
        t = even_times(n) if t is None else t.cpu()  # (n,)
        if t.shape != (n,):
            raise TinyDiTError(f"`t` must hold one time per validation image ({n}), got shape {tuple(t.shape)}")
        losses = []
        for i in range(0, n, 256):
            idx = torch.arange(i, min(i + 256, n))
            x, y = data.batch(False, idx, device=device)
            losses.append(flow_loss(model, x, y, t[idx].to(device), noise[idx].to(device), reduce=False))
    finally:
        model.train(was_training)
    per_image = torch.cat(losses).cpu()  # (n,)
    bins = t_bins(t)  # (n,)
    per_bin = torch.zeros(N_T_BINS).index_add_(0, bins, per_image)
    counts = torch.bincount(bins, minlength=N_T_BINS).clamp(min=1)
    return per_image.mean().item(), (per_bin / counts).tolist()


@torch.no_grad()
def sample_grid(
    forward,
    data: RunData,
    config,
    noise_gen: torch.Generator,
    device: torch.device,
    settings: SamplingSettings,
    paths: list[Path],
    per_class: int = 8,
) -> None:
    """Samples from fixed noise (drawn from ``noise_gen``) with the sampler ``settings``, written to each of
    ``paths``: one column per class, or in text runs one row of ``per_class`` images per prompt of
    ``data.prompts``."""
    if data.tokenizer is not None:
        ids = data.tokenizer.encode(data.prompts, warn=False)  # (P, L)
        y, nrow = ids.repeat_interleave(per_class, dim=0).to(device), per_class  # (P * per_class, L)
    else:
        y, nrow = class_cycle(per_class * config.n_classes, config.n_classes, device), config.n_classes
    noise = torch.randn(len(y), config.in_channels, config.img_size, config.img_size, generator=noise_gen)
    # the ancestral sampler's fresh noise: the same stream, after the starting noise
    x = sample(settings, forward, noise.to(device), y, generator=noise_gen).x.cpu()  # (n, C, H, W)
    for path in paths:
        path.parent.mkdir(exist_ok=True)
        save_grid(x, path, nrow=nrow)
