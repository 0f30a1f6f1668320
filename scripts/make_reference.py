"""Make a reference model for the package (``tinydit sample --pretrained NAME``) from a trained run.

    tinydit train --data shapes --minutes 5 --out runs/shapes            # the documented command, seed 0
    python scripts/make_reference.py shapes runs/shapes/checkpoint.pt \
        --about "Trained with ... on a 2-core ... CPU, torch ..., DATE"

It exports the run's EMA weights as a pretrained folder in bfloat16, measures it with ``tinydit eval``
(``--n`` samples, the recorded sampler settings; the card shows these numbers), exports it again with
those numbers on its card (``overwrite``: the same folder), copies the folder into
``src/tinydit/reference/NAME`` (no tinydit command writes a shipped model: this script alone does) and
records a small check in its config.json: the check of ``tinydit.eval.check`` on ``--check-n`` samples
drawn in fp32, which ``tests/test_reference.py`` draws again, so that the card, the weights and the code
cannot drift apart. Class models of shapes and Fashion-MNIST, text models of shapes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from tinydit import api
from tinydit.checkpoints.pretrained import CARD, CONFIG, REFERENCE, WEIGHTS, model_card, parameter_count
from tinydit.files import atomic_write


def check(folder: Path, n: int, steps: int | None = None) -> dict:
    """What tests/test_reference.py measures again: ``n`` fp32 evaluation samples (seed 0) of the folder
    with its recorded sampler (``steps`` of it, if given: a cheaper check), scored without reference
    images (``tinydit.eval.check.check_model``)."""
    from tinydit.eval.check import check_model

    scores = check_model(folder, n, seed=0, steps=steps)
    return {"n": n, "seed": 0, "precision": "fp32", "steps": steps, **{k: round(v, 4) for k, v in scores.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("name", help="the reference model's name (shapes, fashion-mnist, shapes-text)")
    p.add_argument("checkpoint", nargs="?", help="the trained run's checkpoint.pt (not with --check-only)")
    p.add_argument("--about", help="the command, seed, machine, torch version and date it was trained")
    p.add_argument("--n", type=int, default=1000, help="samples for the card's metrics")
    p.add_argument("--check-n", type=int, default=200, help="samples of the check the tests repeat")
    p.add_argument(
        "--check-steps", type=int, default=None, help="sampler steps of the check (default: the recorded settings' own)"
    )
    p.add_argument("--check-only", action="store_true", help="record the check again, keep the folder as it is")
    p.add_argument(
        "--card-only",
        action="store_true",
        help="write the model card (README.md) again from config.json, after a change to its template",
    )
    p.add_argument("--metrics", default=None, help="an evaluation of this export already made (metrics.json)")
    args = p.parse_args()
    if not (args.check_only or args.card_only) and not (args.checkpoint and args.about):
        p.error("give the run's checkpoint.pt and --about (or --check-only, or --card-only)")
    folder = REFERENCE / args.name
    if args.card_only:
        return _write_card(folder)
    with tempfile.TemporaryDirectory() as tmp:
        if args.check_only:
            return _record_check(folder, args.check_n, args.check_steps)
        staged = api.export(args.checkpoint, "safetensors", Path(tmp) / args.name, dtype="bfloat16")
        metrics = args.metrics
        if metrics is None:
            api.evaluate(
                staged,
                n=args.n,
                seed=0,
                out=Path(tmp) / "eval",
                command=(f"tinydit eval --pretrained {args.name} --n {args.n} --seed 0 --out eval/{args.name}"),
            )
            metrics = Path(tmp) / "eval" / "metrics.json"
        card = dict(metrics=metrics, about=args.about, overwrite=True)
        _install(api.export(args.checkpoint, "safetensors", staged, dtype="bfloat16", **card), folder)
    _record_check(folder, args.check_n, args.check_steps)


def _install(staged: Path, folder: Path) -> None:
    """The staged export copied into the package, file by file, each written whole (``atomic_write``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in (WEIGHTS, CONFIG, CARD):
        with atomic_write(folder / name) as f:
            f.write((staged / name).read_bytes())


def _write_card(folder: Path) -> None:
    """The card written again from the folder's config.json and its weights' parameter count."""
    n_params = parameter_count(folder / WEIGHTS)
    (folder / CARD).write_text(model_card(json.loads((folder / CONFIG).read_text()), n_params))
    print(folder / CARD)


def _record_check(folder: Path, n: int, steps: int | None) -> None:
    config = json.loads((folder / CONFIG).read_text())
    config["check"] = check(folder, n, steps)
    (folder / CONFIG).write_text(json.dumps(config, indent=1) + "\n")
    print(json.dumps({"folder": str(folder), "check": config["check"]}))


if __name__ == "__main__":
    main()
