"""What compiling costs at the start of a run and gains per step: `tinydit train` compiled and eager, from an
empty Inductor cache, as a user's first run meets it.

    python benchmarks/bench_compile_start.py [--data shapes] [--batch-size 64 32] [--steps 300] [--precision bf16]
    python benchmarks/bench_compile_start.py --scopes blocks model   # the repeated blocks against the whole model
    python benchmarks/bench_compile_start.py --scopes blocks model --warm   # the same from kept caches

Each row is one `tinydit train --steps N --cooldown 0` process with its own empty ``TORCHINDUCTOR_CACHE_DIR``
(no sample grid, validation or checkpoint before the end, so that no other input shape compiles), read back
from its ``metrics.jsonl``: the seconds to step 50 (imports excluded; compiling happens in the first step)
and the steady rate from step 100 to the last. Runs alternate compiled (each of ``--scopes``, the
``TINYDIT_COMPILE_SCOPE`` of ``tinydit.runtime``) and eager for each batch size, so that drift in the
machine's speed falls on all. The last line says how many steps a budget of
``--minutes`` holds each way at these rates: compiling pays when the faster steps win its start back. A
real run holds fewer either way: its sample grids and validation batches take time, and compiled, each of
their input shapes compiles once more.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from tinydit.runtime import COMPILE_SCOPES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from expectations import this_machine  # noqa: E402  (the machine as the README's tables name it)

NEVER = 10**8  # a step no run here reaches: no grid, validation or checkpoint before the end


def one_run(
    root: Path, data: str, batch: int, scope: str | None, steps: int, precision: str, cache: Path | None = None
) -> dict:
    """Train once in a fresh process, compiling ``scope`` (None: eager) into an empty cache, or into ``cache``
    where given (a warm start once a run has filled it); the start-up and steady rate from its metrics."""
    out = root / f"run{len(list(root.iterdir()))}"
    cache = cache or Path(str(out) + ".inductor")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "TINYDIT_COMPILE_SCOPE": scope or ""}
    on = "on" if scope else "off"
    flags = (
        f"train --data {data} --steps {steps} --cooldown 0 --batch-size {batch} --compile {on} --precision {precision}"
        f" --no-report --no-progress --log-every 50 --sample-every {NEVER} "
        f"--val-every {NEVER} --ckpt-every {NEVER}"
    )
    cmd = [sys.executable, "-m", "tinydit", *flags.split(), "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    seconds = {r["step"]: r["train_seconds"] for r in rows if "img_per_s" in r}
    last = max(seconds)
    rate = (last - 100) / (seconds[last] - seconds[100])
    return {"batch": batch, "scope": scope, "to_step_50": seconds[50], "steps_per_s": rate}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="shapes")
    p.add_argument("--batch-size", type=int, nargs="+", default=[64])
    p.add_argument("--steps", type=int, default=300, help="steps per run (at least 200)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--precision", default="auto")
    p.add_argument("--minutes", type=float, default=5.0, help="the budget the last lines weigh compiling for")
    p.add_argument("--warm", action="store_true", help="each compiled mode starts from a cache a first run filled")
    p.add_argument(
        "--scopes", nargs="+", default=["blocks"], choices=COMPILE_SCOPES, help="what the compiled runs compile"
    )
    args = p.parse_args()
    if args.steps < 200:
        p.error("--steps must be at least 200: the steady rate is read from step 100 on")
    print(f"{this_machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| batch | compiled | seconds to step 50 | steps/s after step 100 | images/s |")
    modes = [*args.scopes, None]  # None: eager
    print("|---|---|---|---|---|")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        caches = {scope: Path(tmp) / f"{scope}.kept" for scope in args.scopes} if args.warm else {}
        if args.warm:  # one untimed run per mode and batch fills its cache
            for batch in args.batch_size:
                for scope in args.scopes:
                    one_run(Path(tmp), args.data, batch, scope, 200, args.precision, caches[scope])
        for _ in range(args.repeats):
            for batch in args.batch_size:
                for scope in modes:
                    r = one_run(Path(tmp), args.data, batch, scope, args.steps, args.precision, caches.get(scope))
                    results.append(r)
                    rate = r["steps_per_s"]
                    print(f"| {batch} | {scope or 'no'} | {r['to_step_50']:.1f} | {rate:.2f} | {rate * batch:.0f} |")
    budget = args.minutes * 60
    for batch in args.batch_size:
        held = {}
        for scope in modes:
            rs = [r for r in results if r["batch"] == batch and r["scope"] == scope]
            start = statistics.median(r["to_step_50"] for r in rs)  # medians over the repeats
            rate = statistics.median(r["steps_per_s"] for r in rs)
            held[scope] = 50 + max(budget - start, 0) * rate
        each = ", ".join(f"{held[scope]:.0f} {f'compiling the {scope}' if scope else 'eager'}" for scope in modes)
        print(f"batch {batch}, {args.minutes:g} minutes: about {each} (steps)")


if __name__ == "__main__":
    main()
