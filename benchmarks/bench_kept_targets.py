"""What the alignment's encoder costs a quick-start run, by the size of the batches its kept targets are
computed in (``tinydit.train.repa.TARGET_BATCH``).

    python benchmarks/bench_kept_targets.py [--chunks 64 16] [--steps 1200] [--repeats 1]

Each run is ``tinydit train --data shapes`` (compiled, the quick start's model, batch and alignment) for
``--steps`` steps in a fresh process, with the encoder's calls counted and timed. A run keeps each training
image's target both ways round; a training batch that misses any of its targets computes them in batches of
exactly ``TARGET_BATCH`` images (so that the bits do not depend on the batch). The chunk sizes alternate, so
that the machine's drift falls on each.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys

import torch

CHILD = """
import json, sys, tempfile, time
import tinydit.train.repa as repa
repa.TARGET_BATCH = int(sys.argv[2])
from tinydit.config import TrainConfig
from tinydit.train import Trainer
with tempfile.TemporaryDirectory() as out:
    cfg = TrainConfig(data="shapes", steps=int(sys.argv[1]), compile="on", out=out, report=False)
    tr = Trainer(cfg, progress=False)
    align, spent = tr.run.alignment, {"calls": 0, "seconds": 0.0}
    encoder = align.target
    def timed(x):
        t0 = time.perf_counter()
        try:
            return encoder(x)
        finally:
            spent["calls"] += 1
            spent["seconds"] += time.perf_counter() - t0
    align.target = timed
    t0 = time.perf_counter()
    tr.fit()
    spent["run_seconds"] = time.perf_counter() - t0
    spent["kept"] = align._kept.filled.float().mean().item()
print(json.dumps(spent))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chunks", type=int, nargs="+", default=[64, 16])
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, {args.steps} steps")
    print("| TARGET_BATCH | encoder calls | encoder seconds | run seconds | targets kept at the end |")
    print("|---|---|---|---|---|")
    for _ in range(args.repeats):
        for chunk in args.chunks:
            cmd = [sys.executable, "-c", CHILD, str(args.steps), str(chunk)]
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if res.returncode != 0:
                raise SystemExit(f"the run with TARGET_BATCH {chunk} failed:\n{res.stderr[-2000:]}")
            r = json.loads(res.stdout.strip().splitlines()[-1])
            print(f"| {chunk} | {r['calls']:,} | {r['seconds']:.1f} | {r['run_seconds']:.1f} | {r['kept']:.3f} |")


if __name__ == "__main__":
    main()
