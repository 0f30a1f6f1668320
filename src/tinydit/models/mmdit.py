"""MMDiT, the two-stream transformer of Stable Diffusion 3 (Esser et al. 2024, "Scaling Rectified Flow
Transformers for High-Resolution Image Synthesis", section 4 and fig. 2), text-to-image on small images.

Architecture only, with the forward contract of the DiT: ``forward(x, t, y) -> v`` with y the caption's
token ids (N, L). It reuses the DiT's patch embedding, positions, time embedding, text encoder, final
layer and (un)patchify, and replaces the trunk:

    x (N, C, H, W) --patchify--> image tokens (N, T, D) + 2-D sin-cos positions (or RoPE inside attention)
    y (N, L) --TextEncoder--> text tokens ctx (N, L, D) with learned 1-D positions, pooled (N, D)
    c = time_embed(t) + pooled_embed(pooled)                        (N, D)
    depth x JointBlock(x, ctx, c): per stream its own adaLN-Zero, norms, QKV, projection and MLP;
        ONE attention over the joined sequence [x; ctx] (N, T + L, D), the caption's padding masked
    single_blocks x DiTBlock over [x; ctx] (optional: one set of weights for both, as in SD3.5/Flux)
    FinalLayer on the image tokens --unpatchify--> v (N, C, H, W)

The last joint block's text output is never used, so (when no single-stream block follows) its text
stream keeps only what the image tokens read from it, keys and values: no queries, output projection
or MLP (SD3's ``context_pre_only``). With ``pos="rope"`` the image tokens are rotated and the text
tokens are not (the identity rotation, like Flux's all-zero text positions); the text tokens carry
their order in the text encoder's learned positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tinydit.errors import TinyDiTError
from tinydit.models.attention import attention
from tinydit.models.dit import AdaLN, Attention, DiT, DiTBlock, DiTConfig, make_mlp, make_norm, norm_modulate
from tinydit.models.presets import DEFAULT_PRESETS, MODEL_PRESETS

__all__ = ["MMDiTConfig", "MMDiT", "JointBlock", "joint_attention", "PRESETS", "DEFAULT_PRESET", "get_preset"]


@dataclass(frozen=True)
class MMDiTConfig(DiTConfig):
    """A DiTConfig (``depth`` counts the joint blocks) plus the single-stream blocks; always text-conditioned."""

    cond: str = "text"  # an MMDiT's second stream is the caption: only "text" is valid
    single_blocks: int = 0  # DiT blocks over the joined sequence after the joint blocks

    def __post_init__(self):
        if self.cond != "text":
            raise TinyDiTError(
                f"MMDiT is conditioned on text (its second stream is the caption), got cond="
                f"{self.cond!r}; use `model` dit for class labels"
            )
        if self.single_blocks < 0:
            raise TinyDiTError(f"MMDiTConfig.single_blocks must be >= 0, got {self.single_blocks}")
        if self.skips:
            raise TinyDiTError(
                "MMDiT has no long skips (its trunk is joint blocks, then single-stream ones); drop skips"
            )
        super().__post_init__()


PRESETS = MODEL_PRESETS["mmdit"]  # the table of every model type is tinydit.models.presets
DEFAULT_PRESET = DEFAULT_PRESETS["mmdit"]


def get_preset(name: str, **data) -> MMDiTConfig:
    """The preset's config, completed with the data's fields (img_size, in_channels, vocab_size, text_len, ...)."""
    if name not in PRESETS:
        raise TinyDiTError(f"unknown MMDiT preset {name!r}: use one of {', '.join(PRESETS)} (see `tinydit presets`)")
    return MMDiTConfig(**{**PRESETS[name], **data})


def joint_attention(
    x_attn: Attention,
    ctx_attn: Attention,
    x: torch.Tensor,
    ctx: torch.Tensor,
    keep: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """SD3's joint attention: each stream projects its own q, k, v; one softmax attention runs over the
    joined sequence; each stream projects its own part of the result.

    x (N, T, D) and ctx (N, L, D) normalised tokens, keep (N, 1, 1, T + L) bool, True = may attend.
    rope rotates the image tokens only. Returns (N, T, D) and (N, L, D), or None for the text if
    ``ctx_attn`` has no queries (the last block's keys-and-values-only text stream).
    """
    n, n_img, d = x.shape
    qx, kx, vx = x_attn.heads(x, rope)  # (N, h, T, Dh) each
    qc, kc, vc = ctx_attn.heads(ctx)  # (N, h, L, Dh) each; qc is None without queries
    q = qx if qc is None else torch.cat([qx, qc], dim=2)  # (N, h, T [+ L], Dh)
    k = torch.cat([kx, kc], dim=2)  # (N, h, T + L, Dh)
    v = torch.cat([vx, vc], dim=2)  # (N, h, T + L, Dh)
    out = attention(q, k, v, keep)  # (N, h, T [+ L], Dh)
    out = out.transpose(1, 2).reshape(n, q.shape[2], d)  # (N, T [+ L], D)
    out_ctx = None if qc is None else ctx_attn.proj(out[:, n_img:])  # (N, L, D)
    return x_attn.proj(out[:, :n_img]), out_ctx  # (N, T, D)


class Stream(nn.Module):
    """One modality's half of a joint block: its own adaLN, norms, QKV, output projection and MLP.

    ``pre_only``: keys and values only, modulated by its own shift and scale (no gates, no MLP).
    """

    def __init__(self, config: MMDiTConfig, pre_only: bool = False):
        super().__init__()
        self.pre_only = pre_only
        self.norm1 = make_norm(config.norm, config.dim)
        self.attn = Attention(config.dim, config.n_heads, config.qk_norm, queries=not pre_only)
        self.adaLN = AdaLN(config.dim, 2 if pre_only else 6)
        if not pre_only:
            self.norm2 = make_norm(config.norm, config.dim)
            self.mlp = make_mlp(config.mlp, config.dim, config.mlp_ratio)

    def modulations(self, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """c (N, D) -> shift1, scale1[, gate1, shift2, scale2, gate2], each (N, D)"""
        return self.adaLN(c).chunk(2 if self.pre_only else 6, dim=1)

    def finish(self, x: torch.Tensor, attn: torch.Tensor, gate1, shift2, scale2, gate2) -> torch.Tensor:
        """The gated attention residual, then the gated MLP residual: x, attn (N, S, D) -> (N, S, D)"""
        x = torch.addcmul(x, gate1.unsqueeze(1), attn)
        return torch.addcmul(x, gate2.unsqueeze(1), self.mlp(norm_modulate(self.norm2, x, shift2, scale2)))


class JointBlock(nn.Module):
    """An MMDiT block (SD3 fig. 2b): two streams with their own weights, one attention over both."""

    def __init__(self, config: MMDiTConfig, pre_only: bool = False):
        super().__init__()
        self.x = Stream(config)  # image tokens
        self.ctx = Stream(config, pre_only=pre_only)  # text tokens

    def forward(
        self,
        x: torch.Tensor,
        ctx: torch.Tensor,
        c: torch.Tensor,
        keep: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (N, T, D), ctx (N, L, D), c (N, D), keep (N, 1, 1, T + L) -> x (N, T, D), ctx (N, L, D) or None"""
        shift_x, scale_x, *rest_x = self.x.modulations(c)  # 6 x (N, D)
        shift_c, scale_c, *rest_c = self.ctx.modulations(c)  # 6 or 2 x (N, D)
        attn_x, attn_c = joint_attention(
            self.x.attn,
            self.ctx.attn,
            norm_modulate(self.x.norm1, x, shift_x, scale_x),
            norm_modulate(self.ctx.norm1, ctx, shift_c, scale_c),
            keep,
            rope,
        )
        x = self.x.finish(x, attn_x, *rest_x)
        ctx = None if self.ctx.pre_only else self.ctx.finish(ctx, attn_c, *rest_c)
        return x, ctx


class MMDiT(DiT):
    """Text-to-image MMDiT predicting the flow-matching velocity.

    forward(x, t, y):
        x: (N, C, H, W) noisy images,  t: (N,) times in [0, 1],
        y: (N, L) int64 caption token ids (``tinydit.data.text.Tokenizer``); the empty caption (BOS, then
           padding) or ``y=None`` is the unconditional input
        returns v: (N, C, H, W)
    """

    config: MMDiTConfig

    def __init__(self, config: MMDiTConfig):
        if not isinstance(config, MMDiTConfig):
            raise TinyDiTError(f"MMDiT needs an MMDiTConfig, got {type(config).__name__}")
        super().__init__(config)

    def build_blocks(self, config: MMDiTConfig) -> None:
        last_pre_only = config.single_blocks == 0  # the text stream's output feeds nothing after the last block
        self.blocks = nn.ModuleList(
            JointBlock(config, pre_only=last_pre_only and i == config.depth - 1) for i in range(config.depth)
        )
        self.single_blocks = nn.ModuleList(DiTBlock(config) for _ in range(config.single_blocks))

    def token_params(self) -> int:
        """Weights of the per-token linear maps an image token passes through (patch embedding, its
        stream's QKV, projections and MLPs, the single-stream blocks, output)."""
        per_token = [self.patch_embed, self.final.linear]
        for block in self.blocks:
            per_token += [block.x.attn.qkv, block.x.attn.proj, block.x.mlp.fc1, block.x.mlp.fc2]
        for block in self.single_blocks:
            per_token += [block.attn.qkv, block.attn.proj, block.mlp.fc1, block.mlp.fc2]
        return sum(m.weight.numel() for m in per_token)

    def flops_per_image(self) -> int:
        """Forward FLOPs per image, the text encoder left out: 2 P S for each token matmul over S tokens,
        and 4 S_q S_k D for each attention."""
        config = self.config
        n_img, n_txt, d = config.n_tokens, config.text_len, config.dim
        flops = 2 * self.token_params() * n_img  # image tokens through their own weights
        for block in self.blocks:
            text = [block.ctx.attn.qkv, block.ctx.attn.proj]
            text += [] if block.ctx.pre_only else [block.ctx.mlp.fc1, block.ctx.mlp.fc2]
            flops += 2 * n_txt * sum(m.weight.numel() for m in text if m is not None)
            queries = n_img + (0 if block.ctx.pre_only else n_txt)
            flops += 4 * queries * (n_img + n_txt) * d
        for block in self.single_blocks:  # the text tokens pass through the shared weights too
            shared = [block.attn.qkv, block.attn.proj, block.mlp.fc1, block.mlp.fc2]
            flops += 2 * n_txt * sum(m.weight.numel() for m in shared) + 4 * (n_img + n_txt) ** 2 * d
        return flops

    def forward(
        self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None, d: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x (N, C, H, W), t (N,), y (N, L) token ids or None, d (N,) step sizes or None (shortcut models
        only) -> v (N, C, H, W)"""
        tokens, rope = self.embed_image(x)  # (N, T, D)
        c, ctx, keep_text = self.condition(t, y, d)  # (N, D), (N, L, D), (N, L)
        n_img = tokens.shape[1]
        keep = F.pad(keep_text, (n_img, 0), value=True)  # (N, T + L): every image token may be attended to
        keep = keep[:, None, None, :]  # (N, 1, 1, T + L): broadcast over heads and queries
        for block in self.blocks:
            tokens, ctx = block(tokens, ctx, c, keep, rope)
        if len(self.single_blocks):
            joint = torch.cat([tokens, ctx], dim=1)  # (N, T + L, D)
            if rope is not None:  # text tokens: the identity rotation (cos 1, sin 0)
                pad = (0, 0, 0, ctx.shape[1])
                rope = (F.pad(rope[0], pad, value=1.0), F.pad(rope[1], pad, value=0.0))  # 2 x (T + L, Dh/2)
            for block in self.single_blocks:
                joint = block(joint, c, rope, keep)
            tokens = joint[:, :n_img]  # (N, T, D)
        return self.velocity(x, t, self.decode(tokens, c))  # (N, C, H, W)
