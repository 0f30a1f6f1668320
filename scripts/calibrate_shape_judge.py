"""Calibrate the strict shapes judge (tinydit.eval.shape_fit) on real renders and on failures made on purpose.

    python scripts/calibrate_shape_judge.py --n 2000 --figure docs/shape_judge.png

Prints one markdown row per case (the share that passes, per asked kind) and draws a figure of examples,
each labelled with the kind asked for, the best fit, its IoU and the verdict. The cases:

* real held-out renders, as they are and with Gaussian pixel noise of std 25/255;
* the same renders with wrong labels (every other kind in turn);
* a triangle drawn as a thin "fir tree" (as tall, 0.45 as wide), or as a "Y" of three strokes;
* a cross whose 4x4 tiles are flipped with probability 0.3 (the speckle of a patch model);
* a clean outline painted half in a third colour (a shape patched together from two);
* a Gaussian blur of std 3 px (the judge fits outlines: a blur that keeps a clean outline can pass).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_shape_fit import paint, speckle, thin_triangle, two_colour, y_shape  # noqa: E402  (the tests' makers of failures)

from tinydit.data.shapes import COLORS, SHAPES, ShapesDataset, shape_coverage  # noqa: E402
from tinydit.eval.shape_fit import fit_shapes  # noqa: E402
from tinydit.images import from_uint8, to_uint8  # noqa: E402


def made_failures(attrs: list[dict], rng: np.random.Generator) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Images (N, 3, H, W) and the labels they were asked for, per failure, at the held-out images' colours,
    sizes and places."""
    from torchvision.transforms.functional import gaussian_blur

    tri, cross = SHAPES.index("triangle"), SHAPES.index("cross")
    out: dict[str, list] = {
        "thin triangle": [],
        "Y for a triangle": [],
        "speckled cross": [],
        "two colours in one shape": [],
        "blur std 3 px": [],
    }
    labels = {"thin triangle": tri, "Y for a triangle": tri, "speckled cross": cross}
    blur_labels = []
    for a in attrs:
        size, cx, cy = a["size_px"], a["cx"], a["cy"]
        half = size / 2
        shift = (int(round(cx - 16)), int(round(cy - 16)))
        colours = (a["color"], a["background"])
        out["thin triangle"].append(paint(np.roll(thin_triangle(half=half), shift[::-1], (0, 1)), *colours))
        out["Y for a triangle"].append(paint(np.roll(y_shape(half=half), shift[::-1], (0, 1)), *colours))
        cov = shape_coverage(cross, np.array([size]), np.array([cx]), np.array([cy]), 32)[0]
        out["speckled cross"].append(paint(speckle(cov, rng), a["color"], a["background"]))
        kind = SHAPES.index(a["shape"])
        cov = shape_coverage(kind, np.array([size]), np.array([cx]), np.array([cy]), 32)[0]
        others = [c for c in COLORS if c not in (a["color"], a["background"])]
        out["two colours in one shape"].append(
            np.roll(two_colour(np.roll(cov, -shift[0], 1), a["color"], others[0], a["background"]), shift[0], 2)
        )
        sharp = paint(
            shape_coverage(kind, np.array([size]), np.array([cx]), np.array([cy]), 32)[0], a["color"], a["background"]
        )
        blurred = gaussian_blur(torch.from_numpy(sharp).float()[None], kernel_size=15, sigma=3.0)[0]
        out["blur std 3 px"].append(blurred.round().clamp(0, 255).to(torch.uint8).numpy())
        blur_labels.append(kind)
    result = {
        k: (np.stack(v), np.full(len(v), labels[k]) if k in labels else np.array(blur_labels)) for k, v in out.items()
    }
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2000, help="held-out images per case")
    p.add_argument("--figure", default=None, help="write a PNG of examples here")
    args = p.parse_args()
    assert set(COLORS)  # the palette the failures are painted in
    test = ShapesDataset(n=args.n, train=False)
    labels = test.labels.numpy()
    g = torch.Generator().manual_seed(0)
    noisy = to_uint8(from_uint8(test.images) + (2 * 25 / 255) * torch.randn(test.images.shape, generator=g))
    wrong = (labels + 1 + np.arange(len(labels)) % 3) % 4
    cases = {
        "real": (test.images.numpy(), labels),
        "real + noise std 25/255": (noisy.numpy(), labels),
        "real, wrong labels": (test.images.numpy(), wrong),
    }
    cases.update(made_failures(test.attrs, np.random.default_rng(0)))
    print("| images | n | passes | " + " | ".join(SHAPES) + " |")
    print("|---|---|---|" + "---|" * len(SHAPES))
    fits = {}
    for name, (images, lab) in cases.items():
        fit = fit_shapes(images)
        ok = fit.passes(lab)
        fits[name] = (images, lab, fit, ok)
        per = [f"{ok[lab == k].mean():.3f}" if (lab == k).any() else "-" for k in range(len(SHAPES))]
        print(f"| {name} | {len(lab)} | {ok.mean():.3f} | " + " | ".join(per) + " |", flush=True)
    if args.figure:
        draw(fits, Path(args.figure))


def draw(fits: dict, path: Path, per_row: int = 6) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(fits), per_row, figsize=(per_row * 1.6, len(fits) * 1.85))
    for r, (name, (images, lab, fit, ok)) in enumerate(fits.items()):
        kinds = np.unique(lab)
        picks = np.concatenate([np.flatnonzero(lab == k)[: per_row // len(kinds) + 1] for k in kinds])[:per_row]
        for c, i in enumerate(picks):
            ax = axes[r, c]
            ax.imshow(images[i].transpose(1, 2, 0), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            best = SHAPES[fit.kind[i]] if fit.kind[i] >= 0 else "none"
            colour = "tab:green" if ok[i] else "tab:red"
            ax.set_title(f"asked {SHAPES[lab[i]]}\nfits {best} {fit.iou[i].max():.2f}", fontsize=7, color=colour)
            for side in ax.spines.values():
                side.set_edgecolor(colour)
                side.set_linewidth(2.5)
        axes[r, 0].set_ylabel(name, fontsize=8)
    fig.suptitle("The strict shapes judge: green passes (asked kind fits best, IoU >= 0.8), red fails", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
