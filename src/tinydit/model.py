"""The Diffusion Transformer (DiT; Peebles & Xie 2023, "Scalable Diffusion Models with Transformers").

Architecture only: the model maps a noisy image, a time and a class label to a velocity shaped like
the image. The loss lives in ``tinydit.flow``, guidance in ``tinydit.sampling``, optimisation and
EMA in ``tinydit.train``.

    x (N, C, H, W) --patchify--> (N, T, D) + 2-D sin-cos positions
    c = time_embed(t) + label_embed(y)                         (N, D)
    depth x DiTBlock(x, c)   with adaLN-Zero modulation from c
    FinalLayer --unpatchify--> v (N, C, H, W)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import nn

from tinydit.errors import TinyDiTError

__all__ = ["DiTConfig", "DiT", "PRESETS", "DEFAULT_PRESET", "get_preset", "count_params"]


@dataclass(frozen=True)
class DiTConfig:
    """Everything needed to rebuild a DiT; stored in every checkpoint."""

    img_size: int = 32  # H = W of the images the model sees
    in_channels: int = 3  # C: 3 for RGB, 1 for grayscale
    patch_size: int = 4  # p: each p x p patch becomes one token, T = (img_size / p) ** 2
    dim: int = 256  # D: token width
    depth: int = 6  # number of DiT blocks
    n_heads: int = 4  # attention heads; dim must divide evenly
    mlp_ratio: float = 4.0  # MLP hidden width = mlp_ratio * dim
    n_classes: int = 10  # class labels 0..n_classes-1; id n_classes is the "null" label for guidance

    def __post_init__(self):
        for name in ("img_size", "in_channels", "patch_size", "dim", "depth", "n_heads", "n_classes"):
            if getattr(self, name) < 1:
                raise TinyDiTError(f"DiTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.img_size % self.patch_size:
            raise TinyDiTError(
                f"patch_size {self.patch_size} does not divide img_size {self.img_size}; pick a divisor"
            )
        if self.dim % self.n_heads:
            raise TinyDiTError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if self.dim % 4:
            raise TinyDiTError(f"dim {self.dim} must be divisible by 4 for the 2-D sin-cos positions")
        if self.mlp_ratio <= 0:
            raise TinyDiTError(f"mlp_ratio must be > 0, got {self.mlp_ratio}")

    @property
    def grid_size(self) -> int:
        return self.img_size // self.patch_size

    @property
    def n_tokens(self) -> int:
        return self.grid_size**2

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> DiTConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise TinyDiTError(f"unknown DiT config keys {sorted(unknown)}: written by a newer tinydit?")
        return cls(**d)


# Presets fix the trunk (width, depth, heads, patch). Names carry the real parameter count, measured
# for 32x32 RGB with 10 classes (tests/test_model.py checks each name against count_params).
PRESETS: dict[str, dict] = {
    "dit-0.2m": dict(dim=64, depth=2, n_heads=2, patch_size=4),  # smoke tests: seconds per run
    "dit-1.9m": dict(dim=128, depth=6, n_heads=4, patch_size=4),  # the CPU preset: minutes per run
    "dit-9.8m": dict(dim=256, depth=8, n_heads=4, patch_size=4),  # a laptop hour, or a GPU
    "dit-32m": dict(dim=384, depth=12, n_heads=6, patch_size=2),  # GPU: 256 tokens per 32x32 image
}
DEFAULT_PRESET = "dit-1.9m"


def get_preset(name: str, **data) -> DiTConfig:
    """The preset's config, completed with the data's ``img_size``, ``in_channels`` and ``n_classes``."""
    if name not in PRESETS:
        raise TinyDiTError(f"unknown preset {name!r}: use one of {', '.join(PRESETS)} (see `tinydit presets`)")
    cfg = replace(DiTConfig(), **PRESETS[name])
    return replace(cfg, **data) if data else cfg


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: (N, T, D) normalised tokens, (N, D) shift and scale from the conditioning."""
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


def sincos_2d(dim: int, grid_size: int) -> torch.Tensor:
    """Fixed 2-D sin-cos positions (MAE / DiT): half the channels encode the row, half the column.

    Returns (grid_size * grid_size, dim), row-major over the patch grid like the tokens.
    """
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim // 4))  # (D/4,)
    coords = torch.arange(grid_size, dtype=torch.float64)
    rows, cols = torch.meshgrid(coords, coords, indexing="ij")  # (g, g) each

    def embed(pos: torch.Tensor) -> torch.Tensor:
        angles = pos.reshape(-1, 1) * omega  # (g*g, D/4)
        return torch.cat([angles.sin(), angles.cos()], dim=1)  # (g*g, D/2)

    return torch.cat([embed(rows), embed(cols)], dim=1).float()  # (g*g, D)


class TimestepEmbedder(nn.Module):
    """t in [0, 1] (N,) -> (N, D): sinusoidal features of 1000 t, then a two-layer MLP (DiT)."""

    def __init__(self, dim: int, freq_dim: int = 256):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """t (N,) -> (N, D)"""
        half = self.freq_dim // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
        # Scaling by 1000 spreads t in [0, 1] over the frequency range these features were designed for.
        args = 1000 * t.float().unsqueeze(1) * freqs  # (N, freq_dim / 2)
        return self.mlp(torch.cat([args.cos(), args.sin()], dim=1))  # (N, D)


class Attention(nn.Module):
    """Multi-head self-attention with one fused QKV projection and PyTorch's fused SDPA kernel."""

    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, T, D) -> (N, T, D)"""
        n, t, d = x.shape
        qkv = self.qkv(x).reshape(n, t, 3, self.n_heads, d // self.n_heads)  # (N, T, 3, h, Dh)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (N, h, T, Dh)
        out = F.scaled_dot_product_attention(q, k, v)  # (N, h, T, Dh)
        return self.proj(out.transpose(1, 2).reshape(n, t, d))  # (N, T, D)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, T, D) -> (N, T, D), through a hidden width of mlp_ratio * D"""
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class DiTBlock(nn.Module):
    """Pre-norm transformer block whose norms are modulated by c (adaLN-Zero, DiT section 3.2).

    The six modulation vectors (shift, scale, gate for attention and MLP) start at zero, so every
    block starts as the identity and the residual stream passes through untouched.
    """

    def __init__(self, dim: int, n_heads: int, mlp_ratio: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(dim, n_heads)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.adaLN = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """x (N, T, D), c (N, D) -> (N, T, D)"""
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN(c).chunk(6, dim=1)  # 6 x (N, D)
        x = x + gate1.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift1, scale1))
        x = x + gate2.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift2, scale2))
        return x


class FinalLayer(nn.Module):
    def __init__(self, dim: int, patch_dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.adaLN = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))
        self.linear = nn.Linear(dim, patch_dim)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """x (N, T, D), c (N, D) -> (N, T, p*p*C)"""
        shift, scale = self.adaLN(c).chunk(2, dim=1)  # 2 x (N, D)
        return self.linear(modulate(self.norm(x), shift, scale))


class DiT(nn.Module):
    """Class-conditional DiT predicting the flow-matching velocity.

    forward(x, t, y):
        x: (N, C, H, W) noisy images,  t: (N,) times in [0, 1],  y: (N,) int64 labels in
        [0, n_classes]; ``y == n_classes`` (or ``y=None``) is the unconditional "null" label.
        returns v: (N, C, H, W)
    """

    def __init__(self, config: DiTConfig):
        super().__init__()
        self.config = config
        cfg = config
        self.patch_embed = nn.Conv2d(cfg.in_channels, cfg.dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.register_buffer("pos_embed", sincos_2d(cfg.dim, cfg.grid_size).unsqueeze(0), persistent=False)
        self.t_embed = TimestepEmbedder(cfg.dim)
        self.y_embed = nn.Embedding(cfg.n_classes + 1, cfg.dim)  # the last row is the null label
        self.blocks = nn.ModuleList(DiTBlock(cfg.dim, cfg.n_heads, cfg.mlp_ratio) for _ in range(cfg.depth))
        self.final = FinalLayer(cfg.dim, cfg.patch_size**2 * cfg.in_channels)
        self.reset_parameters()

    @property
    def null_class(self) -> int:
        return self.config.n_classes

    def reset_parameters(self) -> None:
        """All initialisation in one place (DiT): Xavier linears, zeroed adaLN and output layers."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        w = self.patch_embed.weight
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))  # like a Linear over flattened patches
        nn.init.zeros_(self.patch_embed.bias)
        nn.init.normal_(self.y_embed.weight, std=0.02)
        for layer in (self.t_embed.mlp[0], self.t_embed.mlp[2]):
            nn.init.normal_(layer.weight, std=0.02)
        for block in self.blocks:  # adaLN-Zero: each block starts as the identity
            nn.init.zeros_(block.adaLN[-1].weight)
            nn.init.zeros_(block.adaLN[-1].bias)
        nn.init.zeros_(self.final.adaLN[-1].weight)
        nn.init.zeros_(self.final.adaLN[-1].bias)
        nn.init.zeros_(self.final.linear.weight)  # the model predicts exactly zero at initialisation
        nn.init.zeros_(self.final.linear.bias)

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        return self.patch_embed(x).flatten(2).transpose(1, 2)  # (N, D, g, g) -> (N, T, D)

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """(N, T, p*p*C) -> (N, C, H, W), the inverse of cutting the image into row-major patches."""
        n, p, c, g = x.shape[0], self.config.patch_size, self.config.in_channels, self.config.grid_size
        x = x.reshape(n, g, g, p, p, c)  # (N, gh, gw, ph, pw, C)
        x = x.permute(0, 5, 1, 3, 2, 4)  # (N, C, gh, ph, gw, pw)
        return x.reshape(n, c, g * p, g * p)  # (N, C, H, W)

    def condition(self, t: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        if y is None:
            y = torch.full_like(t, self.null_class, dtype=torch.long)
        return self.t_embed(t) + self.y_embed(y)  # (N, D)

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        cfg = self.config
        if x.shape[1:] != (cfg.in_channels, cfg.img_size, cfg.img_size):
            raise TinyDiTError(
                f"this model takes images of shape (N, {cfg.in_channels}, {cfg.img_size}, {cfg.img_size}), "
                f"got {tuple(x.shape)}"
            )
        tokens = self.patchify(x) + self.pos_embed  # (N, T, D)
        c = self.condition(t, y)  # (N, D)
        for block in self.blocks:
            tokens = block(tokens, c)
        return self.unpatchify(self.final(tokens, c))  # (N, C, H, W)
