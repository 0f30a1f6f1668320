"""The Diffusion Transformer (DiT; Peebles & Xie 2023, "Scalable Diffusion Models with Transformers").

Architecture only: the model maps a noisy image, a time and a class label (or a caption) to a
velocity shaped like the image. The loss lives in ``tinydit.flow``, guidance in ``tinydit.sampling``,
optimisation and EMA in ``tinydit.train``.

    x (N, C, H, W) --patchify--> (N, T, D) + 2-D sin-cos positions (or 2-D RoPE inside attention)
    c = time_embed(t) + label_embed(y)                         (N, D)
      (cond="text": c = time_embed(t) + pooled_embed(TextEncoder(y).pooled), y caption ids (N, L))
    depth x DiTBlock(x, c)   with adaLN-Zero modulation from c
    FinalLayer --unpatchify--> v (N, C, H, W)

The text-conditioned DiT sees its caption only through the pooled vector in c: the baseline of the
two-stream MMDiT (``tinydit.mmdit``), which builds on the pieces of this module.

Switches from the post-2023 literature, each a ``DiTConfig`` field (see docs/ablation.md for what each
one measured on Fashion-MNIST):
    norm="rmsnorm"   RMSNorm (Zhang & Sennrich 2019) instead of LayerNorm in the blocks
    qk_norm=True     RMS-normalise queries and keys per head (Dehghani et al. 2023; SD3)
    mlp="swiglu"     gated SiLU MLP (Shazeer 2020) at the same parameter count as the GELU MLP
    pos="rope"       2-D axial rotary positions (Su et al. 2021; Heo et al. 2024) instead of sin-cos
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from tinydit.attention import attention
from tinydit.errors import TinyDiTError
from tinydit.linear import TokenLinear, token_linear

__all__ = ["DiTConfig", "DiT", "PRESETS", "DEFAULT_PRESET", "SWITCHES", "ORIGINAL_BLOCK", "CONDS", "get_preset",
           "count_params", "rope_2d", "apply_rope", "swiglu_hidden", "make_mlp", "AdaLN"]  # fmt: skip

NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")
POSITIONS = ("sincos", "rope")
PREDICTIONS = ("v", "x")
X_PRED_T_MIN = 0.05  # x-prediction divides by t; below this t the division is clipped (JiT, Li & He 2025)
CONDS = ("class", "text")


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
    norm: str = "layernorm"  # block norms: layernorm | rmsnorm (both without affine: adaLN scales them)
    qk_norm: bool = False  # RMS-normalise q and k per head before the dot product
    mlp: str = "gelu"  # gelu (exact erf form) | swiglu (hidden width 2/3 of GELU's, same params)
    pos: str = "sincos"  # sincos: fixed 2-D sin-cos added to the tokens | rope: 2-D axial RoPE on q and k
    shortcut: bool = False  # also condition on the step size d, for few-step sampling (tinydit.shortcut)
    # What the network outputs: v (the velocity itself) | x (the clean image; v derived from it) | auto
    # (resolved at construction: x for RGB data, v for grayscale; see PRESETS).
    pred: str = "v"
    cond: str = "class"  # class: y is a label (N,) | text: y is caption token ids (N, L) (tinydit.text)
    vocab_size: int = 0  # text: the tokenizer's vocabulary, special tokens included (set from the data)
    text_len: int = 0  # text: L, token ids per caption: BOS + the longest training caption (set from the data)
    text_depth: int = 2  # text: transformer layers of the text encoder (width dim, n_heads heads, same MLP)

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
        if self.pred == "auto":  # frozen dataclass: set the resolved value once, here
            object.__setattr__(self, "pred", "x" if self.in_channels > 1 else "v")
        for name, allowed in (("norm", NORMS), ("mlp", MLPS), ("pos", POSITIONS), ("pred", PREDICTIONS)):
            if getattr(self, name) not in allowed:
                raise TinyDiTError(f"DiTConfig.{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.pos == "rope" and self.head_dim % 4:
            raise TinyDiTError(f"2-D RoPE needs a head dim divisible by 4 (dim / n_heads), got {self.head_dim}")
        if self.cond not in CONDS:
            raise TinyDiTError(f"DiTConfig.cond must be one of {', '.join(CONDS)}, got {self.cond!r}")
        if self.cond == "text":
            if self.vocab_size < 4 or self.text_len < 1:
                raise TinyDiTError(
                    f"a text-conditioned model needs vocab_size >= 4 and text_len >= 1 (got {self.vocab_size} and "
                    f"{self.text_len}): take both from the tokenizer (Tokenizer.vocab_size, Tokenizer.max_len)"
                )
            if self.text_depth < 0:
                raise TinyDiTError(f"DiTConfig.text_depth must be >= 0, got {self.text_depth}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

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
    # pred="auto": the network predicts the clean image (x, JiT) on RGB data and the velocity (v) on
    # grayscale. On 3-channel shapes, x reached in 4,000 steps a validation loss v had not reached in
    # 8,687 (dit-0.2m); on Fashion-MNIST's 1-channel patches there is no bottleneck for x to remove, and
    # in the 4-minute ablation x scored worse (docs/ablation.md). Old checkpoints (no field) load as v.
    "dit-0.2m": dict(dim=64, depth=2, n_heads=2, patch_size=4, pred="auto"),  # smoke tests: seconds per run
    # The CPU preset: minutes per run. SwiGLU is its one switch that won the equal-time ablation on
    # Fashion-MNIST (docs/ablation.md); RMSNorm, QK-norm and RoPE each scored worse and stay off.
    "dit-1.9m": dict(dim=128, depth=6, n_heads=4, patch_size=4, mlp="swiglu", pred="auto"),
    "dit-9.8m": dict(dim=256, depth=8, n_heads=4, patch_size=4, pred="auto"),  # a laptop hour, or a GPU
    "dit-32m": dict(dim=384, depth=12, n_heads=6, patch_size=2, pred="auto"),  # GPU: 256 tokens per 32x32 image
}
DEFAULT_PRESET = "dit-1.9m"

# The architecture switches one at a time and all together, each spelled out in full so that it means
# the same on top of any preset (benchmarks/bench_train.py --switches, benchmarks/ablation.py, tests).
ORIGINAL_BLOCK = dict(norm="layernorm", qk_norm=False, mlp="gelu", pos="sincos", pred="v")  # DiT as published
SWITCHES: dict[str, dict] = {
    "baseline": ORIGINAL_BLOCK,
    "rmsnorm": {**ORIGINAL_BLOCK, "norm": "rmsnorm"},
    "qk_norm": {**ORIGINAL_BLOCK, "qk_norm": True},
    "swiglu": {**ORIGINAL_BLOCK, "mlp": "swiglu"},
    "rope": {**ORIGINAL_BLOCK, "pos": "rope"},
    "all four": dict(norm="rmsnorm", qk_norm=True, mlp="swiglu", pos="rope", pred="v"),
    "x_pred": {**ORIGINAL_BLOCK, "pred": "x"},  # the network outputs the clean image (JiT)
    "swiglu+x_pred": {**ORIGINAL_BLOCK, "mlp": "swiglu", "pred": "x"},  # dit-1.9m on RGB data
}


def get_preset(name: str, **data) -> DiTConfig:
    """The preset's config, completed with the data's ``img_size``, ``in_channels`` and ``n_classes``."""
    if name not in PRESETS:
        raise TinyDiTError(f"unknown preset {name!r}: use one of {', '.join(PRESETS)} (see `tinydit presets`)")
    return DiTConfig(**{**PRESETS[name], **data})  # in one go: pred="auto" is resolved for the data's channels


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: (N, T, D) normalised tokens, (N, D) shift and scale from the conditioning."""
    return torch.addcmul(shift.unsqueeze(1), x, 1 + scale.unsqueeze(1))  # one pass over x: shift + x (1 + scale)


def norm_modulate(norm: nn.Module, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """modulate(norm(x), shift, scale): the input of the linear map that follows an adaLN norm.

    Under CPU autocast the residual stream x stays fp32, and the linear map would take its input in
    bf16 anyway; casting x first lets the norm and the modulation run on half the bytes and saves the
    linear map its own cast (1.01-1.03x a dit-1.9m bf16 step of ``tinydit train`` on our CPU, two
    runs each way). CUDA autocast runs norms in fp32 whatever their input, so there x goes in as it is.
    """
    if x.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        x = x.to(torch.get_autocast_dtype("cpu"))
    return modulate(norm(x), shift, scale)


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


def rope_2d(head_dim: int, grid_size: int, theta: float = 100.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Angles of 2-D axial RoPE over a row-major patch grid: (cos, sin), each (T, head_dim / 2).

    Channel pair j (dims j and j + head_dim/2) turns by row * f_j for the first head_dim/4 pairs and by
    col * f_j for the rest. theta is 100, not the 10 000 of language models: the grid is 7-16 patches
    wide, and with 10 000 half the frequencies would barely turn across it.
    """
    freqs = 1.0 / theta ** (torch.arange(head_dim // 4, dtype=torch.float64) / (head_dim // 4))  # (Dh/4,)
    coords = torch.arange(grid_size, dtype=torch.float64)
    rows, cols = torch.meshgrid(coords, coords, indexing="ij")  # (g, g) each
    angles = torch.cat([rows.reshape(-1, 1) * freqs, cols.reshape(-1, 1) * freqs], dim=1)  # (T, Dh/2)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (j, j + Dh/2) of x (N, h, T, Dh) by the angles in cos/sin (T, Dh/2), in x's dtype
    (fp32 tables would lift bf16 queries and keys to fp32 under autocast)."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)  # 2 x (N, h, T, Dh/2)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (N, h, T, Dh)


def make_norm(kind: str, dim: int) -> nn.Module:
    """A block norm without affine parameters: the adaLN shift and scale take their place."""
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=1e-6, elementwise_affine=False)
    return nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)


class QKNorm(nn.Module):
    """RMSNorm over the head dim with a learned gain, applied in the input's dtype.

    ``nn.RMSNorm`` with an fp32 gain on bf16 autocast inputs falls back to a slow unfused kernel, so
    the gain is cast to the input's dtype and applied after the fused, weightless norm.
    """

    def __init__(self, head_dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., Dh) -> (..., Dh)"""
        return F.rms_norm(x, self.weight.shape, eps=self.eps) * self.weight.to(x.dtype)


class Attention(nn.Module):
    """Multi-head self-attention: one fused QKV projection, optional QK-norm and RoPE, and
    ``tinydit.attention`` (PyTorch's SDPA, or two matmuls where those are faster).

    ``queries=False`` keeps only the key and value projections (no queries, no output projection): the
    text stream of MMDiT's last joint block, whose own output is never used (``tinydit.mmdit``).
    """

    def __init__(self, dim: int, n_heads: int, qk_norm: bool = False, queries: bool = True):
        super().__init__()
        self.n_heads = n_heads
        self.n_proj = 3 if queries else 2  # q, k, v or k, v
        self.qkv = TokenLinear(dim, self.n_proj * dim)
        self.proj = TokenLinear(dim, dim) if queries else None
        head_dim = dim // n_heads
        # QK-norm bounds every logit by sqrt(Dh) * gain^2, whatever the size of x (ViT-22B, SD3).
        self.q_norm = QKNorm(head_dim) if qk_norm and queries else nn.Identity()
        self.k_norm = QKNorm(head_dim) if qk_norm else nn.Identity()

    def heads(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """x (N, T, D) -> q, k, v, each (N, h, T, Dh), normalised and rotated as configured (q None if
        the module has no queries)."""
        n, t, d = x.shape
        qkv = self.qkv(x).reshape(n, t, self.n_proj, self.n_heads, d // self.n_heads)  # (N, T, 3 or 2, h, Dh)
        parts = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 or 2 x (N, h, T, Dh)
        q, k, v = parts if self.proj is not None else (None, *parts)
        k = self.k_norm(k)
        if q is not None:
            q = self.q_norm(q)
        if rope is not None:
            k = apply_rope(k, *rope)
            q = apply_rope(q, *rope) if q is not None else None
        return q, k, v

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x (N, T, D) -> (N, T, D). attn_mask: bool, broadcastable to (N, h, T, T), True = may attend."""
        n, t, d = x.shape
        q, k, v = self.heads(x, rope)
        out = attention(q, k, v, attn_mask)  # (N, h, T, Dh)
        return self.proj(out.transpose(1, 2).reshape(n, t, d))  # (N, T, D)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = TokenLinear(dim, hidden)
        self.fc2 = TokenLinear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, T, D) -> (N, T, D), through a hidden width of mlp_ratio * D"""
        # The exact (erf) GELU, not DiT's tanh approximation: the two differ by < 1e-3, and on AVX2 CPUs
        # the tanh form took 5x longer (benchmarks/README.md), about 4% of a training step.
        return self.fc2(F.gelu(self.fc1(x)))


def swiglu_hidden(dim: int, mlp_ratio: float, multiple_of: int = 8) -> int:
    """SwiGLU hidden width: 2/3 of the GELU MLP's, rounded up to a multiple of 8 (LLaMA, sec. 2).

    Three matrices of D x 2/3 H hold as many weights as GELU's two of D x H.
    """
    hidden = int(2 * dim * mlp_ratio / 3)
    return multiple_of * math.ceil(hidden / multiple_of)


class SwiGLU(nn.Module):
    """fc2(silu(x W_gate) * x W_up). W_gate and W_up are stored stacked as ``fc1`` (2 hidden, D), the layout
    of every SwiGLU checkpoint; the forward multiplies by the two halves and never calls ``fc1`` itself,
    so hooks on ``fc1`` do not fire."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = TokenLinear(dim, 2 * hidden)
        self.fc2 = TokenLinear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, T, D) -> (N, T, D)"""
        # Two matmuls on fc1's two halves rather than one on the whole and a split of its output: gate
        # and up come out contiguous, and the backward never concatenates two (N, T, hidden)
        # gradients into one (dit-1.9m, fp32 CPU: 1.10x a training step of ``tinydit train``).
        w_gate, w_up = self.fc1.weight.chunk(2)  # 2 x (hidden, D), contiguous row blocks
        b_gate, b_up = self.fc1.bias.chunk(2)  # 2 x (hidden,)
        gate, up = token_linear(x, w_gate, b_gate), token_linear(x, w_up, b_up)  # 2 x (N, T, hidden)
        return self.fc2(F.silu(gate) * up)


def make_mlp(kind: str, dim: int, mlp_ratio: float) -> nn.Module:
    """The block MLP the config names: GELU with hidden width mlp_ratio * dim, or SwiGLU with as many weights."""
    if kind == "swiglu":
        return SwiGLU(dim, swiglu_hidden(dim, mlp_ratio))
    return Mlp(dim, int(dim * mlp_ratio))


class AdaLN(nn.Sequential):
    """c (N, D) -> n modulation vectors (N, n * D) through SiLU and one linear map; the map is zeroed at
    initialisation (adaLN-Zero, DiT section 3.2), so whatever it modulates starts as the identity."""

    def __init__(self, dim: int, n: int):
        super().__init__(nn.SiLU(), nn.Linear(dim, n * dim))


class DiTBlock(nn.Module):
    """Pre-norm transformer block whose norms are modulated by c (adaLN-Zero, DiT section 3.2).

    The six modulation vectors (shift, scale, gate for attention and MLP) start at zero, so every
    block starts as the identity and the residual stream passes through untouched.
    """

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        dim = cfg.dim
        self.norm1 = make_norm(cfg.norm, dim)
        self.attn = Attention(dim, cfg.n_heads, cfg.qk_norm)
        self.norm2 = make_norm(cfg.norm, dim)
        self.mlp = make_mlp(cfg.mlp, dim, cfg.mlp_ratio)
        self.adaLN = AdaLN(dim, 6)

    def forward(
        self,
        x: torch.Tensor,
        c: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x (N, T, D), c (N, D) -> (N, T, D). attn_mask: bool (N, 1, 1, T), True = may attend (MMDiT's
        single-stream blocks mask the caption's padding)."""
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN(c).chunk(6, dim=1)  # 6 x (N, D)
        # Gated residuals, each as one fused pass: x + gate * branch.
        attn = self.attn(norm_modulate(self.norm1, x, shift1, scale1), rope, attn_mask)
        x = torch.addcmul(x, gate1.unsqueeze(1), attn)
        x = torch.addcmul(x, gate2.unsqueeze(1), self.mlp(norm_modulate(self.norm2, x, shift2, scale2)))
        return x


class FinalLayer(nn.Module):
    def __init__(self, dim: int, patch_dim: int, norm: str = "layernorm"):
        super().__init__()
        self.norm = make_norm(norm, dim)
        self.adaLN = AdaLN(dim, 2)
        self.linear = TokenLinear(dim, patch_dim)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """x (N, T, D), c (N, D) -> (N, T, p*p*C)"""
        shift, scale = self.adaLN(c).chunk(2, dim=1)  # 2 x (N, D)
        return self.linear(norm_modulate(self.norm, x, shift, scale))


class DiT(nn.Module):
    """DiT predicting the flow-matching velocity, conditioned on a class label or on a caption.

    forward(x, t, y):
        x: (N, C, H, W) noisy images,  t: (N,) times in [0, 1],
        y: class models (``cond="class"``): (N,) int64 labels in [0, n_classes]; ``y == n_classes`` is the
           unconditional "null" label;
           text models (``cond="text"``): (N, L) int64 caption token ids from ``tinydit.text.Tokenizer``;
           the empty caption (BOS, then padding) is the unconditional input. A text DiT sees the caption
           only through its pooled vector, added to c (the baseline that ``tinydit.mmdit`` is measured
           against); ``y=None`` is the unconditional input of either kind.
        returns v: (N, C, H, W)
    """

    def __init__(self, config: DiTConfig):
        super().__init__()
        self.config = config
        cfg = config
        self.patch_embed = nn.Conv2d(cfg.in_channels, cfg.dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        if cfg.pos == "sincos":
            self.register_buffer("pos_embed", sincos_2d(cfg.dim, cfg.grid_size).unsqueeze(0), persistent=False)
        else:
            self.pos_embed = None
            cos, sin = rope_2d(cfg.head_dim, cfg.grid_size)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.t_embed = TimestepEmbedder(cfg.dim)
        if cfg.cond == "class":
            self.y_embed = nn.Embedding(cfg.n_classes + 1, cfg.dim)  # the last row is the null label
        else:
            from tinydit.text import TextEncoder  # a local import: tinydit.text builds on this module's layers

            self.text = TextEncoder(cfg.vocab_size, cfg.text_len, cfg.dim, cfg.text_depth, cfg.n_heads, cfg.mlp,
                                    cfg.mlp_ratio)  # fmt: skip
            # The pooled caption joins c like SD3's pooled CLIP vector: through a small MLP (SD3 fig. 2).
            self.pooled_embed = nn.Sequential(nn.Linear(cfg.dim, cfg.dim), nn.SiLU(), nn.Linear(cfg.dim, cfg.dim))
        # Shortcut models (Frans et al. 2024) see the step size d the sampler will take; d = 0 asks for
        # the instantaneous velocity, so with d = 0 the model is an ordinary flow model.
        self.d_embed = TimestepEmbedder(cfg.dim) if cfg.shortcut else None
        self.build_blocks(cfg)
        self.final = FinalLayer(cfg.dim, cfg.patch_size**2 * cfg.in_channels, cfg.norm)
        self.reset_parameters()

    def build_blocks(self, cfg: DiTConfig) -> None:
        """The transformer trunk between the embeddings and the final layer (MMDiT builds its own)."""
        self.blocks = nn.ModuleList(DiTBlock(cfg) for _ in range(cfg.depth))

    @property
    def null_class(self) -> int:
        return self.config.n_classes

    def null_condition(self, y: torch.Tensor) -> torch.Tensor:
        """The unconditional input shaped like y, for guidance: the null label (N,) or the empty caption (N, L)."""
        if self.config.cond == "text":
            from tinydit.text import empty_like

            return empty_like(y)
        return torch.full_like(y, self.null_class)

    def reset_parameters(self) -> None:
        """All initialisation in one place (DiT): Xavier linears, zeroed adaLN and output layers."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        w = self.patch_embed.weight
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))  # like a Linear over flattened patches
        nn.init.zeros_(self.patch_embed.bias)
        if self.config.cond == "class":
            nn.init.normal_(self.y_embed.weight, std=0.02)
        else:
            nn.init.normal_(self.text.tok_embed.weight, std=0.02)
            nn.init.normal_(self.text.pos_embed, std=0.02)
        for layer in (self.t_embed.mlp[0], self.t_embed.mlp[2]):
            nn.init.normal_(layer.weight, std=0.02)
        if self.d_embed is not None:  # starts at zero: the step size only matters once it is learned
            nn.init.normal_(self.d_embed.mlp[0].weight, std=0.02)
            nn.init.zeros_(self.d_embed.mlp[2].weight)
        for m in self.modules():  # adaLN-Zero: every block (and the final layer) starts as the identity
            if isinstance(m, AdaLN):
                nn.init.zeros_(m[-1].weight)
                nn.init.zeros_(m[-1].bias)
        nn.init.zeros_(self.final.linear.weight)  # the model predicts exactly zero at initialisation
        nn.init.zeros_(self.final.linear.bias)

    def token_params(self) -> int:
        """Weights of the linear maps applied to every token (patch embedding, QKV, projections, MLPs,
        output); the per-image conditioning MLPs and the text encoder are left out, as in nanoGPT's and
        PaLM's FLOP counts."""
        per_token = [self.patch_embed, self.final.linear]
        for block in self.blocks:
            per_token += [block.attn.qkv, block.attn.proj, block.mlp.fc1, block.mlp.fc2]
        return sum(m.weight.numel() for m in per_token)

    def flops_per_image(self) -> int:
        """Forward FLOPs per image: 2 P T for the token matmuls plus 4 depth T^2 D for attention
        (scores and weighted sum). A training step costs about 3x this (backward = 2x forward)."""
        cfg = self.config
        return 2 * self.token_params() * cfg.n_tokens + 4 * cfg.depth * cfg.n_tokens**2 * cfg.dim

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        # Made contiguous once here: a transposed view would hand its layout on to every residual
        # addition after it, and each norm would copy the tokens to read them (dit-1.9m: 1.02-1.04x a
        # fp32 and 1.08x a bf16 CPU training step, raced in one process).
        return self.patch_embed(x).flatten(2).transpose(1, 2).contiguous()  # (N, D, g, g) -> (N, T, D)

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """(N, T, p*p*C) -> (N, C, H, W), the inverse of cutting the image into row-major patches."""
        n, p, c, g = x.shape[0], self.config.patch_size, self.config.in_channels, self.config.grid_size
        x = x.reshape(n, g, g, p, p, c)  # (N, gh, gw, ph, pw, C)
        x = x.permute(0, 5, 1, 3, 2, 4)  # (N, C, gh, ph, gw, pw)
        return x.reshape(n, c, g * p, g * p)  # (N, C, H, W)

    def embed_image(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """x (N, C, H, W) -> tokens (N, T, D) with their positions, and the RoPE angles (or None)."""
        cfg = self.config
        if x.shape[1:] != (cfg.in_channels, cfg.img_size, cfg.img_size):
            raise TinyDiTError(
                f"this model takes images of shape (N, {cfg.in_channels}, {cfg.img_size}, {cfg.img_size}), "
                f"got {tuple(x.shape)}"
            )
        tokens = self.patchify(x)  # (N, T, D)
        if self.pos_embed is not None:
            return tokens + self.pos_embed, None
        return tokens, (self.rope_cos, self.rope_sin)

    def condition(
        self, t: torch.Tensor, y: torch.Tensor | None, d: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """c (N, D) from t (N,), y and d (N,); text models also return the caption's tokens ctx (N, L, D)
        and keep (N, L), True where a token is not padding (class models: None, None)."""
        cfg = self.config
        if y is None:
            shape = (t.shape[0], cfg.text_len) if cfg.cond == "text" else (t.shape[0],)
            y = self.null_condition(torch.zeros(shape, dtype=torch.long, device=t.device))
        want = 2 if cfg.cond == "text" else 1
        if y.dim() != want:
            what = "caption token ids (N, L) from its tokenizer" if want == 2 else "class labels (N,)"
            raise TinyDiTError(f"this {cfg.cond}-conditioned model takes y as {what}, got shape {tuple(y.shape)}")
        ctx = keep = None
        if cfg.cond == "class":
            c = self.t_embed(t) + self.y_embed(y)  # (N, D)
        else:
            ctx, pooled, keep = self.text(y)  # (N, L, D), (N, D), (N, L)
            c = self.t_embed(t) + self.pooled_embed(pooled)  # (N, D)
        if self.d_embed is not None:
            c = c + self.d_embed(torch.zeros_like(t) if d is None else d)
        return c, ctx, keep

    def forward(
        self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None, d: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x (N, C, H, W), t (N,), y (N,) labels or (N, L) token ids or None, d (N,) step sizes or None
        (shortcut models only) -> v (N, C, H, W)"""
        tokens, rope = self.embed_image(x)  # (N, T, D)
        c, _, _ = self.condition(t, y, d)  # (N, D); a text DiT reads the caption only through c
        for block in self.blocks:
            tokens = block(tokens, c, rope)
        return self.velocity(x, t, self.unpatchify(self.final(tokens, c)))  # (N, C, H, W)

    def velocity(self, x: torch.Tensor, t: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The velocity (N, C, H, W) from the network's output ``out`` for x_t (N, C, H, W) at t (N,).

        x-prediction (JiT, Li & He 2025): the network outputs the clean image, which lies near a
        low-dimensional manifold, and the velocity follows from the path, v = (x_t - x0) / t. A v- (or
        noise-) predicting network must instead carry the full-rank noise of every patch through its
        width: with 3-channel 4x4 patches (48 values) and a 64-wide token it cannot (docs/ablation.md).
        """
        if self.config.pred == "v":
            return out
        t_ = t.to(out.dtype).clamp(min=X_PRED_T_MIN).view(-1, 1, 1, 1)  # (N, 1, 1, 1)
        return (x - out) / t_
