"""The layers the DiT, the MMDiT and the text encoder are built from (DiT; Peebles & Xie 2023).

modulate / norm_modulate   adaLN: x (N, T, D) normalised, then shifted and scaled by c's (N, D) vectors
AdaLN                      c (N, D) -> n modulation vectors, zero at initialisation (adaLN-Zero)
TimestepEmbedder           t (N,) -> (N, D)
sincos_2d, rope_2d         fixed 2-D positions: added to the tokens, or rotating q and k (RoPE)
Attention                  multi-head self-attention, optional QK-norm and RoPE
Mlp, SwiGLU                the block MLPs (make_mlp)
FinalLayer                 tokens (N, T, D) -> patches (N, T, p*p*C), adaLN-modulated
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tinydit.models.attention import attention
from tinydit.models.linear import TokenLinear, token_linear

__all__ = [
    "modulate",
    "norm_modulate",
    "sincos_2d",
    "TimestepEmbedder",
    "rope_2d",
    "apply_rope",
    "make_norm",
    "QKNorm",
    "Attention",
    "Mlp",
    "swiglu_hidden",
    "SwiGLU",
    "make_mlp",
    "AdaLN",
    "FinalLayer",
]


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: (N, T, D) normalised tokens, (N, D) shift and scale from the conditioning."""
    return torch.addcmul(shift.unsqueeze(1), x, 1 + scale.unsqueeze(1))  # one pass over x: shift + x (1 + scale)


def norm_modulate(norm: nn.Module, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """modulate(norm(x), shift, scale): the input of the linear map that follows an adaLN norm.

    Under CPU autocast the residual stream x stays fp32, and the linear map would take its input in
    bf16 anyway; casting x first lets the norm and the modulation run on half the bytes and saves the
    linear map its own cast. CUDA
    autocast runs norms in fp32 whatever their input, so there x goes in as it is.
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
    """t in [0, 1] (N,) -> (N, D): sinusoidal features of ``scale`` t (DiT: 1000), then a two-layer MLP."""

    def __init__(self, dim: int, freq_dim: int = 256, scale: float = 1000.0):
        super().__init__()
        self.freq_dim, self.scale = freq_dim, scale
        self.mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """t (N,) -> (N, D)"""
        half = self.freq_dim // 2
        dtype = torch.promote_types(t.dtype, torch.float32)  # at least fp32 (float64 models stay float64)
        freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device, dtype=dtype) / half)
        # Scaling by 1000 spreads t in [0, 1] over the frequency range these features were designed for.
        args = self.scale * t.to(dtype).unsqueeze(1) * freqs  # (N, freq_dim / 2)
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
    ``tinydit.models.attention`` (PyTorch's SDPA, or two matmuls where those are faster).

    ``queries=False`` keeps only the key and value projections (no queries, no output projection): the
    text stream of MMDiT's last joint block, whose own output is never used (``tinydit.models.mmdit``).
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
        # The exact (erf) GELU, not DiT's tanh approximation: the two differ by < 1e-3, and the tanh
        # form was several times slower on an AVX2 CPU.
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
        # and up come out contiguous, and the backward never concatenates two (N, T, hidden) gradients
        # into one.
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
