"""Distillation's teacher paths: sampled once from the trained teacher, cached in the run directory, and
read by the student's training (``tinydit.flow.distill`` has the method and the student's loss).
"""

from __future__ import annotations

import sys
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from tinydit.checkpoints.checkpoint import Checkpoint, load_checkpoint, load_model
from tinydit.errors import TinyDiTError
from tinydit.files import torch_save
from tinydit.flow.distill import KNOTS
from tinydit.flow.generate import class_cycle
from tinydit.flow.objectives import PathBatch
from tinydit.flow.samplers import sample_path
from tinydit.flow.settings import SamplingSettings
from tinydit.progress import Progress
from tinydit.runtime import autocast

__all__ = ["TeacherPaths", "Distillation", "teacher_sampling", "teacher_paths", "load_teacher", "run_paths"]


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


def teacher_sampling(cfg) -> SamplingSettings:
    """How a run's teacher samples its paths (``teacher_sampler``, ``teacher_steps``, ``teacher_cfg``,
    ``teacher_cfg_interval``; checked with the run's objective, ``tinydit.flow.objectives.Distill``):
    a fixed-step sampler on the uniform grid, its steps a multiple of ``KNOTS``."""
    interval = cfg.teacher_cfg_interval
    return SamplingSettings(
        cfg.teacher_sampler, cfg.teacher_steps, cfg.teacher_cfg, cfg_interval=interval, source="the teacher's paths"
    )


@torch.no_grad()
def teacher_paths(
    teacher: nn.Module,
    n: int,
    seed: int,
    settings: SamplingSettings,
    batch_size: int = 500,
    autocast_ctx=None,
    progress: bool = True,
) -> TeacherPaths:
    """``n`` paths of the teacher, class-balanced, from noise drawn with ``seed``.

    The teacher runs ``settings``' fixed-step sampler on the uniform grid of its steps (as ``tinydit
    sample`` with those settings would) and every knot, every ``steps / KNOTS`` steps, is kept.
    ``autocast_ctx``: a zero-argument callable returning the precision context to run the teacher in.
    """
    if n < 1:
        raise TinyDiTError(f"distillation needs at least one teacher path, got {n}")
    cfg = teacher.config
    device = next(teacher.parameters()).device
    y = class_cycle(n, cfg.n_classes)  # (n,)
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(n, cfg.in_channels, cfg.img_size, cfg.img_size, generator=gen)  # (n, C, H, W)
    states = torch.empty(n, KNOTS + 1, *noise.shape[1:], dtype=torch.float16)
    started, nfe = time.perf_counter(), 0
    bar = Progress(n, "teacher paths", unit="path", enabled=progress)
    for i in range(0, n, batch_size):
        with autocast_ctx() if autocast_ctx is not None else nullcontext():
            path, nfe = sample_path(
                settings, teacher, noise[i : i + batch_size].to(device), y[i : i + batch_size].to(device), KNOTS
            )
        states[i : i + batch_size] = path.transpose(0, 1).float().cpu().to(torch.float16)  # (b, KNOTS + 1, C, H, W)
        bar.update(len(path[0]))
    bar.close()
    if not torch.isfinite(states).all():
        raise TinyDiTError(
            "the teacher's paths hold NaN or infinite values; check the teacher checkpoint and its guidance scale"
        )
    return TeacherPaths(states, y, nfe, time.perf_counter() - started)


def load_teacher(path: str, model_type: str, data_name: str) -> Checkpoint:
    """The teacher's checkpoint, checked: a class-conditional ``model_type`` trained on ``data_name``."""
    teacher = load_checkpoint(path)
    kind, cond = teacher.model_type, teacher.config.cond
    if kind != model_type or cond != "class":
        raise TinyDiTError(
            f"`teacher` {path} is a {kind} conditioned on {cond}; distillation needs a class-conditional {model_type}"
        )
    if teacher.data.name != data_name:
        raise TinyDiTError(
            f"`teacher` {path} was trained on {teacher.data.name}, not {data_name}; pass `data` {teacher.data.name}"
        )
    return teacher


def run_paths(cfg, teacher_state: Checkpoint, cache: Path, device, precision: str, progress: bool = True):
    """A run's training and validation paths (``cfg.distill_paths`` and ``cfg.val_size`` of them, from
    two seeds derived from ``cfg.seed``): sampled once with the run's ``teacher_*`` settings, then read
    from ``cache``. Returns two ``TeacherPaths``."""
    sampling = teacher_sampling(cfg)
    settings = {  # the cache's key, in the names caches were written with (a renamed key would sample again)
        "teacher": str(cfg.teacher),
        "sampler": sampling.sampler,
        "steps": sampling.steps,
        "cfg": sampling.cfg_scale,
        "cfg_interval": list(sampling.cfg_interval),
        "n": cfg.distill_paths,
        "val": cfg.val_size,
        "seed": cfg.seed,
        "knots": KNOTS,
    }
    if cache.exists():
        stored = torch.load(cache, weights_only=True)
        if stored["settings"] == settings:
            return TeacherPaths.from_dict(stored["train"]), TeacherPaths.from_dict(stored["val"])
        warnings.warn(f"{cache} was sampled with other settings; sampling the teacher's paths again", stacklevel=2)
    teacher, _ = load_model(teacher_state, map_location=device)
    print(
        f"sampling {cfg.distill_paths} + {cfg.val_size} paths of the teacher {cfg.teacher} ({sampling.describe()})",
        file=sys.stderr,
    )
    runs = {
        split: teacher_paths(
            teacher,
            n,
            seed=cfg.seed * 1_000_003 + 4243 + key,
            settings=sampling,
            autocast_ctx=lambda: autocast(device, precision),
            progress=progress,
        )
        for split, n, key in (("train", cfg.distill_paths, 0), ("val", cfg.val_size, 1))
    }
    torch_save(cache, {"settings": settings, **{k: v.to_dict() for k, v in runs.items()}})
    train = runs["train"]
    print(
        f"teacher paths: {len(train)} in {train.seconds:.0f} s ({train.nfe} evaluations each), cached in {cache}",
        file=sys.stderr,
    )
    return train, runs["val"]


class Distillation:
    """A student's side of distillation: the teacher's checkpoint (whose preset and architecture the
    student takes), its sampled paths for training and validation, and a step's batch of them."""

    def __init__(self, cfg):
        self.cfg = cfg  # resolved: ``cfg.data`` is the name the teacher's checkpoint must record too
        self.state = load_teacher(cfg.teacher, cfg.model, cfg.data)
        self.preset: str = self.state.preset
        self.paths: TeacherPaths | None = None
        self.val_paths: TeacherPaths | None = None

    def prepare(self, trainer) -> None:
        """Sample (rank 0) or read (the other ranks, and continuations) the paths of a ``tinydit.train.Trainer``'s
        run, cached in its run directory."""
        world, cache = trainer.world, trainer.out / "teacher_paths.pt"
        with world.main_first():
            self.paths, self.val_paths = run_paths(
                self.cfg, self.state, cache, trainer.device, trainer.precision, trainer.progress and world.main
            )
        trainer.log.record(
            {
                "step": trainer.run.step,
                "teacher_paths": len(self.paths),
                "teacher_nfe": self.paths.nfe,
                "teacher_seconds": round(self.paths.seconds, 1),
            }
        )

    def batch(self, idx: torch.Tensor, device, generator: torch.Generator) -> PathBatch:
        """The paths ``idx`` (this rank's share) on ``device``, a student's draws for one step."""
        states = self.paths.states[idx].to(device, non_blocking=True)  # (n, KNOTS + 1, C, H, W) float16
        return PathBatch(states, self.paths.y[idx].to(device), generator)
