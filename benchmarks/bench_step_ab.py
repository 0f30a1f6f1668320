"""The quick start's training step on two source trees, timed in turns: the ratio of their speeds in one run.

    python benchmarks/bench_step_ab.py BASE_TREE HEAD_TREE [--compile on] [--rounds 2] [--steps 20]

A tree is a checkout of TinyDiT (``git worktree add /tmp/base COMMIT``). Each round times the base, then the
head, each in its own process that imports the tree's ``src`` and the ``Trainer.train_step`` of its own
``benchmarks/bench_step_parts.py`` (the run ``tinydit train --data shapes`` makes: its preset, batch,
precision, alignment with kept targets, and ``--compile``). A process warms up for 15 steps (compiling, where
it compiles), then reports the median of 5 timings of ``--steps`` steps. The machine's speed drifts by the
hour (and within minutes), so the rounds alternate, and the speed-up is the median over rounds of each
round's base / head, beside the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import torch

# Run in the child, with the tree's own src and benchmarks first on the path.
CHILD = """
import json, statistics, sys, tempfile, time
tree, compiled, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path[:0] = [tree + "/src", tree + "/benchmarks"]
import tinydit
assert tinydit.__file__.startswith(tree), f"imported {tinydit.__file__}, not {tree}"
from bench_step_parts import fill_targets, timed_step
from tinydit.config import TrainConfig
from tinydit.train import Trainer
with tempfile.TemporaryDirectory() as out:
    tr = Trainer(TrainConfig(data="shapes", steps=10**6, compile=compiled, out=out), progress=False)
    with tr.run.kernel():
        tr.run.model.train()
        fill_targets(tr)
        for _ in range(15):
            timed_step(tr, True)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(steps):
                timed_step(tr, True)
            times.append((time.perf_counter() - t0) / steps * 1e3)
print(json.dumps({"ms": statistics.median(times), "precision": tr.precision, "preset": tr.cfg.preset}))
"""


def time_tree(tree: Path, compiled: str, steps: int) -> dict:
    if not (tree / "benchmarks" / "bench_step_parts.py").is_file():
        raise SystemExit(f"{tree} has no benchmarks/bench_step_parts.py: give a checkout of TinyDiT from 2026-12-05 on")
    res = subprocess.run(
        [sys.executable, "-c", CHILD, str(tree), compiled, str(steps)], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        raise SystemExit(f"timing {tree} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base", type=Path)
    p.add_argument("head", type=Path)
    p.add_argument("--compile", default="on", choices=("on", "off"), help="the blocks compiled, or eager")
    p.add_argument("--rounds", type=int, default=2, help="base-then-head rounds")
    p.add_argument("--steps", type=int, default=20, help="steps per timing")
    args = p.parse_args()
    trees = {"base": args.base.resolve(), "head": args.head.resolve()}
    ms: dict[str, list[float]] = {"base": [], "head": []}
    for r in range(args.rounds):
        for name, tree in trees.items():
            got = time_tree(tree, args.compile, args.steps)
            ms[name].append(got["ms"])
            print(f"round {r + 1} {name}: {got['ms']:.1f} ms/step ({got['preset']}, {got['precision']})", flush=True)
    base, head = statistics.median(ms["base"]), statistics.median(ms["head"])
    paired = statistics.median(b / h for b, h in zip(ms["base"], ms["head"], strict=True))
    cpu = platform.processor() or platform.machine()
    print(
        f"compile {args.compile}: base {base:.1f} ms/step, head {head:.1f} ms/step: head {base / head:.3f}x; "
        f"median of the rounds' ratios {paired:.3f}x"
    )
    print(f"machine: {cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}")


if __name__ == "__main__":
    main()
