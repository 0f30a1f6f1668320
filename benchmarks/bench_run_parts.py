"""Where a training run's time goes, end to end: the steps (and, inside them, the alignment's encoder), the
validations, the sample grids, the evaluations, the checkpoints, and everything else (start-up, compiling
at the first step, logging).

    python benchmarks/bench_run_parts.py [--minutes 5] [TRAIN FLAGS ...]

Runs ``tinydit train --data shapes --minutes 5`` (by default; any other ``tinydit train`` flags may follow) in
this process, with the trainer's parts timed as they are called. ``bench_step_parts.py`` splits one step;
this splits the run around the steps.
"""

from __future__ import annotations

import functools
import platform
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import fields

import torch

from tinydit.cli import build_parser
from tinydit.config import TrainConfig
from tinydit.train import Trainer
from tinydit.train.repa import Alignment

PARTS = {  # what is timed: (class, method) -> the row it adds to
    (Trainer, "train_step"): "training steps",
    (Alignment, "target"): "the alignment's encoder, within the steps",
    (Trainer, "_validate"): "validation losses",
    (Trainer, "_draw_grid"): "sample grids",
    (Trainer, "_score"): "evaluations",
    (Trainer, "save"): "checkpoints",
}


def timed(spent: dict, calls: dict, row: str, method):
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            spent[row] += time.perf_counter() - t0
            calls[row] += 1

    return wrapper


def main() -> None:
    argv = sys.argv[1:]
    args = ["train", "--data", "shapes", *([] if "--minutes" in argv or "--steps" in argv else ["--minutes", "5"])]
    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for (cls, name), row in PARTS.items():
        setattr(cls, name, timed(spent, calls, row, getattr(cls, name)))
    with tempfile.TemporaryDirectory() as out:
        ns = build_parser().parse_args([*args, *argv, "--out", out])
        cfg = TrainConfig(**{f.name: getattr(ns, f.name) for f in fields(TrainConfig)})  # as `tinydit train` makes it
        t0 = time.perf_counter()
        trainer = Trainer(cfg, progress=False)
        built = time.perf_counter() - t0
        result = trainer.fit()
        total = time.perf_counter() - t0
    print(
        f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, `tinydit {' '.join(args + argv)}`"
    )
    print(f"# {result.step:,} steps, {total:.1f} s in all, {built:.1f} s to build the run")
    print("| part | calls | seconds | share of the run |")
    print("|---|---|---|---|")
    accounted = built
    for row in PARTS.values():
        print(f"| {row} | {calls[row]:,} | {spent[row]:.1f} | {spent[row] / total:.1%} |")
        accounted += 0 if "within" in row else spent[row]
    print(f"| building the run (data, model, compile setup) | 1 | {built:.1f} | {built / total:.1%} |")
    rest = total - accounted
    print(f"| everything else (logging, the loop, the end) | | {rest:.1f} | {rest / total:.1%} |")


if __name__ == "__main__":
    main()
