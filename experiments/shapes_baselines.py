"""Two questions about the shapes quick start that the trainer cannot ask, each answered by a training loop of
the trainer's recipe and the strict judge.

    python experiments/shapes_baselines.py unet --out /tmp/unet            # a convolutional U-Net instead of the DiT
    python experiments/shapes_baselines.py repa --out /tmp/repa --lam 0.5  # the DiT with REPA's alignment loss
    python experiments/shapes_baselines.py repa --out /tmp/base --lam 0    # the same loop without it

The recipe is the quick start's: 1,500 steps of batch 64 from the 20,000 training images, AdamW (0.9, 0.99)
at 2e-3 (the U-Net 1e-3) with 100 warm-up steps and a linear cool-down over the last 20%, gradients clipped
at 1, the EMA warmed up as min(0.999, (1 + s) / (10 + s)), the null label one time in ten, times
logit-normal shifted by 2.2 towards noise, x-prediction under the velocity loss, bf16 autocast. Each
model's EMA then draws ``--n`` class-balanced samples (seed 0) at three settings of the ancestral sampler
(64 steps, eta 1: guidance 1; 4 on [0.3, 1]; 50 on [0.8, 1], the record of ``dit-1.4m``), judged
strictly; one JSON line each, and the first 32 samples of each as a figure, OUT_g<guidance>.png.

``unet``: is it the transformer? A U-Net of DDPM's kind (Ho et al. 2020) at the DiT's parameter count:
residual 3x3 convolution blocks with group norm and a time-and-label scale and shift in each, at 32, 16 and 8
px (16, 32 and 128 channels) with skips between the two halves, and two transformer blocks at 8 x 8.

``repa``: does the DiT learn a better layout with a representation to align to? REPA (Yu et al. 2024):
the tokens after block ``--layer``, through a small MLP, are pulled towards (cosine) the 8 x 8 feature map of
a CNN that has seen the clean image, weight ``--lam``. The CNN is ``tinydit.eval.features.FeatureNet``
trained here for two epochs on the training images' labels with its own seed, not the evaluation's
feature net.
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch
import torch.nn.functional as F
from torch import nn

from tinydit.data.shapes import SHAPES, make_shapes
from tinydit.eval.features import train_feature_net
from tinydit.eval.shape_fit import strict_scores
from tinydit.flow.grids import uniform_grid
from tinydit.flow.guidance import guided_velocity
from tinydit.flow.path import interpolate, sample_t, velocity_target
from tinydit.flow.samplers import ancestral
from tinydit.images import from_uint8, to_uint8
from tinydit.models.dit import DiT
from tinydit.models.dit_config import get_preset
from tinydit.models.layers import Attention, TimestepEmbedder
from tinydit.train.optim import ema_update

NULL = len(SHAPES)  # the null label
SETTINGS = ((1.0, None), (4.0, (0.3, 1.0)), (50.0, (0.8, 1.0)))  # (guidance, interval) of ancestral 64, eta 1


class ResBlock(nn.Module):
    """Two 3x3 convolutions with group norm; c (N, dim) scales and shifts the second's input."""

    def __init__(self, cin: int, cout: int, dim: int):
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(8, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2, self.conv2 = nn.GroupNorm(8, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.film = nn.Linear(dim, 2 * cout)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()
        nn.init.zeros_(self.conv2.weight)  # starts as the skip alone
        nn.init.zeros_(self.conv2.bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        scale, shift = self.film(c)[:, :, None, None].chunk(2, dim=1)  # (N, cout, 1, 1) each
        return self.skip(x) + self.conv2(F.silu(self.norm2(h) * (1 + scale) + shift))


class TokenBlock(nn.Module):
    """A transformer block over the 8 x 8 grid with adaLN-Zero modulation from c."""

    def __init__(self, ch: int, dim: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(ch, elementwise_affine=False)
        self.attn = Attention(ch, heads, True)
        self.norm2 = nn.LayerNorm(ch, elementwise_affine=False)
        self.mlp = nn.Sequential(nn.Linear(ch, 4 * ch), nn.GELU(), nn.Linear(4 * ch, ch))
        self.ada = nn.Linear(dim, 6 * ch)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(c).unsqueeze(1).chunk(6, dim=-1)
        x = x + gate1 * self.attn(self.norm1(x) * (1 + scale1) + shift1)
        return x + gate2 * self.mlp(self.norm2(x) * (1 + scale2) + shift2)


class UNet(nn.Module):
    """x (N, 3, 32, 32), t (N,), y (N,) -> v (N, 3, 32, 32), predicting x0 as the DiT presets do on RGB."""

    def __init__(self, chs: tuple[int, ...] = (16, 32, 128), dim: int = 128, mid_depth: int = 2, heads: int = 4):
        super().__init__()
        self.t_embed, self.y_embed = TimestepEmbedder(dim), nn.Embedding(NULL + 1, dim)
        self.inp = nn.Conv2d(3, chs[0], 3, padding=1)
        self.down, self.pool = nn.ModuleList(), nn.ModuleList()
        for i, ch in enumerate(chs):  # each level's block, then its strided convolution down
            self.down.append(ResBlock(chs[max(i - 1, 0)], ch, dim))
            if i < len(chs) - 1:
                self.pool.append(nn.Conv2d(ch, ch, 3, stride=2, padding=1))
        self.mid_pos = nn.Parameter(torch.zeros(1, 64, chs[-1]))
        self.mid = nn.ModuleList(TokenBlock(chs[-1], dim, heads) for _ in range(mid_depth))
        ups = range(len(chs) - 1, -1, -1)
        self.up = nn.ModuleList(ResBlock(chs[min(i + 1, len(chs) - 1)] + chs[i], chs[i], dim) for i in ups)
        self.out_norm, self.out = nn.GroupNorm(8, chs[0]), nn.Conv2d(chs[0], 3, 3, padding=1)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def null_condition(self, y: torch.Tensor) -> torch.Tensor:
        return torch.full_like(y, NULL)

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        c = F.silu(self.t_embed(t) + self.y_embed(y))  # (N, dim)
        h, kept = self.inp(x), []
        for i, block in enumerate(self.down):
            h = block(h, c)
            kept.append(h)
            if i < len(self.pool):
                h = self.pool[i](h)
        n, ch, gh, gw = h.shape  # (N, C, 8, 8)
        tokens = h.flatten(2).transpose(1, 2) + self.mid_pos  # (N, 64, C)
        for block in self.mid:
            tokens = block(tokens, c)
        h = tokens.transpose(1, 2).reshape(n, ch, gh, gw)
        for i, block in enumerate(self.up):
            if i:
                h = F.interpolate(h, scale_factor=2, mode="nearest")
            h = block(torch.cat([h, kept.pop()], dim=1), c)
        x0 = self.out(F.silu(self.out_norm(h)))
        return (x - x0) / t.clamp(min=0.05).view(-1, 1, 1, 1)


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, args, aux=None) -> nn.Module:
    """The trainer's recipe on images x (N, 3, 32, 32) in [-1, 1] and labels y (N,); ``aux(x0) -> loss``
    adds a loss computed after the forward pass. Returns the EMA."""
    ema = copy.deepcopy(model).requires_grad_(False)
    params = [p for p in model.parameters()] + (list(aux.parameters()) if aux is not None else [])
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    cooldown, start = int(0.2 * args.steps), time.time()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / 100) * min(1.0, (args.steps - step) / cooldown)
        idx = torch.randint(0, len(x), (args.batch,), generator=gen)
        x0, labels = x[idx], y[idx].clone()
        labels[torch.rand(args.batch, generator=gen) < 0.1] = NULL
        t = sample_t(args.batch, gen, kind="logit-normal", shift=2.2)  # shifted towards noise
        noise = torch.randn(x0.shape, generator=gen)
        x_t = interpolate(x0, noise, t)
        with torch.autocast("cpu", torch.bfloat16):
            v = model(x_t, t, labels)
            extra = aux(x0) if aux is not None else None
        flow = (v.float() - velocity_target(x0, noise)).pow(2).mean()
        loss = flow if extra is None else flow + args.lam * extra
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ema_update(ema, model, min(0.999, (1 + step) / (10 + step)))
        if step % 250 == 0 or step == args.steps - 1:
            more = "" if extra is None else f", aux {extra.item():.4f}"
            print(f"step {step}: flow loss {flow.item():.4f}{more}, {time.time() - start:.0f} s", flush=True)
    return ema.eval()


def guided(model: nn.Module, y: torch.Tensor, cfg: float, lo: float, hi: float):
    """The velocity field of labels y (N,) under guidance ``cfg`` inside [lo, hi], conditional outside."""

    def velocity(x_t: torch.Tensor, t: float) -> torch.Tensor:
        scale = cfg if lo <= t <= hi else 1.0
        return guided_velocity(model, x_t, torch.full((x_t.shape[0],), t), y, scale)[0]

    return velocity


@torch.no_grad()
def judge(model: nn.Module, n: int, out: str) -> None:
    """Strict scores of n class-balanced samples at each of SETTINGS; the first 32 as a labelled figure."""
    labels = torch.arange(n) % len(SHAPES)
    for cfg, interval in SETTINGS:
        lo, hi = interval or (0.0, 1.0)
        gen = torch.Generator().manual_seed(0)
        x = torch.randn((n, 3, 32, 32), generator=gen)
        parts = [
            ancestral(
                guided(model, labels[i : i + 200], cfg, lo, hi),
                x[i : i + 200],
                uniform_grid(64),
                eta=1.0,
                generator=gen,
            )
            for i in range(0, n, 200)
        ]
        u8 = to_uint8(torch.cat(parts))
        scores = {k: round(v, 3) for k, v in strict_scores(u8, labels).items()}
        print(json.dumps({"guidance": cfg, "interval": interval, **scores}), flush=True)
        title = f"ancestral 64, guidance {cfg:g}" + (f" on {list(interval)}" if interval else "")
        figure(u8[:32], f"{out}_g{cfg:g}.png", title)


def figure(u8: torch.Tensor, path: str, title: str) -> None:
    """Samples (N, 3, H, W) uint8 whose label is i % 4 as rows of four columns, each column named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = len(u8) // len(SHAPES)
    fig, axes = plt.subplots(rows, len(SHAPES), figsize=(1.1 * len(SHAPES), 1.1 * rows + 0.4), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.imshow(u8[i].permute(1, 2, 0).numpy(), interpolation="nearest")
        ax.set_xticks([])
        ax.set_yticks([])
        if i < len(SHAPES):
            ax.set_title(SHAPES[i], fontsize=9)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("unet", "repa"))
    p.add_argument("--out", required=True, help="prefix of the EMA weights (.pt) and the figures (.png)")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (unet: 1e-3, repa: 2e-3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lam", type=float, default=0.5, help="repa: the alignment loss's weight (0: off)")
    p.add_argument("--layer", type=int, default=1, help="repa: align the tokens after this block (0-based)")
    p.add_argument("--n", type=int, default=400, help="class-balanced samples per sampler setting")
    args = p.parse_args()
    args.lr = args.lr or (1e-3 if args.what == "unet" else 2e-3)
    images, labels, _ = make_shapes(20000, 0)
    x, y = from_uint8(torch.from_numpy(images)), torch.from_numpy(labels)
    aux = None
    if args.what == "unet":
        torch.manual_seed(args.seed)
        model = UNet()
    else:
        encoder = train_feature_net(torch.from_numpy(images), y, len(SHAPES), epochs=2, seed=101, log=lambda s: None)
        features = encoder.body[:14].requires_grad_(False)  # (N, 128, 8, 8): before the global average
        torch.manual_seed(args.seed)
        model = DiT(get_preset("dit-1.4m", img_size=32, in_channels=3, n_classes=len(SHAPES)))
        hidden: dict[str, torch.Tensor] = {}
        model.blocks[args.layer].register_forward_hook(lambda m, i, o: hidden.__setitem__("tokens", o))
        projector = nn.Sequential(
            nn.Linear(model.config.dim, 256), nn.SiLU(), nn.Linear(256, 256), nn.SiLU(), nn.Linear(256, 128)
        )

        class Align(nn.Module):
            def __init__(self):
                super().__init__()
                self.projector = projector

            def forward(self, x0: torch.Tensor) -> torch.Tensor:
                with torch.no_grad():
                    target = features(x0.float()).flatten(2).transpose(1, 2)  # (N, 64, 128)
                z = self.projector(hidden["tokens"]).float()  # (N, 64, 128)
                return -F.cosine_similarity(z, target, dim=-1).mean()

        aux = Align() if args.lam > 0 else None
    print(f"{args.what}: {sum(p.numel() for p in model.parameters()):,} parameters", flush=True)
    ema = train(model, x, y, args, aux)
    torch.save(ema.state_dict(), args.out + ".pt")
    judge(ema, args.n, args.out)


if __name__ == "__main__":
    main()
