"""Validation losses of several runs side by side, at the steps they share (from each metrics.jsonl).

    python scripts/compare_runs.py runs/a runs/b [--every 1000]

Prints one row per run and shared step: the EMA validation loss at even t (the times every run is
validated at) and, where logged, the EMA loss in each of the 10 bins of t (0 = data ... 1 = noise). Runs
are only comparable on the same data and val set.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tinydit.eval.run_report import val_loss_even_t


def val_records(run: Path) -> dict[int, dict]:
    records = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if val_loss_even_t(rec) is not None:
            records[rec["step"]] = rec
    return records


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="run directories")
    p.add_argument("--every", type=int, default=1000, help="show shared steps that are multiples of this")
    args = p.parse_args()
    runs = {str(r): val_records(r) for r in args.runs}
    shared = sorted(set.intersection(*(set(r) for r in runs.values())))
    width = max(len(name) for name in runs)
    print(f"{'step':>6}  {'run':{width}}  val(EMA) at even t, and by t, 0 = data ... 1 = noise")
    for step in (s for s in shared if s % args.every == 0 or s == shared[-1]):
        for name, recs in runs.items():
            bins = " ".join(f"{v:.3f}" for v in recs[step].get("val_loss_ema_by_t", []))
            print(f"{step:6}  {name:{width}}  {val_loss_even_t(recs[step]):.4f}    {bins}")


if __name__ == "__main__":
    main()
