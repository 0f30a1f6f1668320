"""Trajectory distillation: a few-step student from a trained flow model, the teacher.

Shortcut models (``tinydit.shortcut``) learn large steps with no teacher, by making one step of 2d
agree with two of d, level by level; in 15 CPU minutes the one-step level gets the least of that
training (docs/few_step.md). With a trained model at hand there is a shorter way: run its best
sampler, guidance included, and have a student jump straight along the paths it records.

1. **Teacher paths.** For N noise images and class-balanced labels, the teacher's sampler (Heun by
   default, with guidance) runs from t = 1 to t = 0, and x is recorded at the ``KNOTS`` + 1 times
   t = k / KNOTS. The map from noise to image is then fixed, so the student's targets are exact: no
   averaging over the images a noise could have become, which is what blurs one-step flow models.
2. **The student** is the teacher's network plus the shortcut models' step-size input d, and starts
   from the teacher's EMA weights with the d embedding's last layer zeroed (so it starts as the teacher).
   For each image it learns one jump of a random size d = 1/n, n in ``STUDENT_STEPS``, from a knot
   t = j / KNOTS (a multiple of d) to the knot t - d:

       s(x_t, t, y, d)  ->  (x_t - x_{t-d}) / d           so that   x_{t-d} = x_t - d s

   which is what ``tinydit sample --steps n`` takes with Euler on the uniform grid. Guidance is in
   the paths, so the student samples at guidance 1: one evaluation per step.

This is knowledge distillation (Luhman & Luhman 2021) at several step sizes, on the fixed couplings
of reflow (Liu et al. 2023) with the shortcut models' step-size conditioning (Frans et al. 2024).
Its extra cost is the teacher's sampling (``teacher_nfe`` evaluations per path) plus the student's
training; ``docs/few_step.md`` has both, measured.
"""

from __future__ import annotations

import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from tinydit.checkpoint import load_checkpoint, load_model
from tinydit.errors import TinyDiTError
from tinydit.sampling import class_cycle, sample_path

__all__ = ["KNOTS", "STUDENT_STEPS", "TeacherPaths", "teacher_paths", "distill_loss", "distill_losses_by_steps",
           "init_student", "load_teacher", "run_paths", "warn_if_untrained_settings"]  # fmt: skip

KNOTS = 8  # the teacher's path is kept at t = 0, 1/8, ..., 1
STUDENT_STEPS = (1, 2, 4, 8)  # the step counts the student learns; each divides KNOTS
STEP_PROBS = (0.39, 0.28, 0.19, 0.14)  # how often each step count is trained: about 1 / sqrt(steps)


@dataclass
class TeacherPaths:
    states: torch.Tensor  # (N, KNOTS + 1, C, H, W) float16 on the CPU; states[:, k] is x at t = k / KNOTS
    y: torch.Tensor  # (N,) int64 labels
    nfe: int  # teacher evaluations per path
    seconds: float  # wall time spent sampling them

    def __len__(self) -> int:
        return len(self.y)

    def to_dict(self) -> dict:
        return {"states": self.states, "y": self.y, "nfe": self.nfe, "seconds": self.seconds}

    @classmethod
    def from_dict(cls, d: dict) -> TeacherPaths:
        return cls(d["states"], d["y"], int(d["nfe"]), float(d["seconds"]))


@torch.no_grad()
def teacher_paths(
    teacher: nn.Module,
    n: int,
    seed: int,
    sampler: str = "heun",
    steps_per_knot: int = 1,
    cfg_scale: float = 1.0,
    cfg_interval: tuple[float, float] | None = None,
    batch_size: int = 500,
    autocast_ctx=None,
    progress: bool = True,
) -> TeacherPaths:
    """``n`` paths of the teacher, class-balanced, from noise drawn with ``seed``.

    The teacher runs ``sampler`` on the uniform grid of ``KNOTS * steps_per_knot`` steps (as
    ``tinydit sample --sampler S --steps KNOTS*steps_per_knot`` would) and every knot is kept.
    ``autocast_ctx``: a zero-argument callable returning the precision context to run the teacher in.
    """
    from contextlib import nullcontext

    from tqdm.auto import tqdm

    if n < 1:
        raise TinyDiTError(f"distillation needs at least one teacher path, got {n}")
    cfg = teacher.config
    device = next(teacher.parameters()).device
    y = class_cycle(n, cfg.n_classes)  # (n,)
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(n, cfg.in_channels, cfg.img_size, cfg.img_size, generator=gen)  # (n, C, H, W)
    states = torch.empty(n, KNOTS + 1, *noise.shape[1:], dtype=torch.float16)
    started, nfe = time.perf_counter(), 0
    bar = tqdm(total=n, unit="path", desc="teacher paths", disable=not progress, dynamic_ncols=True)
    for i in range(0, n, batch_size):
        with autocast_ctx() if autocast_ctx is not None else nullcontext():
            path, nfe = sample_path(sampler, teacher, noise[i : i + batch_size].to(device),
                                    y[i : i + batch_size].to(device), KNOTS, steps_per_knot, cfg_scale,
                                    cfg_interval=cfg_interval)  # fmt: skip
        states[i : i + batch_size] = path.transpose(0, 1).float().cpu().to(torch.float16)  # (b, KNOTS + 1, C, H, W)
        bar.update(len(path[0]))
    bar.close()
    if not torch.isfinite(states).all():
        raise TinyDiTError("the teacher's paths hold NaN or infinite values; check the teacher checkpoint and "
                           "its guidance scale")  # fmt: skip
    return TeacherPaths(states, y, nfe, time.perf_counter() - started)


def init_student(student: nn.Module, teacher_weights: dict) -> None:
    """Load the teacher's weights into a student that also has the step-size embedding ``d_embed``,
    and zero that embedding's output layer so the student starts out computing what the teacher does."""
    hint = "distill from a checkpoint of the same architecture"
    try:
        missing, unexpected = student.load_state_dict(teacher_weights, strict=False)
    except RuntimeError as err:  # a shape mismatch
        raise TinyDiTError(f"the teacher's weights do not fit the student ({err}); {hint}") from err
    if unexpected or any(not k.startswith("d_embed.") for k in missing):
        raise TinyDiTError(f"the teacher's weights do not fit the student (missing {missing}, unexpected "
                           f"{unexpected}); {hint}")  # fmt: skip
    last = student.d_embed.mlp[2]
    nn.init.zeros_(last.weight)
    nn.init.zeros_(last.bias)


def _jump(model: nn.Module, states: torch.Tensor, y: torch.Tensor, n_steps: torch.Tensor, j: torch.Tensor):
    """Per-image loss (B,) of one jump of size 1 / n_steps from knot j to knot j - KNOTS / n_steps.

    states: (B, KNOTS + 1, C, H, W); y, n_steps, j: (B,)."""
    rows = torch.arange(len(y), device=states.device)
    span = KNOTS // n_steps  # (B,) knots per jump
    x_t = states[rows, j].float()  # (B, C, H, W)
    x_end = states[rows, j - span].float()
    d = 1.0 / n_steps.float()  # (B,)
    target = (x_t - x_end) / d.view(-1, 1, 1, 1)  # the average velocity over the jump
    pred = model(x_t, j.float() / KNOTS, y, d)
    return (pred.float() - target).pow(2).flatten(1).mean(1)


def distill_loss(
    model: nn.Module,
    states: torch.Tensor,
    y: torch.Tensor,
    generator: torch.Generator | None = None,
    reduce: bool = True,
) -> torch.Tensor:
    """The student's loss on a batch of teacher paths: one jump per image, of a step count drawn from
    ``STUDENT_STEPS`` with probabilities ``STEP_PROBS`` and a start drawn uniformly from that count's knots.

    states: (B, KNOTS + 1, C, H, W) on the model's device; y: (B,). Returns the mean, or (B,) with reduce=False.
    """
    b, dev = len(y), states.device
    choice = torch.multinomial(torch.tensor(STEP_PROBS), b, replacement=True, generator=generator)  # (B,)
    n_steps = torch.tensor(STUDENT_STEPS)[choice]  # (B,)
    r = (torch.rand(b, generator=generator) * n_steps).long() + 1  # (B,) which jump, 1..n_steps
    j = r * (KNOTS // n_steps)  # (B,) the start knot
    per_image = _jump(model, states, y, n_steps.to(dev), j.to(dev))
    return per_image.mean() if reduce else per_image


@torch.no_grad()
def distill_losses_by_steps(
    model: nn.Module, states: torch.Tensor, y: torch.Tensor, batch_size: int = 256
) -> list[float]:
    """The student's loss for each step count of ``STUDENT_STEPS``, averaged over every jump of that
    count and every path: deterministic, for validation. states: (N, KNOTS + 1, C, H, W); y: (N,)."""
    out, n, dev = [], len(y), states.device
    for n_steps in STUDENT_STEPS:
        span, total = KNOTS // n_steps, 0.0
        for r in range(1, n_steps + 1):
            for i in range(0, n, batch_size):
                b = len(y[i : i + batch_size])
                steps_b, j = torch.full((b,), n_steps, device=dev), torch.full((b,), r * span, device=dev)
                total += _jump(model, states[i : i + batch_size], y[i : i + batch_size], steps_b, j).sum().item()
        out.append(total / (n_steps * n))
    return out


def load_teacher(path: str, model_type: str, data_name: str) -> dict:
    """The teacher's checkpoint, checked: a class-conditional ``model_type`` trained on ``data_name``."""
    teacher = load_checkpoint(path)
    kind, cond = teacher.get("model_type", "dit"), teacher["model_config"].get("cond", "class")
    if kind != model_type or cond != "class":
        raise TinyDiTError(f"--teacher {path} is a {kind} conditioned on {cond}; distillation needs a "
                           f"class-conditional {model_type}")  # fmt: skip
    if teacher["data"]["name"] != data_name:
        raise TinyDiTError(f"--teacher {path} was trained on {teacher['data']['name']}, not {data_name}; "
                           f"pass --data {teacher['data']['name']}")  # fmt: skip
    return teacher


def run_paths(cfg, teacher_state: dict, cache: Path, device, precision: str, progress: bool = True):
    """A run's training and validation paths (``cfg.distill_paths`` and ``cfg.val_size`` of them, from
    two seeds derived from ``cfg.seed``): sampled once with the run's ``teacher_*`` settings, then read
    from ``cache``. Returns two ``TeacherPaths``."""
    from tinydit.runtime import autocast

    settings = {"teacher": str(cfg.teacher), "sampler": cfg.teacher_sampler, "steps": cfg.teacher_steps,
                "cfg": cfg.teacher_cfg, "cfg_interval": list(cfg.teacher_cfg_interval), "n": cfg.distill_paths,
                "val": cfg.val_size, "seed": cfg.seed, "knots": KNOTS}  # fmt: skip
    if cache.exists():
        stored = torch.load(cache, weights_only=True)
        if stored["settings"] == settings:
            return TeacherPaths.from_dict(stored["train"]), TeacherPaths.from_dict(stored["val"])
        warnings.warn(f"{cache} was sampled with other settings; sampling the teacher's paths again", stacklevel=2)
    teacher, _ = load_model(teacher_state, map_location=device)
    lo, hi = cfg.teacher_cfg_interval
    print(f"sampling {cfg.distill_paths} + {cfg.val_size} paths of the teacher {cfg.teacher} ({cfg.teacher_sampler}, "
          f"{cfg.teacher_steps} steps, guidance {cfg.teacher_cfg:g} for t in [{lo:g}, {hi:g}])", file=sys.stderr)
    runs = {
        split: teacher_paths(teacher, n, seed=cfg.seed * 1_000_003 + 4243 + key, sampler=cfg.teacher_sampler,
                             steps_per_knot=cfg.teacher_steps // KNOTS, cfg_scale=cfg.teacher_cfg,
                             cfg_interval=cfg.teacher_cfg_interval, autocast_ctx=lambda: autocast(device, precision),
                             progress=progress)
        for split, n, key in (("train", cfg.distill_paths, 0), ("val", cfg.val_size, 1))
    }  # fmt: skip
    torch.save({"settings": settings, **{k: v.to_dict() for k, v in runs.items()}}, cache)
    train = runs["train"]
    print(f"teacher paths: {len(train)} in {train.seconds:.0f} s ({train.nfe} evaluations each), cached in {cache}",
          file=sys.stderr)  # fmt: skip
    return train, runs["val"]


def warn_if_untrained_settings(state: dict, sampler: str, steps: int, cfg_scale: float, grid: str = "uniform") -> None:
    """Warn when a distilled student is sampled in a way it never learned: it takes 1, 2, 4 or 8 Euler
    steps on the uniform grid at guidance 1 (the teacher's guidance is in its paths)."""
    if state.get("train_config", {}).get("few_step") != "distill":
        return
    if sampler != "euler" or steps not in STUDENT_STEPS or cfg_scale != 1.0 or grid != "uniform":
        warnings.warn(f"this checkpoint is a distilled student, trained for {', '.join(map(str, STUDENT_STEPS))} "
                      f"euler steps on the uniform grid at guidance 1 (--cfg 1); {sampler} with {steps} steps, "
                      f"{grid} grid and guidance {cfg_scale:g} were never trained", stacklevel=2)  # fmt: skip
