"""Data-parallel training throughput: N ranks (torchrun, DDP) against one process with the same cores.

    python benchmarks/bench_ddp.py                         # CPU: 2 ranks x 1 thread against 1 rank x 2 threads
    python benchmarks/bench_ddp.py --preset dit-0.2m --steps 200 --repeats 5
    python benchmarks/bench_ddp.py --device cuda --nproc 8 --precision bf16    # one rank per GPU against one GPU
    python benchmarks/bench_ddp.py --preset dit-1.4m --batch 64 --precision bf16 --compile on --steps 500  # quick start

Each run is the real ``tinydit train`` (a fresh run directory, the same global batch and seed), and its
rate is the trainer's own images per second (metrics.jsonl, ``img_per_s``) over the windows after the
first, so start-up, data preparation and the first steps' warm-up are left out. The two set-ups run
interleaved (A, B, A, B, ...) and the table gives the median of ``--repeats`` runs of each: on a shared
machine, drifts in load hit both alike. Prints a Markdown table, then ``ddp_speedup: N.NN`` (ranks over
one process; below 1 means data parallelism lost).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def run(out: Path, nproc: int, threads: int, args: argparse.Namespace) -> float:
    """Images per second of one ``tinydit train`` run, 1 process (nproc 0) or nproc ranks under torchrun."""
    flags = [
        "train",
        "--data",
        args.data,
        "--preset",
        args.preset,
        "--batch-size",
        str(args.batch),
        "--steps",
        str(args.steps),
        "--log-every",
        str(args.log_every),
        "--val-every",
        "100000",
        "--sample-every",
        "100000",
        "--ckpt-every",
        "100000",
        "--precision",
        args.precision,
        "--compile",
        args.compile,
        "--device",
        args.device,
        "--no-report",
        "--no-progress",
        "--out",
        str(out),
    ]
    if nproc:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            "-m",
            "tinydit",
            "--",
            *flags,
        ]
    else:
        cmd = [sys.executable, "-m", "tinydit", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    rates = [
        r["img_per_s"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "img_per_s" in r
    ]
    return statistics.median(rates[1:] or rates)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="dit-1.9m")
    p.add_argument("--data", default="shapes")
    p.add_argument("--batch", type=int, default=128, help="the global batch, split over the ranks")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--nproc", type=int, default=2, help="ranks of the data-parallel run")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads of the one-process run (default: --nproc; each rank gets one on a CPU)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--compile", default="off", help="each run's --compile (on: the quick start's compiled step)")
    p.add_argument("--precision", default="fp32")
    args = p.parse_args()
    threads = args.threads or (args.nproc if args.device == "cpu" else 1)
    setups = {
        f"1 process x {threads} threads": (0, threads),
        f"{args.nproc} ranks x 1 thread (DDP, {'gloo' if args.device == 'cpu' else 'nccl'})": (args.nproc, 1),
    }
    rates: dict[str, list[float]] = {name: [] for name in setups}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for j, (name, (nproc, n_threads)) in enumerate(setups.items()):
                rates[name].append(run(Path(tmp) / f"{i}-{j}", nproc, n_threads, args))
                print(f"{name}: {rates[name][-1]:.0f} img/s", file=sys.stderr)
    print(
        f"\n{args.preset}, {args.data}, global batch {args.batch}, {args.steps} steps, {args.precision}, "
        f"{args.device}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
        f"{torch.__version__}, {datetime.date.today()}; median of {args.repeats}\n"
    )
    print("| set-up | images/s | runs |")
    print("|---|---|---|")
    for name, values in rates.items():
        print(f"| {name} | {statistics.median(values):.0f} | {', '.join(f'{v:.0f}' for v in values)} |")
    one, ddp = (statistics.median(v) for v in rates.values())
    print(f"\nddp_speedup: {ddp / one:.2f}")


if __name__ == "__main__":
    main()
