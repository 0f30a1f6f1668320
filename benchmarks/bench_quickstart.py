"""The README's quick start on two trees, alternated: how many training images five minutes hold in each,
start-up included, as a user's command meets it.

    python benchmarks/bench_quickstart.py --base 3390733 [--repeats 2] [--minutes 5] [--cold] [--out DIR]

The base commit is checked out into a temporary git worktree; this checkout is the other tree. Each run is
``python -m tinydit train --data shapes --minutes M --seed R --out DIR`` in a fresh process with the tree's
``src`` first on ``PYTHONPATH``, alternating base, this tree, base, this tree (repeat R trains seed R), so that
drift in the machine's speed falls on both. A run's images are its last step times its batch, read from
its ``metrics.jsonl`` and ``config.json``. ``--cold`` empties this tree's kept compile cache
(``tinydit.compiling.cache_dir``) before its first run, so that the first run pays a cold compilation as a
user's first run on a machine does; the later ones start warm. The last line is
``images_ratio: N.NN``, this tree's median over the base's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def images(run: Path) -> tuple[int, int]:
    """(last step, images trained) of a finished run directory."""
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    batch = json.loads((run / "config.json").read_text())["train"]["batch_size"]
    return max(steps), max(steps) * batch


def one_run(tree: Path, out: Path, minutes: float, seed: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    cmd = [sys.executable, "-m", "tinydit", "train", "--data", "shapes", "--minutes", str(minutes)]
    cmd += ["--seed", str(seed), "--out", str(out)]
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    step, n = images(out)
    config = json.loads((out / "config.json").read_text())
    return {"steps": step, "images": n, "wall_s": round(wall, 1), "compile": config["compile"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the commit to compare this checkout with")
    p.add_argument("--repeats", type=int, default=2, help="runs of each tree (repeat R trains seed R)")
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--cold", action="store_true", help="empty this tree's compile cache before its first run")
    p.add_argument("--out", type=Path, default=None, help="keep the run directories here (default: a temporary one)")
    args = p.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-quickstart-"))
    out.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="bench-quickstart-base-"))
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.base], check=True, capture_output=True
    )
    try:
        if args.cold:
            sys.path.insert(0, str(ROOT / "src"))
            from tinydit.compiling import cache_dir

            shutil.rmtree(cache_dir(), ignore_errors=True)
            print(f"emptied {cache_dir()}")
        rows: dict[str, list[dict]] = {"base": [], "this": []}
        for r in range(args.repeats):
            for name, tree in (("base", base), ("this", ROOT)):
                row = one_run(tree, out / f"{name}_seed{r}", args.minutes, r)
                rows[name].append(row)
                print(
                    f"{name} seed {r}: {row['steps']} steps, {row['images']} images, {row['wall_s']} s in all, "
                    f"compile {row['compile']}",
                    flush=True,
                )
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True)
    med = {k: statistics.median(row["images"] for row in v) for k, v in rows.items()}
    print(f"median images: base {med['base']:.0f}, this tree {med['this']:.0f} (runs in {out})")
    print(f"images_ratio: {med['this'] / med['base']:.2f}")


if __name__ == "__main__":
    main()
