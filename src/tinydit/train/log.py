"""What a run tells as it trains: ``metrics.jsonl`` (one JSON line per logging window, validation,
evaluation and event), the same numbers in TensorBoard (``tensorboard=True``), the progress
(``tinydit.progress``: a bar on a terminal, a line every few seconds elsewhere), and the lines printed
at its start and end."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

from tinydit import compiling
from tinydit.errors import TinyDiTError
from tinydit.files import append_line, write_text
from tinydit.flow import distill
from tinydit.flow.path import N_T_BINS
from tinydit.models.dit import count_params
from tinydit.progress import Progress
from tinydit.runtime import CompileChoice
from tinydit.train.data import RunData
from tinydit.train.run import Run
from tinydit.version import __version__

__all__ = ["RunLog", "compile_line"]


class RunLog:
    """The run's log: ``record`` appends to metrics.jsonl (and TensorBoard); ``window`` logs the training
    steps since the last window; ``bar`` is the progress of ``fit`` (off with ``progress=False``).
    ``quiet``: a log that writes and prints nothing (the ranks other than 0 of a distributed run)."""

    def __init__(self, out: Path, progress: bool = True, tensorboard: bool = False, quiet: bool = False):
        self.path, self.progress, self.bar, self.quiet = out / "metrics.jsonl", progress and not quiet, None, quiet
        self.board = _summary_writer(out / "tensorboard") if tensorboard and not quiet else None

    def record(self, record: dict) -> None:
        if self.quiet:
            return
        append_line(self.path, json.dumps(record))
        if self.board is not None:
            for tag, value in _scalars(record):
                self.board.add_scalar(tag, value, record["step"])

    def image(self, tag: str, step: int, path: Path) -> None:
        """A sample grid (a PNG the run wrote) into TensorBoard."""
        if self.board is not None:
            with Image.open(path) as img:
                self.board.add_image(tag, np.asarray(img.convert("RGB")), step, dataformats="HWC")

    def start(self, total: int | None, initial: int) -> None:
        self.bar = Progress(total, "train", "step", initial=initial, enabled=self.progress)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.board is not None:
            self.board.flush()

    def window(
        self,
        step: int,
        loss: float,
        img_s: float,
        lr: float,
        seconds: float,
        by_t: torch.Tensor,
        left: float | None,
        repa_loss: float | None = None,
    ) -> None:
        """Log the flow-matching loss (overall and per bin of t: NaN where no time fell), rate and time of a
        window, and REPA's alignment loss where the run aligns."""
        if not math.isfinite(loss):
            raise TinyDiTError(
                f"the training loss became {loss} by step {step}; the last good checkpoint is kept. "
                "Lower `lr` (or raise `warmup`) and start again with `overwrite`"
            )
        self.record(
            {
                "step": step,
                "loss": loss,
                "lr": lr,
                "img_per_s": img_s,
                "train_seconds": seconds,
                "loss_by_t": [round(v, 5) if math.isfinite(v) else None for v in by_t.tolist()],
                **({"repa_loss": repa_loss} if repa_loss is not None else {}),
            }
        )
        self.bar.set(loss=f"{loss:.4f}", **{"img/s": f"{img_s:.0f}"}, **({"left": left} if left is not None else {}))

    def say(self, message: str) -> None:
        if not self.quiet:
            print(message, file=sys.stderr)

    def announce(
        self,
        cfg,
        preset: str,
        data: RunData,
        model: nn.Module,
        step: int,
        device: torch.device,
        precision: str,
        choice: CompileChoice,
    ) -> None:
        """The start-up lines of a run of resolved config ``cfg``: what trains on what, or where it continues,
        and on what (the device and precision `auto` chose, where they were auto), then whether it compiles and
        why, where `compile` auto weighed it."""
        where = f"{device} in {precision}"
        if step:
            self.say(f"continuing {cfg.out} from step {step} on {where}")
        else:
            what = f"{preset}, text-conditioned," if cfg.cond == "text" else preset
            held = f", {data.n_held_out} held out: {cfg.holdout}" if data.n_held_out else ""
            ds, params = data.train_set, count_params(model)
            self.say(
                f"training {what} ({params / 1e6:.2f}M parameters) on {data.name} ({len(ds)} images, "
                f"{ds.channels}x{ds.img_size}x{ds.img_size}{held}) on {where}; run directory {cfg.out}"
            )
        line = compile_line(choice)
        if line is not None:
            self.say(line)

    def write_config(self, cfg, preset: str, data: RunData, model_config, run: Run, processes: int) -> None:
        """``config.json`` of a run: the resolved training config ``cfg`` and model config, what the run runs
        on (device, precision, compiled or not, kernels, the number of processes), and versions; text runs add
        their tokenizer's sizes and hold-out."""
        text = None
        if data.tokenizer is not None:
            text = {
                "vocab_size": data.tokenizer.vocab_size,
                "text_len": data.tokenizer.max_len,
                "holdout": list(cfg.held_out_phrases()),
                "held_out_images": data.n_held_out,
                "grid_prompts": data.prompts,
            }
        resolved = {
            "train": {**cfg.to_dict(), "preset": preset},
            "model_type": cfg.model,
            "model": model_config.to_dict(),
            "data": {"name": data.name, "classes": data.train_set.classes, "train_images": len(data.train_set)},
            "params": count_params(run.model),
            "device": str(run.device),
            "processes": processes,
            "precision": run.precision,
            "compile": run.compiled,
            "kernels": run.kernels(),
            "tinydit_version": __version__,
            "torch_version": torch.__version__,
            **({"text": text} if text is not None else {}),
        }
        write_text(self.path.parent / "config.json", json.dumps(resolved, indent=2) + "\n")

    def report(self, run: Run, events, checkpoint: Path, distilled: bool) -> None:
        """The closing lines of a run: its validation losses (``events``' last) and files."""
        val = events.validation
        if distilled:  # on its teacher's paths
            losses = f"val loss {val.even_t:.4f} (EMA {val.ema_even_t:.4f})"
        else:
            losses = f"val loss at even t {val.even_t:.4f} (EMA {val.ema_even_t:.4f})"
            if val.train_t is not None:
                losses += f", at training t {val.train_t:.4f} (EMA {val.ema_train_t:.4f})"
        self.say(
            f"step {run.step}: {losses} after "
            f"{run.train_seconds / 60:.1f} min; checkpoint {checkpoint}, samples {events.samples}"
        )
        by_t = events.by_t
        if distilled:  # a distilled student: its losses by step count
            pairs = zip(distill.STUDENT_STEPS, by_t, strict=True)
            self.say("EMA val loss by step count: " + ", ".join(f"{n} steps {v:.4f}" for n, v in pairs))
        else:
            bins = " ".join(f"{v:.3f}" for v in by_t)
            self.say(f"EMA val loss at even t, by t (0 = data ... 1 = noise, {N_T_BINS} bins): {bins}")


def compile_line(choice: CompileChoice) -> str | None:
    """The one line that says whether a run compiles and why, where `compile` auto weighed it; else None."""
    if not choice.why:
        return None
    if not choice.compiles:
        return choice.why
    return f"{choice.why} (kept in {compiling.cache_dir()}; --compile off to skip)"


def _scalars(record: dict):
    """(tag, value) of every number in a metrics.jsonl record: lists become tag/0, tag/1, ... (bins of t)."""
    for key, value in record.items():
        if key == "step" or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) and math.isfinite(value):
            yield key, value
        elif isinstance(value, list):
            yield from ((f"{key}/{i}", v) for i, v in enumerate(value) if isinstance(v, (int, float)))


def _summary_writer(folder: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:  # torch's writer needs the tensorboard package
        raise TinyDiTError("`tensorboard` needs the tensorboard package: pip install 'tinydit[tensorboard]'") from err
    return SummaryWriter(str(folder))
