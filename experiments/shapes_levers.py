"""Train the quick start's model on `shapes` with some settings changed, then read its samples back.

    python experiments/shapes_levers.py --out /tmp/levers/base --set steps=1750
    python experiments/shapes_levers.py --out /tmp/levers/ln --set steps=1750 --set t_sampling=logit-normal \
        --set t_shift=2.2
    python experiments/shapes_levers.py --out /tmp/levers/large --set steps=1750 --variant size=large
    python experiments/shapes_levers.py --score-only --out /tmp/levers/ln --sample ancestral:64:10:0.3-1
    python experiments/shapes_levers.py --calibrate        # the scores of real images: how strict the reader is

Training is `tinydit train --data shapes` (the default preset, precision and everything else) with each
``--set FIELD=VALUE`` applied to its TrainConfig; runs compared against each other use ``steps`` rather
than ``minutes``, so a busy machine changes their wall time but not what they compute. ``--variant``
trains on a simpler variant of the data (``experiments/shapes_probe.py``'s ``make_variant``: n_colors,
bg, size, jitter). Each ``--sample SAMPLER:STEPS:GUIDANCE[:LO-HI]`` draws ``--n`` class-balanced EMA
samples (seed 0) and prints one JSON line: the strict judge's pass rates (``strict``, per class, and
``colours``, both colours on the palette), the share whose shape ``read_shape`` reads as the one asked for
(chance 0.25), the share with no foreground at all (``empty``) and the share of pixels within 40/255 of a
palette colour.

Five levers that lost were flags of this script up to commit 3f43221 (then ``scripts/shapes_levers.py``):
``--muon``, ``--weight-cap``, ``--self-cond``, ``--low-res`` and ``--route``. Their results stay in
docs/notes/shapes_crosses_sooner.md (sections 18-22); ``git show 3f43221:scripts/shapes_levers.py`` runs them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))


def parse_value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"none": None, "true": True, "false": False}.get(text.lower(), text)


def score(checkpoint: Path, n: int, spec: str, ema: bool = True, seed: int = 0) -> dict:
    import torch

    from tinydit import api
    from tinydit.data.shapes import SHAPES, read_shape
    from tinydit.eval.shape_fit import fit_shapes, strict_scores
    from tinydit.images import to_uint8

    parts = spec.split(":")
    options = {}
    if len(parts) > 3 and parts[3]:
        lo, hi = parts[3].split("-")
        options["cfg_interval"] = (float(lo), float(hi))
    if len(parts) > 4:
        options["eta"] = float(parts[4])
    if spec == "recorded":  # the settings the checkpoint records, as `tinydit sample` with no flags
        res = api.sample(checkpoint, n, ema=ema, seed=seed)
        print(f"{spec}: {res.settings.note}", file=sys.stderr)  # a preset with no record falls back: say to what
    else:
        res = api.sample(
            checkpoint,
            n,
            sampler=parts[0],
            steps=int(parts[1]),
            cfg_scale=float(parts[2]),
            ema=ema,
            seed=seed,
            **options,
        )
    u8 = to_uint8(res.x)  # (N, 3, H, W), as a saved PNG would be
    # A run on some of the classes (`--set classes=cross`) numbers them in its own order: judge by name.
    kinds = torch.tensor([SHAPES.index(res.names[int(c)]) for c in res.labels])
    hits = [read_shape(img)["shape"] == SHAPES[int(k)] for img, k in zip(u8, kinds, strict=True)]
    strict = {k: round(v, 3) for k, v in strict_scores(u8, kinds).items()}
    empty = float((fit_shapes(u8).kind == -1).mean())  # no foreground at all: the background alone
    return {
        "sample": spec,
        "weights": "ema" if ema else "raw",
        "nfe": res.nfe,
        **strict,
        "shape": round(float(np.mean(hits)), 3),
        "empty": round(empty, 3),
        "palette": round(palette_share(u8), 3),
    }


def palette_share(u8) -> float:
    """The share of pixels of uint8 images (N, 3, H, W) within 40/255 (RGB distance) of a palette colour."""
    from tinydit.data.shapes import _PALETTE

    pix = u8.permute(0, 2, 3, 1).reshape(len(u8), -1, 3).float().numpy()
    return float((np.linalg.norm(pix[:, :, None, :] - _PALETTE[None, None], axis=-1).min(-1) < 40).mean())


def calibrate(n: int) -> list[dict]:
    """The scores of real held-out images as they are, with Gaussian noise of std 0.1 (model units, 12.75/255)
    and with random labels: what a perfect generator, a noisy one and one that ignores the class would get."""
    import torch

    from tinydit.data.shapes import SHAPES, ShapesDataset, read_shape
    from tinydit.eval.features import extract, load_feature_net
    from tinydit.eval.shape_fit import on_palette
    from tinydit.images import from_uint8, to_uint8

    test = ShapesDataset(n=n, train=False)
    g = torch.Generator().manual_seed(0)
    x = from_uint8(test.images)  # (N, 3, H, W) in [-1, 1]
    noisy = to_uint8(x + 0.1 * torch.randn(x.shape, generator=g))
    shuffled = torch.randint(len(SHAPES), (n,), generator=g)
    net, _ = load_feature_net("shapes_cnn")
    rows = []
    for name, u8, labels in (
        ("real", test.images, test.labels),
        ("real + noise std 0.1", noisy, test.labels),
        ("real, random labels", test.images, shuffled),
    ):
        hits = [read_shape(img)["shape"] == SHAPES[int(c)] for img, c in zip(u8.numpy(), labels, strict=True)]
        _, pred = extract(net, u8)
        rows.append(
            {
                "images": name,
                "n": n,
                "shape": round(float(np.mean(hits)), 3),
                "colours": round(float(on_palette(u8).mean()), 3),
                "palette": round(palette_share(u8), 3),
                "shapes_cnn": round(float((pred == labels).float().mean()), 3),
            }
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="the run directory")
    p.add_argument("--calibrate", action="store_true", help="score real test images (clean, noisy, mislabelled)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a TrainConfig field")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="train on a variant of shapes: n_colors, bg, size (small|large), jitter (0-1), "
        "small/large (size range LO-HI in px at 32)",
    )
    p.add_argument(
        "--sample",
        action="append",
        default=None,
        metavar="SAMPLER:STEPS:GUIDANCE[:LO-HI[:ETA]]",
        help="or `recorded`: the settings the checkpoint records",
    )
    p.add_argument(
        "--model-set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a DiTConfig field on top of the preset (a preset named `lever` is made for the run)",
    )
    p.add_argument("--sample-seed", type=int, default=0, help="the sampling noise's seed")
    p.add_argument("--n", type=int, default=400, help="samples per --sample (class-balanced)")
    p.add_argument("--score-only", action="store_true", help="score the checkpoint already in --out")
    p.add_argument("--train-only", action="store_true", help="train, and leave the scoring to `tinydit eval`")
    p.add_argument("--weights", choices=("ema", "raw"), default="ema", help="sample with the EMA or the raw weights")
    args = p.parse_args()
    if args.calibrate:
        for row in calibrate(args.n):
            print(json.dumps(row), flush=True)
        return
    if not args.out:
        p.error("--out is required unless --calibrate is given")
    out = Path(args.out)
    fields = {k: parse_value(v) for k, v in (a.split("=", 1) for a in args.set)}
    if not args.score_only:
        variant = {k: parse_value(v) for k, v in (a.split("=", 1) for a in args.variant)}
        if variant:
            from shapes_probe import make_variant

            make_variant(
                variant.get("n_colors"),
                variant.get("bg"),
                variant.get("size"),
                variant.get("jitter", 1.0),
                variant.get("small"),
                variant.get("large"),
            )
        from tinydit.config import TrainConfig
        from tinydit.train import Trainer

        if args.model_set:
            from tinydit.models.presets import MODEL_PRESETS

            base = MODEL_PRESETS["dit"][fields.get("preset", "dit-1.3m")]
            over = {k: parse_value(v) for k, v in (a.split("=", 1) for a in args.model_set)}
            MODEL_PRESETS["dit"]["lever"] = {**base, **over}
            fields["preset"] = "lever"
        cfg = TrainConfig(out=str(out), data="shapes", report=False, **fields)
        result = Trainer(cfg, overwrite=True, progress=False).fit()
        print(
            json.dumps(
                {
                    "out": str(out),
                    "set": fields,
                    "variant": variant,
                    "step": result.step,
                    "train_seconds": round(result.train_seconds),
                    "val_loss_ema": round(result.val_loss_ema, 4),
                }
            ),
            flush=True,
        )
    if fields.get("model") == "mmdit" or args.train_only:
        return  # a text model: `tinydit eval` scores prompt adherence and the strict judge
    for spec in args.sample or ["euler:32:2", "euler:32:4"]:
        row = score(out / "checkpoint.pt", args.n, spec, args.weights == "ema", args.sample_seed)
        print(json.dumps({"out": str(out), **row}), flush=True)


if __name__ == "__main__":
    main()
