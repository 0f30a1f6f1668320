"""Ablation of the architecture switches at an equal CPU-time budget, scored with the offline metrics.

    python benchmarks/ablation.py --data fashion-mnist --preset dit-1.9m --minutes 4 --n 2000

1. The training throughput of every variant is measured in one run, interleaved (bench_train.race).
2. Each variant gets the number of steps it completes in ``--minutes`` at that throughput. Training
   for a fixed number of steps (rather than a wall-clock limit) keeps the result exact and
   repeatable even if the machine is busy while the variants train.
3. Each run is evaluated like ``tinydit eval``: N class-balanced samples (Euler, 32 steps, guidance
   2), FID in the shipped feature network's space and class consistency against the test split.

Writes RUN_ROOT/ablation.json and prints a Markdown table (docs/notes/ablation.md holds ours).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench_train import header, race, tinydit_workload

from tinydit.config import TrainConfig
from tinydit.data import load_dataset
from tinydit.eval.evaluate import evaluate
from tinydit.eval.sampling import generate_for_eval
from tinydit.flow.settings import SamplingSettings
from tinydit.models.dit import SWITCHES, get_preset
from tinydit.runtime import resolve_device, resolve_precision
from tinydit.train import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="fashion-mnist")
    parser.add_argument("--preset", default="dit-1.9m")
    parser.add_argument("--minutes", type=float, default=4.0, help="training budget per variant")
    parser.add_argument("--n", type=int, default=2000, help="samples per evaluation")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--only", action="append", help="variant(s) to run (default: all)")
    parser.add_argument("--out", default="runs/ablation")
    parser.add_argument(
        "--rates-only",
        action="store_true",
        help="only measure throughputs (into RUN_ROOT/rates.json, which later runs reuse): do this "
        "on a quiet machine, then train while it is busy",
    )
    args = parser.parse_args()
    device = resolve_device("auto")
    precision = resolve_precision(args.precision, device)
    header(args, device)
    train_set = load_dataset(args.data, train=True)
    base = get_preset(
        args.preset, img_size=train_set.img_size, in_channels=train_set.channels, n_classes=len(train_set.classes)
    )
    variants = {name: sw for name, sw in SWITCHES.items() if not args.only or name.split()[0] in args.only}

    root = Path(args.out)
    rates_file = root / "rates.json"
    rates = json.loads(rates_file.read_text()) if rates_file.exists() else {}
    if args.rates_only or not all(name in rates for name in variants):
        workloads = [
            tinydit_workload(replace(base, **sw), args.batch, device, precision, False) for sw in variants.values()
        ]
        rates.update(zip(variants, race(workloads, steps=2, repeats=5), strict=True))
        del workloads
        root.mkdir(parents=True, exist_ok=True)
        rates_file.write_text(json.dumps(rates, indent=2) + "\n")
        if args.rates_only:
            print(json.dumps({name: args.batch / s for name, s in rates.items()}, indent=2))
            return
    seconds = [rates[name] for name in variants]
    results = []
    for (name, sw), step_s in zip(variants.items(), seconds, strict=True):
        steps = int(args.minutes * 60 / step_s)
        out = root / name.split()[0]
        print(f"{name}: {args.batch / step_s:.0f} img/s -> {steps} steps in {args.minutes:g} min", flush=True)
        cfg = TrainConfig(
            out=str(out),
            data=args.data,
            preset=args.preset,
            steps=steps,
            batch_size=args.batch,
            precision=precision,
            compile="off",
            sample_every=10**9,
            ckpt_every=10**9,
            **sw,
        )
        started = time.perf_counter()
        trained = Trainer(cfg).fit()
        euler = SamplingSettings("euler", 32, 2.0, source="the ablation's fixed sampler")
        images, labels, spec, _, info = generate_for_eval(out / "checkpoint.pt", args.n, euler, 0, device, None)
        metrics = evaluate(images, labels, spec)
        fid = next(v for k, v in metrics.items() if k.startswith("fid_"))
        cc = next((v for k, v in metrics.items() if k.startswith("class_consistency_")), float("nan"))
        results.append(
            {
                "variant": name,
                "switches": sw,
                "img_per_s": args.batch / step_s,
                "steps": steps,
                "val_loss_ema": trained.val_loss_ema,
                "fid": fid,
                "class_consistency": cc,
                "wall_seconds": time.perf_counter() - started,
                "metrics": metrics,
                **info,
            }
        )
        (root / "ablation.json").write_text(json.dumps(results, indent=2) + "\n")

    print()
    print(
        f"{args.preset} on {args.data}, {args.minutes:g} min of training each ({precision}, batch {args.batch}); "
        f"{args.n} samples, Euler 32 steps, guidance 2; FID in the shipped feature network's space"
    )
    print()
    print("| variant | train img/s | steps | EMA val loss | FID | class consistency |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['variant']} | {r['img_per_s']:.0f} | {r['steps']} | {r['val_loss_ema']:.4f} | {r['fid']:.2f} | "
            f"{r['class_consistency']:.3f} |"
        )


if __name__ == "__main__":
    sys.exit(main())
