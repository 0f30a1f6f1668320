"""Train briefly on `shapes` and score samples with read_shape (the shapes diagnosis, docs/notes/shapes_no_shapes.md).

    OMP_NUM_THREADS=1 PYTHONPATH=src python experiments/shapes_probe.py --steps 1500 --out /tmp/probe [--lr ...]

Scores N class-balanced samples from the EMA and the raw weights at guidance 1 and 2:
shape = read_shape's shape equals the requested class; found = a foreground was found at all;
palette = fraction of pixels within 40/255 (RGB distance) of a palette colour; cnn = the shipped
shapes_cnn classifier agrees with the requested class.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from tinydit.config import TrainConfig
from tinydit.data.shapes import _PALETTE, SHAPES, read_shape
from tinydit.eval.features import extract, load_feature_net
from tinydit.flow.generate import class_cycle, generate
from tinydit.flow.settings import SamplingSettings
from tinydit.images import save_grid, to_uint8
from tinydit.train import Trainer


def make_variant(
    n_colors: int | None,
    fixed_bg: str | None,
    size: str | None,
    jitter: float = 1.0,
    small: str | None = None,
    large: str | None = None,
):
    """A simpler shapes variant for experiments: fewer colours, one background, one size class, or other
    size ranges (``small``/``large`` as "LO-HI", px at 32 px)."""
    from tinydit.data import shapes as S

    ranges = dict(S._SIZE_RANGES)
    for key, text in (("small", small), ("large", large)):
        if text is not None:
            lo, hi = (float(v) / 32 for v in str(text).split("-"))
            ranges[key] = (lo, hi)

    names = list(S._COLOR_NAMES)
    fg_names = [c for c in names if c != fixed_bg][: n_colors or len(names)]
    if fixed_bg is None and n_colors:
        names = names[:n_colors]

    def make(n: int, seed: int = 0, img_size: int = 32):
        u = np.random.default_rng(seed).random((n, 7))
        kinds = np.minimum((u[:, 0] * len(SHAPES)).astype(np.int64), len(SHAPES) - 1)
        if fixed_bg is None:
            k = len(names)
            c = np.minimum((u[:, 1] * k).astype(np.int64), k - 1)
            b = (c + 1 + np.minimum((u[:, 2] * (k - 1)).astype(np.int64), k - 2)) % k
            fg = [names[i] for i in c]
            bg = [names[i] for i in b]
        else:
            k = len(fg_names)
            c = np.minimum((u[:, 1] * k).astype(np.int64), k - 1)
            fg, bg = [fg_names[i] for i in c], [fixed_bg] * n
        large = u[:, 3] >= 0.5 if size is None else np.full(n, size == "large")
        lo = np.where(large, ranges["large"][0], ranges["small"][0]) * img_size
        hi = np.where(large, ranges["large"][1], ranges["small"][1]) * img_size
        sizes = lo + u[:, 4] * (hi - lo)
        span = img_size - 2 * S._MARGIN - sizes
        u5, u6 = 0.5 + jitter * (u[:, 5] - 0.5), 0.5 + jitter * (u[:, 6] - 0.5)  # jitter 0: centred
        cxs, cys = S._MARGIN + sizes / 2 + u5 * span, S._MARGIN + sizes / 2 + u6 * span
        images = np.empty((n, 3, img_size, img_size), dtype=np.uint8)
        fgp = np.array([S.COLORS[c] for c in fg], dtype=np.float32)
        bgp = np.array([S.COLORS[c] for c in bg], dtype=np.float32)
        for kind in range(len(SHAPES)):
            j = np.flatnonzero(kinds == kind)
            if len(j):
                images[j] = S._render_batch(kind, fgp[j], bgp[j], sizes[j], cxs[j], cys[j], img_size, 4)
        attrs = [
            {
                "shape": SHAPES[kinds[i]],
                "color": fg[i],
                "background": bg[i],
                "size": S.SIZES[int(large[i])],
                "size_px": float(sizes[i]),
                "cx": float(cxs[i]),
                "cy": float(cys[i]),
                "img_size": img_size,
            }
            for i in range(n)
        ]
        return images, kinds, attrs

    S.make_shapes = make


@torch.no_grad()
def loss_by_t(model, val, ts=(0.3, 0.5, 0.7, 0.8, 0.9, 0.95), n: int = 256) -> dict:
    """Flow loss on n held-out images at fixed times, fixed noise (the same in every run)."""
    x0, y = val.batch(torch.arange(min(n, len(val))))
    g = torch.Generator().manual_seed(0)
    out = {}
    for t in ts:
        noise = torch.randn(x0.shape, generator=g)
        xt = (1 - t) * x0 + t * noise
        out[f"{t:g}"] = round((model(xt, torch.full((len(x0),), t), y) - (noise - x0)).pow(2).mean().item(), 4)
    return out


@torch.no_grad()
def shifted_sample(model, y: torch.Tensor, steps: int, shift: float, cfg_scale: float, seed: int = 0) -> torch.Tensor:
    """Euler on a time grid warped towards noise, t' = s t / (1 + (s - 1) t) (the same warp as training)."""
    from tinydit.flow.guidance import guided_velocity

    c = model.config
    x = torch.randn(len(y), c.in_channels, c.img_size, c.img_size, generator=torch.Generator().manual_seed(seed))
    ts = torch.linspace(1.0, 0.0, steps + 1)
    ts = shift * ts / (1 + (shift - 1) * ts)
    for i in range(steps):
        v, _ = guided_velocity(model, x, ts[i].expand(len(y)), y, cfg_scale, c.n_classes)
        x = x + (ts[i + 1] - ts[i]) * v
    return x


def score(x: torch.Tensor, y: torch.Tensor, net) -> dict:
    u8 = to_uint8(x)  # (N, 3, H, W)
    reads = [read_shape(img) for img in u8.numpy()]
    shape = np.mean([r["shape"] == SHAPES[int(c)] for r, c in zip(reads, y, strict=True)])
    found = np.mean([r["shape"] is not None for r in reads])
    pix = u8.permute(0, 2, 3, 1).reshape(-1, 3).float().numpy()
    d = np.linalg.norm(pix[:, None] - _PALETTE[None], axis=-1).min(1)
    _, pred = extract(net, u8)
    return {
        "shape": round(float(shape), 3),
        "found": round(float(found), 3),
        "palette": round(float((d < 40).mean()), 3),
        "cnn": round(float((pred == y).float().mean()), 3),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--minutes", type=float, default=None)
    p.add_argument("--preset", default="dit-0.2m")
    p.add_argument("--data", default="shapes")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ema", type=float, default=0.999)
    p.add_argument("--class-dropout", type=float, default=0.1)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--t-sampling", default="uniform")
    p.add_argument("--t-shift", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--n-colors", type=int, default=None, help="variant: only this many palette colours")
    p.add_argument("--bg", default=None, help="variant: one fixed background colour")
    p.add_argument("--size", default=None, choices=["small", "large"], help="variant: one size class")
    p.add_argument("--jitter", type=float, default=1.0, help="variant: fraction of the position range used")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--sample-steps", type=int, default=32)
    p.add_argument("--cfgs", default="1,2")
    p.add_argument("--sample-shift", type=float, default=3.0, help="also sample on a warped time grid")
    p.add_argument("--pos", default=None, choices=["sincos", "rope"])
    p.add_argument("--pred", default=None, choices=["v", "x"])
    p.add_argument("--precision", default="fp32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--patch-size", type=int, default=None, help="variant: the preset with this patch size")
    p.add_argument("--dim", type=int, default=None, help="variant: the preset with this width")
    p.add_argument("--depth", type=int, default=None, help="variant: the preset with this depth")
    args = p.parse_args()
    trunk = {k: v for k, v in (("patch_size", args.patch_size), ("dim", args.dim), ("depth", args.depth)) if v}
    if trunk:  # a probe-only preset: the chosen one with a different trunk
        from tinydit.models.dit import PRESETS

        PRESETS["probe"] = {**PRESETS[args.preset], **trunk}
        args.preset = "probe"
    torch.set_num_threads(args.threads)
    if args.n_colors or args.bg or args.size or args.jitter != 1.0:
        make_variant(args.n_colors, args.bg, args.size, args.jitter)
    cfg = TrainConfig(
        out=args.out,
        data=args.data,
        preset=args.preset,
        steps=args.steps,
        minutes=args.minutes,
        lr=args.lr,
        ema_decay=args.ema,
        class_dropout=args.class_dropout,
        limit=args.limit,
        t_sampling=args.t_sampling,
        t_shift=args.t_shift,
        batch_size=args.batch_size,
        sample_every=10**9,
        pos=args.pos,
        pred=args.pred,
        precision=args.precision,
        ckpt_every=10**9,
        val_every=250,
        log_every=50,
    )
    tr = Trainer(cfg, overwrite=True, progress=False)
    t0 = time.perf_counter()
    res = tr.fit()
    train_s = time.perf_counter() - t0
    net, _ = load_feature_net("shapes_cnn")
    y = class_cycle(args.n, len(SHAPES))
    out = {
        "args": vars(args),
        "step": res.step,
        "train_s": round(train_s, 1),
        "val_loss": round(res.val_loss, 4),
        "val_loss_ema": round(res.val_loss_ema, 4),
    }
    for name, model in (("ema", tr.run.ema), ("raw", tr.run.model)):
        model.eval()
        out[f"{name}_loss_by_t"] = loss_by_t(model, tr.data.val_set)
        for s in [float(c) for c in args.cfgs.split(",")]:
            x = generate(model, y, SamplingSettings("euler", args.sample_steps, s, source="the probe")).x
            out[f"{name}_cfg{s:g}"] = score(x, y, net)
            if s == 2.0:
                save_grid(x[:64], f"{args.out}/probe_{name}_cfg{s:g}.png", nrow=8)
            if args.sample_shift != 1.0:
                x = shifted_sample(model, y, args.sample_steps, args.sample_shift, s)
                out[f"{name}_cfg{s:g}_shift{args.sample_shift:g}"] = score(x, y, net)
                save_grid(x[:64], f"{args.out}/probe_{name}_cfg{s:g}_shift{args.sample_shift:g}.png", nrow=8)
    print(json.dumps(out))
    with open(f"{args.out}/probe.json", "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
