"""Fewer FLOPs per image: each data set's own preset (dit-1.4m on shapes, dit-1.9m on Fashion-MNIST) against
cheaper trunks, by training FLOPs, by images per CPU-second and by quality at equal wall time.

    python experiments/cheaper_images.py flops > flops.jsonl          # FLOPs of the real training step
    python experiments/cheaper_images.py speed --rounds 5 --steps 10  # images/s, interleaved, eager and compiled
    python experiments/cheaper_images.py train --candidate p8 --seed 0 --minutes 3.12 --out DIR --eval-every 300
    python experiments/cheaper_images.py score --out DIR --sample ancestral:64:10:0.6-1:1.0 --n 1000
    python experiments/cheaper_images.py plot DIR ... --flops flops.jsonl --png PLOT.png
    python experiments/cheaper_images.py --data fashion-mnist train --candidate narrow --minutes 5 --out DIR ...

The candidates change a few of the baseline's fields (``CANDIDATES``): ``p8``, a coarser token grid (4 x 4
tokens: patch 8 on 32 x 32 shapes, patch 7 on 28 x 28 Fashion-MNIST) with a conv stem and head that let
neighbouring patches agree on an edge; ``narrow``, a trunk of width 96 instead of 128; and ``p8-conv2``, a
conv-heavier hybrid, the 4 x 4 grid with two 3 x 3 convolutions of 32 features in the stem and in the head
(U-ViT's conv head and the pixel-level layers of hourglass designs doing the fine work around a small
transformer). Each is registered as a preset named ``cand-NAME`` for the process that trains it and records
its baseline's sampler settings; its checkpoint holds its whole model config, so `tinydit sample`, `tinydit
eval` and ``score`` read it back anywhere. ``score`` is the strict shapes judge (experiments/shapes_levers.py);
``plot`` draws each run's evaluations during training (``--eval-every``) against its training FLOPs.

FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` around ``Trainer.train_step`` itself
(forward, backward, the alignment's projector; the optimizer and the EMA hold no matmuls), so they do not
depend on the machine. The alignment's encoder runs once per training image and way round, then its targets
are kept (``tinydit.train.repa.TargetCache``): the step's FLOPs are given with the targets kept, the encoder's
per image beside them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

# the baseline of each data set: its own preset (tinydit.data.registry)
BASES = {"shapes": "dit-1.4m", "fashion-mnist": "dit-1.9m"}
# the candidates: the baseline's fields with these changed; `grid` 4 is a 4 x 4 token grid, patch 8 on
# 32 x 32 shapes and patch 7 on 28 x 28 Fashion-MNIST (whose preset has no conv stem or head: they are added)
CANDIDATES: dict[str, dict] = {
    "p8": dict(grid=4, stem="conv", head="conv"),
    "narrow": dict(dim=96),
    "p8-conv2": dict(grid=4, stem="conv", head="conv", conv_depth=2, conv_channels=32),
}


def preset_name(candidate: str, data: str = "shapes") -> str:
    return BASES[data] if candidate == "base" else f"cand-{candidate}"


def candidate_of(preset: str) -> str:
    return preset.removeprefix("cand-") if preset.startswith("cand-") else "base"


def register(data: str = "shapes") -> None:
    """Make every candidate a preset of this process, recording its baseline's sampler settings on ``data``."""
    from tinydit.data.registry import DATASETS
    from tinydit.flow.settings import read_sampling_records
    from tinydit.models.presets import MODEL_PRESETS

    table, records, size = MODEL_PRESETS["dit"], read_sampling_records(), DATASETS[data].img_size
    base = BASES[data]
    for name, fields in CANDIDATES.items():
        fields = dict(fields)
        if "grid" in fields:
            fields["patch_size"] = size // fields.pop("grid")
        table[preset_name(name, data)] = {**table[base], **fields}
        records[(data, preset_name(name, data), "class")] = records[(data, base, "class")]


def trainer(candidate: str, out: str, data: str = "shapes", **fields):
    from tinydit.config import TrainConfig
    from tinydit.train import Trainer

    # bf16 pinned, so that the precision probe cannot choose differently between runs
    cfg = TrainConfig(data=data, preset=preset_name(candidate, data), precision="bf16", out=out, **fields)
    return Trainer(cfg, overwrite=True, progress=False)


def count_flops(candidate: str, data: str = "shapes") -> dict:
    from torch.utils.flop_counter import FlopCounterMode

    from tinydit.compiling import unwrap
    from tinydit.models.dit import count_params

    with tempfile.TemporaryDirectory() as out:
        tr = trainer(candidate, out, data, steps=10**6, compile="off", report=False)
        model = unwrap(tr.run.model)
        c = model.config
        with tr.run.kernel():
            tr.run.model.train()
            tr.train_step()  # the first step computes its images' alignment targets, as every first epoch does
            with FlopCounterMode(display=False) as counter:
                tr.train_step()
            step = counter.get_total_flops()
            x = torch.zeros(tr.batch_size, c.in_channels, c.img_size, c.img_size)
            encoder = 0  # a run that does not align has no encoder
            if tr.run.alignment is not None:
                with FlopCounterMode(display=False) as counter, torch.no_grad():
                    tr.run.alignment.target(x)
                encoder = counter.get_total_flops()
            with FlopCounterMode(display=False) as counter, torch.no_grad():
                model(x[:1], torch.rand(1), torch.zeros(1, dtype=torch.long))
            forward = counter.get_total_flops()
    return {
        "candidate": candidate,
        "data": data,
        "preset": preset_name(candidate, data),
        "params": count_params(model),
        "tokens": model.config.n_tokens,
        "batch": tr.batch_size,
        "step_gflop_kept": round((step - encoder) / 1e9, 3),
        "encoder_mflop_per_image": round(encoder / tr.batch_size / 1e6, 1),
        "sampling_forward_mflop": round(forward / 1e6, 2),
    }


def speed(rounds: int, steps: int, candidates: list[str], data: str = "shapes") -> list[dict]:
    """Images per second of each candidate's training step, the rounds interleaved (A, B, C, A, B, C, ...) so
    that the machine's drift hits all alike; targets kept, as after a run's first epoch."""
    from bench_step_parts import fill_targets

    rows = []
    for compiled in ("off", "on"):
        with tempfile.TemporaryDirectory() as out:
            trainers = {
                c: trainer(c, f"{out}/{c}", data, steps=10**6, compile=compiled, report=False) for c in candidates
            }
            for tr in trainers.values():
                with tr.run.kernel():
                    tr.run.model.train()
                    for _ in range(5):  # warm-up: compiling, the kernels' probes
                        tr.train_step()
                    if tr.run.alignment is not None:
                        fill_targets(tr)
            times = {c: [] for c in candidates}
            for _ in range(rounds):
                for c, tr in trainers.items():
                    with tr.run.kernel():
                        start = time.perf_counter()
                        for _ in range(steps):
                            tr.train_step()
                        times[c].append((time.perf_counter() - start) / steps)
            base = statistics.median(times[candidates[0]])
            for c, tr in trainers.items():
                med = statistics.median(times[c])
                rows.append(
                    {
                        "candidate": c,
                        "compile": compiled,
                        "ms_per_step": round(med * 1e3, 1),
                        "images_per_s": round(tr.batch_size / med),
                        "vs_first": round(base / med, 2),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    return rows


def train(args) -> None:
    fields = dict(seed=args.seed, compile=args.compile, report=False)
    if args.minutes:
        fields["minutes"] = args.minutes
    if args.steps:
        fields.update(steps=args.steps, cooldown=args.cooldown)
    if args.eval_every:
        fields.update(eval_every=args.eval_every, eval_n=args.eval_n)
    tr = trainer(args.candidate, args.out, args.data, **fields)
    result = tr.fit()
    print(
        json.dumps(
            {
                "out": args.out,
                "candidate": args.candidate,
                "seed": args.seed,
                "step": result.step,
                "train_seconds": round(result.train_seconds, 1),
                "val_loss_ema": round(result.val_loss_ema, 4),
            }
        ),
        flush=True,
    )


def run_flops(steps: int, flops: dict, images: int = 20_000) -> float:
    """Training FLOPs of a run after ``steps`` steps: the steps with targets kept, plus the encoder on every
    image seen, up to each training image both ways round (an upper bound: the second epoch's random flips
    repeat some)."""
    seen = min(steps * flops["batch"], 2 * images)
    return steps * flops["step_gflop_kept"] * 1e9 + seen * flops["encoder_mflop_per_image"] * 1e6


# the score each data set's plot shows, from the evaluations during training
METRICS = {
    "shapes": ("eval/shape_strict", "strict judge (shape_strict)"),
    "fashion-mnist": ("eval/fid_fmnist_cnn", "fid_fmnist_cnn (lower is better)"),
}


def candidate_of_run(run: Path) -> str:
    return candidate_of(json.loads((run / "config.json").read_text())["train"]["preset"])


def curves(runs: list[Path], flops: dict[str, dict], data: str) -> dict[str, list[tuple[float, float, int]]]:
    """run directory -> [(training FLOPs, score, step)] from its evaluations during training."""
    key, out = METRICS[data][0], {}
    for run in runs:
        table = flops[candidate_of_run(run)]
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        out[str(run)] = [(run_flops(r["step"], table), r[key], r["step"]) for r in rows if key in r]
    return out


# the record's shapes runs from this day on ran today's quick start (dit-1.4m, aligned, kept targets)
RECORD_SINCE = "2026-12-06"


def plot(runs: list[Path], flops: dict[str, dict], png: Path, title: str, data: str, record: Path | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    colours = dict(zip(["base", *CANDIDATES], ("black", "tab:blue", "tab:orange", "tab:green"), strict=True))
    labelled = set()
    for run, points in curves(runs, flops, data).items():
        candidate = candidate_of_run(Path(run))
        xs, ys = [p[0] / 1e12 for p in points], [p[1] for p in points]
        name = flops[candidate]["preset"].removeprefix("cand-")
        label = None if candidate in labelled else f"{name} ({flops[candidate]['step_gflop_kept']:.1f} GFLOP/step)"
        labelled.add(candidate)
        ax.plot(xs, ys, marker="o", ms=3, color=colours[candidate], label=label, alpha=0.85)
    if record is not None and data == "shapes":  # the baseline's own quick starts: the end of each run
        runs_ = [
            r for r in json.loads(record.read_text())["runs"] if r["data"] == "shapes" and r["date"] >= RECORD_SINCE
        ]
        xs = [run_flops(r["steps"], flops["base"]) / 1e12 for r in runs_ if r["scores"]]
        ys = [r["scores"]["shape_strict"] for r in runs_ if r["scores"]]
        ax.scatter(xs, ys, marker="x", color="black", s=22, label=f"dit-1.4m, ends of the record's runs ({len(xs)})")
    if data == "shapes":
        ax.axhline(0.9, color="grey", lw=0.8, ls="--")
        ax.set_ylim(0, 1)
    else:
        ax.set_yscale("log")
    ax.set_xlabel("training TFLOP (torch.utils.flop_counter on the trainer's own step)")
    ax.set_ylabel(METRICS[data][1])
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower right" if data == "shapes" else "upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    p.add_argument("--data", default="shapes", choices=list(BASES))
    sub.add_parser("flops", help="FLOPs of each candidate's training step and sampling forward pass")
    s = sub.add_parser("speed", help="images/s of each candidate's training step, interleaved")
    s.add_argument("--rounds", type=int, default=5)
    s.add_argument("--steps", type=int, default=10, help="steps per timing")
    s.add_argument("--candidates", default=",".join(["base", *CANDIDATES]))
    t = sub.add_parser("train", help="train one candidate on shapes")
    t.add_argument("--candidate", choices=["base", *CANDIDATES], required=True)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--minutes", type=float)
    t.add_argument("--steps", type=int)
    t.add_argument("--cooldown", type=int, default=0, help="with --steps: the learning rate's fall, in steps")
    t.add_argument("--compile", default="on", choices=("on", "off", "auto"))
    t.add_argument("--eval-every", type=int, default=0, help="strict-judge evaluations during the run (0: none)")
    t.add_argument("--eval-n", type=int, default=200)
    t.add_argument("--out", required=True)
    c = sub.add_parser("score", help="the strict judge on a run's EMA samples (experiments/shapes_levers.py)")
    c.add_argument("--out", required=True)
    c.add_argument("--sample", action="append", required=True, metavar="SAMPLER:STEPS:GUIDANCE[:LO-HI[:ETA]]")
    c.add_argument("--n", type=int, default=1000)
    c.add_argument("--sample-seed", type=int, default=0)
    g = sub.add_parser("plot", help="strict against training FLOPs, from runs' evaluations during training")
    g.add_argument("runs", nargs="+", type=Path)
    g.add_argument("--flops", type=Path, required=True, help="the JSON lines `flops` printed")
    g.add_argument("--png", type=Path, required=True)
    g.add_argument("--title", default="the score against training FLOPs")
    g.add_argument("--record", type=Path, help="docs/expectations.json: also the baseline's recorded shapes runs")
    args = p.parse_args()
    if args.command == "plot":
        table = {row["candidate"]: row for row in map(json.loads, args.flops.read_text().splitlines())}
        for run, points in curves(args.runs, table, args.data).items():
            print(run, [(round(f / 1e12, 1), round(s, 3), n) for f, s, n in points])
        plot(args.runs, table, args.png, args.title, args.data, args.record)
        return
    register(args.data)
    if args.command == "flops":
        for name in ["base", *CANDIDATES]:
            print(json.dumps(count_flops(name, args.data)), flush=True)
    elif args.command == "speed":
        speed(args.rounds, args.steps, args.candidates.split(","), args.data)
    elif args.command == "train":
        train(args)
    else:
        from shapes_levers import score

        for spec in args.sample:
            row = score(Path(args.out) / "checkpoint.pt", args.n, spec, seed=args.sample_seed)
            print(json.dumps({"out": args.out, **row}), flush=True)


if __name__ == "__main__":
    main()
