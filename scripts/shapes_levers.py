"""Train the quick start's model on `shapes` with some settings changed, then read its samples back.

    python scripts/shapes_levers.py --out /tmp/levers/base --set steps=1750
    python scripts/shapes_levers.py --out /tmp/levers/ln --set steps=1750 --set t_sampling=logit-normal \
        --set t_shift=2.2
    python scripts/shapes_levers.py --out /tmp/levers/large --set steps=1750 --variant size=large
    python scripts/shapes_levers.py --out /tmp/levers/muon --set steps=1500 --set cooldown=300 --muon
    python scripts/shapes_levers.py --out /tmp/levers/cap --set steps=1500 --set cooldown=300 --weight-cap 0.5
    python scripts/shapes_levers.py --score-only --out /tmp/levers/ln --sample ancestral:64:10:0.3-1
    python scripts/shapes_levers.py --calibrate        # the scores of real images: how strict the reader is

Training is `tinydit train --data shapes` (the default preset, precision and everything else) with each
``--set FIELD=VALUE`` applied to its TrainConfig; runs compared against each other use ``steps`` rather
than ``minutes``, so a busy machine changes their wall time but not what they compute. ``--variant``
trains on a simpler variant of the data (``scripts/shapes_probe.py``'s ``make_variant``: n_colors,
bg, size, jitter). Each ``--sample SAMPLER:STEPS:GUIDANCE[:LO-HI]`` draws ``--n`` class-balanced EMA
samples (seed 0) and prints one JSON line: the strict judge's pass rates (``strict``, per class, and
``colours``, both colours on the palette), the share whose shape ``read_shape`` reads as the one asked for
(chance 0.25), the share with no foreground at all (``empty``) and the share of pixels within 40/255 of a
palette colour.
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
        print(f"{spec}: {res.note}", file=sys.stderr)  # a preset with no record falls back: say to what
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


def use_muon() -> None:
    """Train with Muon (Jordan et al. 2024; ``torch.optim.Muon``) for the hidden matrices (the blocks', the
    long skips' and the time embedding's 2-D weights) and AdamW for the rest, both at the trainer's learning
    rate and schedule: ``adjust_lr_fn="match_rms_adamw"`` scales Muon's orthogonalised update to AdamW's
    size (Liu et al. 2025, "Muon is Scalable for LLM Training"), so one rate serves both."""
    import torch

    from tinydit.train import optim, run

    built = {}
    build_model = run.build_model

    def build(kind, config):
        built["model"] = build_model(kind, config)
        return built["model"]

    class Muon:
        """Muon and AdamW as one optimizer for the trainer: param_groups, step, zero_grad, state dicts."""

        def __init__(self, params, lr: float, weight_decay: float):
            # `params` are the trainer's: the model's, and the alignment's projector where the run aligns.
            named = built["model"].named_parameters()
            is_hidden = {
                id(p) for n, p in named if p.dim() == 2 and n.startswith(("blocks.", "skip_proj.", "t_embed."))
            }
            params = list(params)
            hidden = [p for p in params if id(p) in is_hidden]
            rest = [p for p in params if id(p) not in is_hidden]
            self.parts = (
                torch.optim.Muon(hidden, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw"),
                torch.optim.AdamW(rest, lr=lr, betas=(0.9, 0.99), weight_decay=weight_decay),
            )

        @property
        def param_groups(self):
            return [g for part in self.parts for g in part.param_groups]

        @property
        def state(self):
            return {k: v for part in self.parts for k, v in part.state.items()}

        def zero_grad(self, set_to_none: bool = True) -> None:
            for part in self.parts:
                part.zero_grad(set_to_none)

        def step(self, closure=None) -> None:
            for part in self.parts:
                part.step()

        def state_dict(self) -> dict:
            return {"muon": self.parts[0].state_dict(), "adamw": self.parts[1].state_dict()}

        def load_state_dict(self, state: dict) -> None:
            self.parts[0].load_state_dict(state["muon"])
            self.parts[1].load_state_dict(state["adamw"])

    run.build_model = build
    run.optim.adamw = optim.adamw = lambda params, device, lr, weight_decay=0.0, fused=None: Muon(
        params, lr, weight_decay
    )


def cap_weight(t_cap: float) -> None:
    """Cap the flow loss's weight on the clean image's error below ``t_cap``: each image's velocity loss, which
    is |x0 - x0_hat|^2 / t^2 for an x-predicting model, times min(1, (t / t_cap)^2). The weight then stops
    growing at 1 / t_cap^2 (Min-SNR-gamma's clamp, Hang et al. 2023, on flow matching's weight), so that the
    few images near t = 0 no longer give most of a batch's gradient (scripts/gradient_by_t.py)."""
    import tinydit.train.trainer as trainer

    flow_loss = trainer.flow_loss

    def capped(model, x0, y, t, noise, reduce=True):
        per_sample = flow_loss(model, x0, y, t, noise, reduce=False) * (t.float() / t_cap).pow(2).clamp(max=1.0)
        return per_sample.mean() if reduce else per_sample

    trainer.flow_loss = capped


def use_self_conditioning(p_sc: float) -> None:
    """Self-conditioning (Chen et al. 2022, "Analog Bits"; RIN, Jabri et al. 2023): the network also sees its own
    estimate of the clean image. In training, for a random ``p_sc`` of each batch the estimate comes from a first
    pass without gradients at the same x_t (zeros for the rest); in sampling it is the previous step's estimate
    (zeros at the first step). The estimate enters through a 3x3 convolution, zero at initialisation, added to
    the stem's convolution, so the model starts as the plain DiT."""
    import dataclasses

    import torch
    from torch import nn

    from tinydit.models import registry
    from tinydit.models.dit import DiT

    class SelfCondDiT(DiT):
        def __init__(self, config):
            super().__init__(config)
            if self.stem is None:
                raise SystemExit("--self-cond needs a preset with stem='conv'")
            conv = self.stem[0]
            self.sc_conv = nn.Conv2d(config.in_channels, conv.out_channels, kernel_size=3, padding=1)
            nn.init.zeros_(self.sc_conv.weight)
            nn.init.zeros_(self.sc_conv.bias)
            self._x_sc = None
            self._state = None  # sampling: the last estimate of x0 (N or 2N, C, H, W)

        def embed_image(self, x):
            conv, act = self.stem
            h = act(conv(x) + self.sc_conv(self._x_sc.to(x.dtype)))
            tokens = self.patchify(h)
            if self.pos_embed is not None:
                return tokens + self.pos_embed, None
            return tokens, (self.rope_cos, self.rope_sin)

        def network_output(self, x, t, y, x_sc):
            self._x_sc = x_sc
            tokens, rope = self.embed_image(x)
            c, _, _ = self.condition(t, y)
            return self.decode(self.trunk(tokens, c, rope), c)

        def previous(self, x, t):
            """The estimate to condition on in sampling: the last step's, reshaped to this batch."""
            s = self._state
            one_time = bool((t == t[0]).all())
            if s is None or not one_time or float(t[0]) >= 0.999 or s.shape[1:] != x.shape[1:]:
                return torch.zeros_like(x)
            if s.shape[0] == x.shape[0]:
                return s
            if 2 * s.shape[0] == x.shape[0]:  # a guided step after an unguided one: both halves
                return torch.cat([s, s])
            if s.shape[0] == 2 * x.shape[0]:  # unguided after guided: the conditional half comes first
                return s[: x.shape[0]]
            return torch.zeros_like(x)

        def forward(self, x, t, y=None, d=None):
            if self.training:
                x_sc = torch.zeros_like(x)
                pick = torch.rand(x.shape[0], device=x.device) < p_sc
                if pick.any():
                    with torch.no_grad():
                        est = self.network_output(x[pick], t[pick], y[pick], torch.zeros_like(x[pick]))
                    x_sc[pick] = est.to(x.dtype)
                out = self.network_output(x, t, y, x_sc)
            else:
                out = self.network_output(x, t, y, self.previous(x, t))
                self._state = out.detach()
            return self.velocity(x, t, out)

    registry.MODEL_TYPES["dit"] = dataclasses.replace(registry.MODEL_TYPES["dit"], model_cls=SelfCondDiT)


def use_low_resolution(steps: int) -> None:
    """Train the first ``steps`` steps on the images at half resolution (2x2 averages, 16 x 16), then at full
    resolution. A 16 x 16 image is a quarter of the tokens, so each of those steps costs a fraction of a full
    one, and the layout (where a shape is, how large, what kind) is what the noisy half of the path decides
    at any resolution. The model is the same: its tokens at 16 x 16 cover 8 x 8 pixels of the full image and
    take the sin-cos positions of their centres on the full grid (2 i + 0.5); the noise is the 2x2 average of
    the full noise, rescaled to unit variance, and the time is moved so that the pair of images keeps the
    signal-to-noise ratio of the full one (odds t / (1 - t) halved: t' = t / (2 - t), SD3's resolution
    shift). The alignment's target is the encoder's map of the full image, pooled to the 4 x 4 tokens."""
    import dataclasses
    import math

    import torch
    import torch.nn.functional as F

    import tinydit.train.trainer as trainer
    from tinydit.models import registry
    from tinydit.models.dit import DiT
    from tinydit.train.repa import Alignment

    def sincos_at(dim: int, coords: torch.Tensor) -> torch.Tensor:
        """sincos_2d's positions at the given coordinates along each axis: (len(coords)^2, dim)."""
        omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim // 4))
        rows, cols = torch.meshgrid(coords, coords, indexing="ij")

        def embed(pos):
            angles = pos.reshape(-1, 1) * omega
            return torch.cat([angles.sin(), angles.cos()], dim=1)

        return torch.cat([embed(rows), embed(cols)], dim=1).float()

    class MultiResDiT(DiT):
        def __init__(self, config):
            super().__init__(config)
            half = config.grid_size // 2
            coords = torch.arange(half, dtype=torch.float64) * 2 + 0.5
            self.register_buffer("pos_half", sincos_at(config.dim, coords).unsqueeze(0), persistent=False)

        def embed_image(self, x):
            if x.shape[-1] == self.config.img_size:
                return super().embed_image(x)
            tokens = self.patchify(x if self.stem is None else self.stem(x))
            return tokens + self.pos_half, None

        def unpatchify(self, x):
            n, p, g = x.shape[0], self.config.patch_size, math.isqrt(x.shape[1])
            c = x.shape[2] // (p * p)
            x = x.reshape(n, g, g, p, p, c).permute(0, 5, 1, 3, 2, 4)
            return x.reshape(n, c, g * p, g * p)

    registry.MODEL_TYPES["dit"] = dataclasses.replace(registry.MODEL_TYPES["dit"], model_cls=MultiResDiT)

    flow_loss = trainer.flow_loss
    calls = [0]

    def low_res_loss(model, x0, y, t, noise, reduce=True):
        calls[0] += 1
        if calls[0] > steps:
            return flow_loss(model, x0, y, t, noise, reduce)
        x_half, noise_half = F.avg_pool2d(x0, 2), 2 * F.avg_pool2d(noise, 2)
        return flow_loss(model, x_half, y, t / (2 - t), noise_half, reduce)

    trainer.flow_loss = low_res_loss
    align_loss = Alignment.loss

    def loss(self, x0):
        if self._tokens is not None:
            self.grid = math.isqrt(self._tokens.shape[1])
        return align_loss(self, x0)

    Alignment.loss = loss


def use_token_routing(rate: float, start: int = 1, end: int = 2) -> None:
    """TREAD (Krause et al. 2025): in training, a random ``rate`` of each image's tokens skips blocks ``start``
    to ``end`` and rejoins the stream unchanged after them, so those blocks run on fewer tokens; sampling
    runs every token through every block. A long skip into the routed span carries the same tokens as the
    span; the alignment (its tokens after block 2, inside the span) is scored on the tokens that took it."""
    import dataclasses

    import torch

    from tinydit.models import registry
    from tinydit.models.dit import DiT
    from tinydit.train.repa import Alignment

    routed = {}

    def pick(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """x (N, T, D) at the token indices idx (N, K) -> (N, K, D)."""
        return x.gather(1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))

    class RoutedDiT(DiT):
        def trunk(self, tokens, c, rope):
            if not self.training:
                return super().trunk(tokens, c, rope)
            if rope is not None:
                raise SystemExit("--route takes a preset with sin-cos positions")
            n_skips = len(self.skip_proj)
            first = len(self.blocks) - n_skips
            kept, idx, full = [], None, None
            for i, block in enumerate(self.blocks):
                if i == start:
                    n, t, _ = tokens.shape
                    idx = torch.rand(n, t, device=tokens.device).argsort(dim=1)[:, : round(t * (1 - rate))]
                    routed["idx"] = idx  # (N, K): the tokens that take the span
                    full, tokens = tokens, pick(tokens, idx)
                if i >= first:
                    skip = kept.pop()
                    if skip.shape[1] != tokens.shape[1]:
                        skip = pick(skip, idx)
                    tokens = self.skip_proj[i - first](torch.cat([tokens, skip], dim=-1))
                tokens = block(tokens, c, rope)
                if i < n_skips:
                    kept.append(tokens)
                if i == end:
                    tokens = full.scatter(1, idx.unsqueeze(-1).expand(-1, -1, full.shape[-1]), tokens.to(full.dtype))
            return tokens

    registry.MODEL_TYPES["dit"] = dataclasses.replace(registry.MODEL_TYPES["dit"], model_cls=RoutedDiT)

    loss, target = Alignment.loss, Alignment.target

    def routed_loss(self, x0):
        routed["now"] = self._tokens is not None and self._tokens.shape[1] != self.grid**2  # this pass was routed
        return loss(self, x0)

    def routed_target(self, x0):
        feats = target(self, x0)  # (N, T, F)
        return pick(feats, routed["idx"]) if routed.get("now") else feats  # (N, K, F) after a routed pass

    Alignment.loss, Alignment.target = routed_loss, routed_target


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
    p.add_argument("--muon", action="store_true", help="train the hidden matrices with Muon, the rest with AdamW")
    p.add_argument(
        "--weight-cap", type=float, default=None, metavar="T", help="cap the loss's weight on x0's error below t = T"
    )
    p.add_argument(
        "--self-cond",
        type=float,
        default=0.0,
        metavar="P",
        help="self-conditioning: the share of each batch trained on the model's own estimate (also when scoring)",
    )
    p.add_argument(
        "--low-res",
        type=int,
        default=0,
        metavar="STEPS",
        help="train the first STEPS steps at half resolution (16 x 16 for shapes), the rest at full",
    )
    p.add_argument(
        "--route",
        type=float,
        default=0.0,
        metavar="RATE",
        help="TREAD: in training, RATE of each image's tokens skip blocks 1-2 (of 0-3) and rejoin after them",
    )
    p.add_argument("--weights", choices=("ema", "raw"), default="ema", help="sample with the EMA or the raw weights")
    args = p.parse_args()
    if args.calibrate:
        for row in calibrate(args.n):
            print(json.dumps(row), flush=True)
        return
    if not args.out:
        p.error("--out is required unless --calibrate is given")
    out = Path(args.out)
    if sum(map(bool, (args.self_cond, args.low_res, args.route))) > 1:
        p.error("--self-cond, --low-res and --route each build their own model: give one of them")
    fields = {k: parse_value(v) for k, v in (a.split("=", 1) for a in args.set)}
    if args.self_cond:
        use_self_conditioning(args.self_cond)
    if args.low_res:
        use_low_resolution(args.low_res)
    if args.route:
        use_token_routing(args.route)
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

        if args.muon:
            use_muon()
        if args.weight_cap:
            cap_weight(args.weight_cap)

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
    if fields.get("model") == "mmdit":
        return  # a text model: `tinydit eval` scores prompt adherence and the strict judge
    for spec in args.sample or ["euler:32:2", "euler:32:4"]:
        row = score(out / "checkpoint.pt", args.n, spec, args.weights == "ema", args.sample_seed)
        print(json.dumps({"out": str(out), **row}), flush=True)


if __name__ == "__main__":
    main()
