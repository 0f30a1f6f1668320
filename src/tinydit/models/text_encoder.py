"""The text encoder: a small transformer over a caption's token ids, trained jointly with the generator.

    ids (N, L)  --TextEncoder-->  ctx (N, L, D) one vector per token, pooled (N, D) the mean over non-padding tokens

The ids come from ``tinydit.data.text.Tokenizer`` and follow ``tinydit.tokens``: BOS first, PAD = 0 after
the words. The encoder is part of the model and of its state dict.
"""

from __future__ import annotations

import torch
from torch import nn

from tinydit.errors import TinyDiTError
from tinydit.models.layers import Attention, make_mlp
from tinydit.tokens import PAD

__all__ = ["TextEncoder", "TextLayer"]


class TextLayer(nn.Module):
    """A pre-norm transformer layer over the caption's tokens, padding masked out of the keys."""

    def __init__(self, dim: int, n_heads: int, mlp: str, mlp_ratio: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, n_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = make_mlp(mlp, dim, mlp_ratio)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (N, L, D) caption tokens, mask (N, 1, 1, L) bool, True = may attend -> (N, L, D)"""
        x = x + self.attn(self.norm1(x), attn_mask=mask)
        return x + self.mlp(self.norm2(x))


class TextEncoder(nn.Module):
    """Token ids -> per-token features and a pooled vector: learned token embeddings and 1-D positions,
    ``depth`` pre-norm transformer layers with the padding masked, a final LayerNorm.

    forward(ids): ids (N, L) int64, PAD = 0 and BOS first (``Tokenizer.encode``)
        -> ctx (N, L, D), pooled (N, D) the mean of ctx over non-padding tokens, keep (N, L) bool
    Padding changes nothing: its tokens are masked out of every key and out of the mean.
    """

    def __init__(
        self,
        vocab_size: int,
        max_len: int,
        dim: int,
        depth: int,
        n_heads: int,
        mlp: str = "gelu",
        mlp_ratio: float = 4.0,
    ):
        super().__init__()
        self.max_len = max_len
        self.tok_embed = nn.Embedding(vocab_size, dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, max_len, dim))  # learned 1-D positions (BERT, GPT-2)
        self.layers = nn.ModuleList(TextLayer(dim, n_heads, mlp, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """ids (N, L) -> ctx (N, L, D), pooled (N, D), keep (N, L)"""
        if ids.dim() != 2 or ids.shape[1] > self.max_len:
            raise TinyDiTError(
                f"caption ids must be (N, L) with L <= {self.max_len} (Tokenizer.encode), got shape {tuple(ids.shape)}"
            )
        keep = ids != PAD  # (N, L): BOS is never padding, so no row is all False
        mask = keep[:, None, None, :]  # (N, 1, 1, L): broadcast over heads and queries
        x = self.tok_embed(ids) + self.pos_embed[:, : ids.shape[1]]  # (N, L, D)
        for layer in self.layers:
            x = layer(x, mask)
        ctx = self.norm(x)  # (N, L, D)
        weight = keep.unsqueeze(-1).to(ctx.dtype)  # (N, L, 1)
        pooled = (ctx * weight).sum(1) / weight.sum(1)  # (N, D): mean over the caption's real tokens
        return ctx, pooled, keep
