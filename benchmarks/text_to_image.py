"""Text-to-image on shapes: MMDiT against a DiT that sees the caption only through its pooled vector,
at the same parameter count and the same CPU-time budget, scored by prompt adherence.

    python benchmarks/text_to_image.py --minutes 20 --out runs/t2i
    python benchmarks/text_to_image.py --score-only --out runs/t2i   # re-score, with the per-shape reading

1. Both models are built for the shapes captions, with the same text encoder and width: mmdit-2.3m
   (2 joint + 2 single-stream blocks) and dit-1.9m with --cond text hold exactly the same number of
   parameters (2,318,640; tests/test_mmdit.py). The script prints both counts.
2. Their training throughputs are measured in one run, interleaved (bench_train.race); each model then
   gets the number of steps it completes in ``--minutes`` at that rate. Training for a fixed number of
   steps keeps the result exact and repeatable even if the machine is busy while the models train
   (as in benchmarks/ablation.py). The measured rates are kept in OUT/rates.json and reused.
3. Both train on the shapes captions without the held-out combinations (``--holdout``, by default every
   "red triangle" and every "blue circle"), then each EMA model draws the same prompts from the same
   noise: ``--n-seen`` images over the seen combinations, ``--n-held-out`` over the held-out ones
   (``--sampler``, Euler by default, ``--steps`` steps, guidance ``--cfg``), scored with the shapes pixel reader
   (tinydit.eval.adherence): accuracy per attribute and for all three at once.

Writes OUT/text_to_image.json and OUT/text_to_image.md (machine, command, parameter counts, steps,
losses, the adherence table), and prints the table. Each run directory keeps its checkpoint and a
sample grid (one row per fixed prompt, the last two held out), and ``tinydit eval --checkpoint
OUT/<model>/checkpoint.pt`` gives FID and the same adherence scores over every combination.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import sys
import time
from pathlib import Path

from bench_train import Workload, header, race

from tinydit.checkpoints.checkpoint import load_model
from tinydit.config import TrainConfig
from tinydit.data.text import parse_phrases, tokenizer_of
from tinydit.eval.adherence import GROUPS, confusion_table, markdown_table, measure
from tinydit.flow.settings import SamplingSettings
from tinydit.models.dit import count_params
from tinydit.runtime import resolve_device, resolve_precision
from tinydit.train import Trainer
from tinydit.train.resolve import SHAPES_HOLDOUT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20.0, help="training budget per model")
    parser.add_argument("--mmdit-preset", default="mmdit-2.3m")
    parser.add_argument("--dit-preset", default="dit-1.9m", help="trained with --cond text (pooled caption only)")
    parser.add_argument("--holdout", default=SHAPES_HOLDOUT, help="caption phrases never trained on")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=TrainConfig.lr, help="peak learning rate of both models")
    parser.add_argument("--limit", type=int, default=None, help="train on the first N shapes images only")
    parser.add_argument(
        "--n-seen", type=int, default=420, help="samples spread over the seen combinations (110 by default)"
    )
    parser.add_argument(
        "--n-held-out", type=int, default=140, help="samples spread over the held-out combinations (10 by default)"
    )
    parser.add_argument("--sampler", default="euler", help="euler | heun | midpoint | dopri5 | ancestral")
    parser.add_argument("--steps", type=int, default=32, help="sampler steps per sample")
    parser.add_argument("--cfg", type=float, default=2.0, help="guidance scale (the empty caption is unconditional)")
    parser.add_argument(
        "--cfg-interval",
        type=float,
        nargs=2,
        default=None,
        metavar=("LO", "HI"),
        help="guide only for LO <= t <= HI (1 = noise); default: everywhere",
    )
    parser.add_argument("--precision", default="auto")
    parser.add_argument(
        "--t-sampling",
        default=None,
        choices=["uniform", "logit-normal"],
        help="training times for both models (default: the trainer's for text runs, logit-normal)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/t2i")
    parser.add_argument(
        "--score-only",
        action="store_true",
        help="train nothing: score the checkpoints already in OUT/<model>/ and print how the "
        "pixel reader reads each prompted shape",
    )
    parser.add_argument(
        "--cfgs",
        default=None,
        help="with --score-only: comma-separated guidance scales to score, each (default: --cfg)",
    )
    args = parser.parse_args()
    device = resolve_device("auto")
    precision = resolve_precision(args.precision, device)
    header(args, device)
    if args.score_only:
        return score_only(args, device)
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    variants = {
        "mmdit": dict(model="mmdit", preset=args.mmdit_preset),
        "dit-pooled": dict(model="dit", preset=args.dit_preset, cond="text"),
    }

    def train_config(name: str, steps: int) -> TrainConfig:
        return TrainConfig(
            out=str(root / name),
            data="shapes",
            steps=steps,
            batch_size=args.batch,
            lr=args.lr,
            limit=args.limit,
            holdout=args.holdout,
            seed=args.seed,
            precision=precision,
            compile="off",
            t_sampling=args.t_sampling,
            sample_every=10**9,
            ckpt_every=500,
            **variants[name],
        )

    # 1. Build both (set-up only: data, tokenizer, model) and report their sizes.
    trainers = {name: Trainer(train_config(name, 1), progress=False) for name in variants}
    params = {name: count_params(t.model) for name, t in trainers.items()}
    for name, t in trainers.items():
        print(
            f"{name}: {t.cfg.preset}, {params[name]:,} parameters ({t.model_config.depth} blocks"
            f"{f' + {t.model_config.single_blocks} single-stream' if name == 'mmdit' else ''}, text encoder of "
            f"{t.model_config.text_depth} layers)",
            flush=True,
        )

    # 2. Throughput, interleaved, on real caption batches (reused from OUT/rates.json when present).
    rates_file = root / "rates.json"
    rates = json.loads(rates_file.read_text()) if rates_file.exists() else {}
    key = {name: f"{t.cfg.preset}/{args.batch}/{precision}" for name, t in trainers.items()}
    if not all(key[name] in rates for name in variants):
        workloads = []
        for t in trainers.values():
            model = copy.deepcopy(t.model)
            w = Workload(t.cfg.model, model, model, t.model_config, args.batch, device, precision)
            w.y = t.train_tokens[: args.batch].to(device)  # caption ids, not class labels
            workloads.append(w)
        rates.update({key[name]: s for name, s in zip(variants, race(workloads, steps=2, repeats=5), strict=True)})
        rates_file.write_text(json.dumps(rates, indent=2) + "\n")
        del workloads
    for t in trainers.values():
        t.close()  # a set-up trainer holds its run directory; the runs below train there
    del trainers

    # 3. Train each for the steps it completes in the budget, then score it on the same prompts and noise.
    holdout = parse_phrases(args.holdout)
    results = {}
    for name in variants:
        step_s = rates[key[name]]
        steps = max(1, int(args.minutes * 60 / step_s))
        print(f"{name}: {args.batch / step_s:.0f} img/s -> {steps} steps in {args.minutes:g} min", flush=True)
        started = time.perf_counter()
        trainer = Trainer(train_config(name, steps), progress=False)
        trained = trainer.fit()
        model, _ = load_model(trained.checkpoint, map_location=device)  # the EMA weights
        sampled = time.perf_counter()
        scores = measure(
            model,
            trainer.data.tokenizer,
            holdout,
            args.n_seen,
            args.n_held_out,
            SamplingSettings(
                args.sampler, args.steps, args.cfg, cfg_interval=args.cfg_interval, source="this benchmark"
            ),
            seed=args.seed,
        )
        results[name] = {
            "preset": trainer.cfg.preset,
            "params": params[name],
            "img_per_s": args.batch / step_s,
            "steps": steps,
            "train_seconds": trained.train_seconds,
            "val_loss_ema": trained.val_loss_ema,
            "sample_seconds": time.perf_counter() - sampled,
            "wall_seconds": time.perf_counter() - started,
            "samples": str(trained.samples),
            "adherence": scores,
        }
        (root / "text_to_image.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2) + "\n")

    lines = [
        f"# Text-to-image on shapes: MMDiT vs a DiT conditioned on the pooled caption ({datetime.date.today()})",
        "",
        "```",
        f"python benchmarks/text_to_image.py {' '.join(sys.argv[1:])}".rstrip(),
        "```",
        "",
        f"{args.minutes:g} min of training each ({precision}, batch {args.batch}, lr {args.lr:g}); held out of "
        f"training: {', '.join(holdout) or 'nothing'}. Samples: EMA weights, {args.sampler} {args.steps} steps, "
        f"guidance {args.cfg:g}, the same prompts and noise for both models; read back with "
        "tinydit.data.shapes.read_shape.",
        "",
        "| model | preset | parameters | train img/s | steps | EMA val loss |",
        "|---|---|---|---|---|---|",
        *(
            f"| {name} | {r['preset']} | {r['params']:,} | {r['img_per_s']:.0f} | {r['steps']} | "
            f"{r['val_loss_ema']:.4f} |"
            for name, r in results.items()
        ),
        "",
        "Prompt adherence (fraction of samples whose attribute reads back as prompted):",
        "",
        markdown_table({name: r["adherence"] for name, r in results.items()}),
        "",
        "Sample grids (one row per prompt; the last two rows are held-out combinations): "
        + ", ".join(f"{name}: `{r['samples']}`" for name, r in results.items()),
    ]
    (root / "text_to_image.md").write_text("\n".join(lines) + "\n")
    print()
    print("\n".join(lines))
    missing = [g for g in GROUPS if holdout and any(g not in r["adherence"] for r in results.values())]
    if missing:
        print(f"note: no samples for {', '.join(missing)}", file=sys.stderr)


def score_only(args: argparse.Namespace, device) -> None:
    """Score every OUT/<name>/checkpoint.pt (EMA weights) on the benchmark's prompts and noise, with the
    per-shape reading (adherence.shape_confusion) that the accuracies alone hide."""
    root = Path(args.out)
    runs = sorted(p.parent for p in root.glob("*/checkpoint.pt"))
    if not runs:
        sys.exit(f"no OUT/<model>/checkpoint.pt under {root}: train first (without --score-only)")
    cfgs = [float(c) for c in args.cfgs.split(",")] if args.cfgs else [args.cfg]
    results, lines, saved = {}, [], {}
    for run in runs:
        model, state = load_model(run / "checkpoint.pt", map_location=device)
        tokenizer = tokenizer_of(state)
        if tokenizer is None:
            print(f"{run}: a class-conditional checkpoint, skipped", file=sys.stderr)
            continue
        holdout = parse_phrases(state.holdout or "")  # as the run was trained
        for cfg_scale in cfgs:
            name = run.name if len(cfgs) == 1 else f"{run.name}, guidance {cfg_scale:g}"
            scores, table = measure(
                model,
                tokenizer,
                holdout,
                args.n_seen,
                args.n_held_out,
                SamplingSettings(
                    args.sampler, args.steps, cfg_scale, cfg_interval=args.cfg_interval, source="this benchmark"
                ),
                seed=args.seed,
                with_confusion=True,
            )
            results[name] = scores
            interval = "" if args.cfg_interval is None else "[{:g},{:g}]".format(*args.cfg_interval)
            saved[f"{run.name}/{args.sampler}{args.steps}/cfg{cfg_scale:g}{interval}"] = {
                "scores": scores,
                "shape_confusion": table,
            }
            lines += [
                f"{name} (step {state.step}): how each prompted shape reads back",
                "",
                confusion_table(table),
                "",
            ]
    (root / "adherence.json").write_text(json.dumps(saved, indent=2) + "\n")
    print()
    print(markdown_table(results))
    print()
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
