"""What REPA's alignment costs per training step: the trainer's own step with and without it, in turns.

    python benchmarks/bench_repa.py [--data shapes] [--preset dit-1.4m] [--precision bf16] [--steps 10] [--repeats 7]

Two Trainers on ``--data`` (its default settings but the preset, one with ``repa`` 0.5), each timing ``--steps`` of its
``train_step`` (draw, forward, loss, backward, AdamW, EMA) in turns A, B, A, B, ... after warm-up steps; prints
the median seconds per step of each and their ratio. The ratio is what an equal-time comparison needs: a run
with the alignment holds 1 / ratio of the steps of one without it in the same time.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from tinydit.config import TrainConfig
from tinydit.train import Trainer


def time_steps(trainer: Trainer, steps: int) -> float:
    """Seconds per step of ``steps`` consecutive training steps."""
    start = time.perf_counter()
    for _ in range(steps):
        trainer.train_step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="shapes", help="a data set with a shipped encoder (tinydit.train.repa)")
    p.add_argument("--preset", default="dit-1.4m")
    p.add_argument("--precision", default="auto")
    p.add_argument("--repa", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=10, help="steps per timing")
    p.add_argument("--repeats", type=int, default=7, help="timings of each, in turns")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {}
        for name, repa in (("plain", 0.0), ("repa", args.repa)):
            cfg = TrainConfig(
                out=str(Path(tmp) / name), data=args.data, preset=args.preset, precision=args.precision, repa=repa
            )
            trainers[name] = Trainer(cfg, progress=False)
            trainers[name].run.model.train()
        for tr in trainers.values():  # warm-up: first-call allocations and kernel choices
            time_steps(tr, 3)
        times: dict[str, list[float]] = {name: [] for name in trainers}
        for _ in range(args.repeats):
            for name, tr in trainers.items():
                times[name].append(time_steps(tr, args.steps))
        for tr in trainers.values():
            tr.close()
    med = {name: statistics.median(v) for name, v in times.items()}
    row = {
        "data": args.data,
        "preset": args.preset,
        "precision": trainers["plain"].precision,
        "batch": trainers["plain"].batch_size,
        "plain_s_per_step": round(med["plain"], 4),
        "repa_s_per_step": round(med["repa"], 4),
        "ratio": round(med["repa"] / med["plain"], 3),
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    print(json.dumps(row))


if __name__ == "__main__":
    main()
