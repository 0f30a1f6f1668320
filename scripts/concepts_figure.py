"""Draw the Concepts page's figure: flow matching in one picture, with the shapes model the package ships.

    python scripts/concepts_figure.py --out docs/concepts_flow.png

Rows, over columns t = 1 (noise) ... 0 (data):
  1. the training path x_t = (1 - t) x0 + t noise between a real `shapes` image and noise
  2. the velocity the model learns on it, v = noise - x0 (the same at every t of the straight path)
  3. sampling: x_t on the pretrained model's Euler path from the same noise, asked for that image's class
  4. the velocity the model gives there, v(x_t, t), which each Euler step follows
  5. the model's guess of the clean image at each t, x0 = x_t - t v(x_t, t)
and, beside them, one Euler step written out. A second panel shows guidance: the same noise sampled
at guidance 1, 3 and 10, one column per class. A few seconds on a CPU, fp32, no network.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib
import numpy as np
import torch

from tinydit import api
from tinydit.data.shapes import SHAPES, make_shapes
from tinydit.flow.grids import uniform_grid
from tinydit.flow.guidance import Velocity
from tinydit.flow.path import interpolate, velocity_target
from tinydit.flow.samplers import euler

COLUMNS = (1.0, 0.8, 0.6, 0.4, 0.2, 0.0)  # times shown, noise to data
STEPS = 30  # Euler steps; every shown time falls on the uniform grid (0.2 = 6 steps)
GUIDANCE = 3.0  # the path rows' guidance, at every step
GUIDANCE_ROW = (1.0, 3.0, 10.0)


def to_rgb(x: torch.Tensor) -> np.ndarray:
    """(C, H, W) in about [-1, 1] -> (H, W, C) in [0, 1] for imshow."""
    return ((x.clamp(-1, 1) + 1) / 2).permute(1, 2, 0).numpy()


def show_velocity(v: torch.Tensor) -> np.ndarray:
    """A velocity (C, H, W), unbounded, scaled into [0, 1] around grey = 0."""
    return (0.5 + 0.5 * v / v.abs().max()).clamp(0, 1).permute(1, 2, 0).numpy()


@torch.no_grad()
def euler_path(model, noise: torch.Tensor, y: torch.Tensor, cfg_scale: float) -> dict[float, tuple]:
    """x_t and the model's x0 guess at each shown time of an Euler path from ``noise`` (N, C, H, W)."""
    velocity = Velocity(model, y, cfg_scale)
    grid = uniform_grid(STEPS)  # (STEPS + 1,) from 1 down to 0
    shown, x = {}, noise
    for i in range(STEPS + 1):
        t = float(grid[i])
        if any(abs(t - c) < 1e-6 for c in COLUMNS):
            v = velocity(x, t)
            shown[round(t, 6)] = (x.clone(), v, x - t * v)  # x_t, v(x_t, t), and x0 = x_t - t v
        if i < STEPS:
            x = euler(velocity, x, grid[i : i + 2])  # one step: x + (t_next - t) v(x, t)
    return shown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs/concepts_flow.png")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--index", type=int, default=2, help="which rendered training image to follow")
    args = parser.parse_args()
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt  # after choosing the backend

    model = api.from_pretrained(api.pretrained("shapes"))  # the shipped dit-1.4m, EMA weights, eval mode
    images, labels, _ = make_shapes(args.index + 1, seed=args.seed)  # uint8 (N, C, H, W), labels (N,)
    x0 = torch.from_numpy(images[args.index]).float() / 127.5 - 1  # (C, H, W) in [-1, 1]
    label = int(labels[args.index])
    g = torch.Generator().manual_seed(args.seed)
    noise = torch.randn(1, *x0.shape, generator=g)  # (1, C, H, W)
    path = euler_path(model, noise, torch.tensor([label]), GUIDANCE)

    noise4 = torch.randn(4, *x0.shape, generator=g)  # one noise per class, shared by every guidance row
    finals = {s: euler_path(model, noise4, torch.arange(4), s)[0.0][0] for s in GUIDANCE_ROW}  # x at t = 0

    fig = plt.figure(figsize=(13, 8.6))
    top = fig.add_gridspec(5, len(COLUMNS), left=0.17, right=0.6, top=0.92, bottom=0.03, hspace=0.1, wspace=0.06)
    rows = (
        "training path\nx_t = (1 - t) x0 + t noise",
        "velocity to learn\nv = noise - x0",
        f"sampling: Euler path\n{STEPS} steps, guidance {GUIDANCE:g}",
        "the model's velocity\nv(x_t, t) there",
        "the model's guess\nx0 = x_t - t v(x_t, t)",
    )
    target = show_velocity(velocity_target(x0, noise[0]))  # the same at every t
    for c, t in enumerate(COLUMNS):
        x_t, v, guess = (a[0] for a in path[round(t, 6)])
        cells = (
            to_rgb(interpolate(x0[None], noise, torch.tensor([t]))[0]),
            target,
            to_rgb(x_t),
            show_velocity(v),
            to_rgb(guess),
        )
        for r, cell in enumerate(cells):
            ax = fig.add_subplot(top[r, c])
            ax.set_xticks([])
            ax.set_yticks([])
            ax.imshow(cell, interpolation="nearest")
            if r == 0:
                ax.set_title(f"t = {t:g}" + (" (noise)" if t == 1 else " (data)" if t == 0 else ""), fontsize=10)
            if c == 0:
                ax.set_ylabel(rows[r], fontsize=9, rotation=0, ha="right", va="center")
    fig.text(
        0.385, 0.975, f"one `shapes` image ({SHAPES[label]}) and one noise, t from 1 to 0", ha="center", fontsize=11
    )

    side = fig.add_gridspec(len(GUIDANCE_ROW), 4, left=0.7, right=0.98, top=0.92, bottom=0.5, hspace=0.1, wspace=0.06)
    for r, s in enumerate(GUIDANCE_ROW):
        for c in range(4):
            ax = fig.add_subplot(side[r, c])
            ax.imshow(to_rgb(finals[s][c]), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(SHAPES[c], fontsize=10)
            if c == 0:
                ax.set_ylabel(f"s = {s:g}", fontsize=9)
    fig.text(0.84, 0.975, f"guidance s (Euler {STEPS} steps; one noise per column)", ha="center", fontsize=11)
    fig.text(
        0.68,
        0.42,
        "One Euler step, from t to t - dt:\n\n    x_{t - dt} = x_t - dt · v(x_t, t)\n\n"
        "Guidance mixes the model's velocity with\nand without the class:\n\n"
        "    v = v_uncond + s (v_cond - v_uncond)\n\n"
        "s = 1 is the conditional velocity alone.",
        fontsize=9.5,
        va="top",
        family="monospace",
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}: class {SHAPES[label]}, seed {args.seed}")


if __name__ == "__main__":
    main()
