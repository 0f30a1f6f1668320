"""The Diffusion Transformer (DiT; Peebles & Xie 2023, "Scalable Diffusion Models with Transformers").

Architecture only: the model maps a noisy image, a time and a class label (or a caption) to a
velocity shaped like the image. The loss lives in ``tinydit.flow.path``, guidance in ``tinydit.flow.samplers``,
optimisation and EMA in ``tinydit.train.trainer``.

    x (N, C, H, W) --patchify--> (N, T, D) + 2-D sin-cos positions (or 2-D RoPE inside attention)
    c = time_embed(t) + label_embed(y)                         (N, D)
      (cond="text": c = time_embed(t) + pooled_embed(TextEncoder(y).pooled), y caption ids (N, L))
    depth x DiTBlock(x, c)   with adaLN-Zero modulation from c
    FinalLayer --unpatchify--> v (N, C, H, W)

The text-conditioned DiT sees its caption only through the pooled vector in c: the baseline of the
two-stream MMDiT (``tinydit.models.mmdit``), which builds on the pieces of this module.

Switches from the post-2023 literature, each a ``DiTConfig`` field:
    norm="rmsnorm"   RMSNorm (Zhang & Sennrich 2019) instead of LayerNorm in the blocks
    qk_norm=True     RMS-normalise queries and keys per head (Dehghani et al. 2023; SD3)
    mlp="swiglu"     gated SiLU MLP (Shazeer 2020) at the same parameter count as the GELU MLP
    pos="rope"       2-D axial rotary positions (Su et al. 2021; Heo et al. 2024) instead of sin-cos
    stem="conv"      a 3x3 convolution at full resolution before the patches
    head="conv"      the output patches as features per pixel, then a 3x3 convolution (U-ViT, Bao et al. 2023)
    skips=True       U-ViT's long skips from the first half of the blocks to the second
"""

from __future__ import annotations

import torch
from torch import nn

from tinydit.errors import TinyDiTError
from tinydit.models.dit_config import CONDS, DEFAULT_PRESET, ORIGINAL_BLOCK, PRESETS, SWITCHES, DiTConfig, get_preset
from tinydit.models.layers import (
    AdaLN,
    Attention,
    FinalLayer,
    TimestepEmbedder,
    make_mlp,
    make_norm,
    norm_modulate,
    rope_2d,
    sincos_2d,
)
from tinydit.models.linear import token_linear
from tinydit.models.text_encoder import TextEncoder
from tinydit.tokens import empty_like

__all__ = [
    "DiTConfig",
    "DiT",
    "DiTBlock",
    "PRESETS",
    "DEFAULT_PRESET",
    "SWITCHES",
    "ORIGINAL_BLOCK",
    "CONDS",
    "get_preset",
    "count_params",
]

X_PRED_T_MIN = 0.05  # x-prediction divides by t; below this t the division is clipped (JiT, Li & He 2025)


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


class DiTBlock(nn.Module):
    """Pre-norm transformer block whose norms are modulated by c (adaLN-Zero, DiT section 3.2).

    The six modulation vectors (shift, scale, gate for attention and MLP) start at zero, so every
    block starts as the identity and the residual stream passes through untouched.
    """

    def __init__(self, config: DiTConfig):
        super().__init__()
        dim = config.dim
        self.norm1 = make_norm(config.norm, dim)
        self.attn = Attention(dim, config.n_heads, config.qk_norm)
        self.norm2 = make_norm(config.norm, dim)
        self.mlp = make_mlp(config.mlp, dim, config.mlp_ratio)
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


class DiT(nn.Module):
    """DiT predicting the flow-matching velocity, conditioned on a class label or on a caption.

    forward(x, t, y):
        x: (N, C, H, W) noisy images,  t: (N,) times in [0, 1],
        y: class models (``cond="class"``): (N,) int64 labels in [0, n_classes]; ``y == n_classes`` is the
           unconditional "null" label;
           text models (``cond="text"``): (N, L) int64 caption token ids from ``tinydit.data.text.Tokenizer``;
           the empty caption (BOS, then padding) is the unconditional input. A text DiT sees the caption
           only through its pooled vector, added to c (the baseline that ``tinydit.models.mmdit`` is measured
           against); ``y=None`` is the unconditional input of either kind.
        returns v: (N, C, H, W)
    """

    def __init__(self, config: DiTConfig):
        super().__init__()
        self.config = config
        p, f = config.patch_size, config.conv_channels
        self.stem = None  # pixels go straight into the patch embedding, as in DiT
        if config.stem == "conv":  # (N, C, H, W) -> (N, f, H, W): conv_depth 3x3 convolutions, each then a SiLU
            convs = [
                nn.Conv2d(config.in_channels if i == 0 else f, f, kernel_size=3, padding=1)
                for i in range(config.conv_depth)
            ]
            self.stem = nn.Sequential(*(m for conv in convs for m in (conv, nn.SiLU())))
        patch_in = f if self.stem is not None else config.in_channels
        self.patch_embed = nn.Conv2d(patch_in, config.dim, kernel_size=p, stride=p)
        if config.pos == "sincos":
            self.register_buffer("pos_embed", sincos_2d(config.dim, config.grid_size).unsqueeze(0), persistent=False)
        else:
            self.pos_embed = None
            cos, sin = rope_2d(config.head_dim, config.grid_size)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.t_embed = TimestepEmbedder(config.dim, scale=config.time_scale)
        if config.cond == "class":
            self.y_embed = nn.Embedding(config.n_classes + 1, config.dim)  # the last row is the null label
        else:
            self.text = TextEncoder(
                config.vocab_size,
                config.text_len,
                config.dim,
                config.text_depth,
                config.n_heads,
                config.mlp,
                config.mlp_ratio,
            )
            # The pooled caption joins c like SD3's pooled CLIP vector: through a small MLP (SD3 fig. 2).
            d = config.dim
            self.pooled_embed = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
        # Shortcut models (Frans et al. 2024) see the step size d the sampler will take; d = 0 asks for
        # the instantaneous velocity, so with d = 0 the model is an ordinary flow model.
        self.d_embed = TimestepEmbedder(config.dim, scale=config.time_scale) if config.shortcut else None
        # the class's ways in besides c (class_token, class_pixels): None where off
        self.class_token = nn.Embedding(config.n_classes + 1, config.dim) if config.class_token else None
        self.stem_class = self.head_class = None
        if config.class_pixels:  # (N,) -> (N, f): a bias per class, starting at zero (the model as without it)
            self.stem_class = nn.Embedding(config.n_classes + 1, f) if self.stem is not None else None
            self.head_class = nn.Embedding(config.n_classes + 1, f) if config.head == "conv" else None
        self.build_blocks(config)
        head_out = f if config.head == "conv" else config.in_channels
        self.final = FinalLayer(config.dim, p * p * head_out, config.norm)
        self.head = None  # (N, f, H, W) -> (N, C, H, W); one convolution stays a bare Conv2d (older checkpoints' keys)
        if config.head == "conv" and config.conv_depth == 1:
            self.head = nn.Conv2d(f, config.in_channels, kernel_size=3, padding=1)
        elif config.head == "conv":
            convs = [nn.Conv2d(f, f, kernel_size=3, padding=1) for _ in range(config.conv_depth - 1)]
            last = nn.Conv2d(f, config.in_channels, kernel_size=3, padding=1)
            self.head = nn.Sequential(*(m for conv in convs for m in (conv, nn.SiLU())), last)
        self.reset_parameters()

    def build_blocks(self, config: DiTConfig) -> None:
        """The transformer trunk between the embeddings and the final layer (MMDiT builds its own)."""
        self.blocks = nn.ModuleList(DiTBlock(config) for _ in range(config.depth))
        n_skips = config.depth // 2 if config.skips else 0
        self.skip_proj = nn.ModuleList(nn.Linear(2 * config.dim, config.dim) for _ in range(n_skips))

    def trunk(self, tokens: torch.Tensor, c: torch.Tensor, rope) -> torch.Tensor:
        """tokens (N, T, D) through the blocks, the last depth // 2 of them fed by long skips if configured."""
        n_skips = len(self.skip_proj)
        first = len(self.blocks) - n_skips  # blocks before `first` keep their outputs for the skips
        kept = []
        for i, block in enumerate(self.blocks):
            if i >= first:
                proj = self.skip_proj[i - first]
                tokens = proj(torch.cat([tokens, kept.pop()], dim=-1))  # (N, T, 2D) -> (N, T, D)
            tokens = block(tokens, c, rope)
            if i < n_skips:
                kept.append(tokens)
        return tokens

    @property
    def null_class(self) -> int:
        return self.config.n_classes

    def null_condition(self, y: torch.Tensor) -> torch.Tensor:
        """The unconditional input shaped like y, for guidance: the null label (N,) or the empty caption (N, L)."""
        if self.config.cond == "text":
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
            if self.class_token is not None:
                nn.init.normal_(self.class_token.weight, std=0.02)
            for table in (self.stem_class, self.head_class):
                if table is not None:
                    nn.init.zeros_(table.weight)
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
        for proj in getattr(self, "skip_proj", ()):  # a skip starts closed: [I | 0] passes the stream on
            nn.init.zeros_(proj.weight)
            nn.init.zeros_(proj.bias)
            with torch.no_grad():
                proj.weight[:, : self.config.dim].copy_(torch.eye(self.config.dim))
        # The model predicts exactly zero at initialisation: the last map of the head starts at zero.
        last = self.final.linear if self.head is None else self.pixel_convs()[-1]
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)

    def pixel_convs(self) -> list[nn.Conv2d]:
        """The full-resolution 3x3 convolutions of a conv stem and a conv head, in the order they run."""
        parts = [part for part in (self.stem, self.head) if part is not None]
        return [m for part in parts for m in part.modules() if isinstance(m, nn.Conv2d)]

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
        (scores and weighted sum), plus 2 weights H W for a full-resolution conv stem or head. A training
        step costs about 3x this (backward = 2x forward)."""
        config = self.config
        convs = sum(m.weight.numel() for m in self.pixel_convs())
        return (
            2 * self.token_params() * config.n_tokens
            + 4 * config.depth * config.n_tokens**2 * config.dim
            + 2 * convs * config.img_size**2
        )

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> tokens (N, T, D): each row-major p x p patch through ``patch_embed``'s weights.

        The strided convolution is computed as a token linear map over the cut patches (``token_linear``,
        the kernel the other token maps use), never by the convolution kernel: oneDNN's bf16 kernel for a
        16-channel input with a 4x4 stride-4 filter returns wrong values on AMX CPUs (torch 2.14), and the
        linear map also leaves the tokens contiguous, so no residual addition after it inherits a
        transposed layout."""
        n, c, h, w = x.shape
        p = self.config.patch_size
        # Cut channels-last (the conv stem's layout, where the permute below is free), so that the copy moves
        # runs of C values instead of runs of p; the weight is put in the same (ph, pw, C) order. Without a
        # stem the image itself (C = 1 or 3) is copied, a small tensor either way.
        x = x.permute(0, 2, 3, 1)  # (N, H, W, C)
        patches = x.reshape(n, h // p, p, w // p, p, c).transpose(2, 3)  # (N, gh, gw, ph, pw, C)
        patches = patches.reshape(n, (h // p) * (w // p), p * p * c)  # (N, T, p p C)
        weight = self.patch_embed.weight.permute(0, 2, 3, 1).reshape(self.patch_embed.out_channels, -1)  # (D, p p C)
        return token_linear(patches, weight, self.patch_embed.bias)  # (N, T, D)

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """(N, T, p*p*C) -> (N, C, H, W), the inverse of cutting the image into row-major patches: the image
        itself (contiguous), or the conv head's input, channels-last (the layout a convolution reads fastest,
        made by copying runs of C values)."""
        n, p, g = x.shape[0], self.config.patch_size, self.config.grid_size
        c = x.shape[2] // (p * p)
        x = x.reshape(n, g, g, p, p, c)  # (N, gh, gw, ph, pw, C)
        if self.head is None:
            return x.permute(0, 5, 1, 3, 2, 4).reshape(n, c, g * p, g * p)  # (N, C, gh, ph, gw, pw) -> (N, C, H, W)
        x = x.transpose(2, 3).reshape(n, g * p, g * p, c)  # (N, gh, ph, gw, pw, C) -> (N, H, W, C)
        return x.permute(0, 3, 1, 2)  # (N, C, H, W), stored as (N, H, W, C)

    def embed_image(
        self, x: torch.Tensor, y: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """x (N, C, H, W) -> tokens (N, T, D) with their positions, and the RoPE angles (or None); y (N,),
        the labels, where the stem is told the class (``class_pixels``)."""
        config = self.config
        if x.shape[1:] != (config.in_channels, config.img_size, config.img_size):
            raise TinyDiTError(
                f"this model takes images of shape (N, {config.in_channels}, {config.img_size}, {config.img_size}), "
                f"got {tuple(x.shape)}"
            )
        if self.stem is not None:  # a channels-last input gives a channels-last feature map (see patchify)
            x = self.stem(x.contiguous(memory_format=torch.channels_last))
            if self.stem_class is not None and y is not None:
                x = x + self.stem_class(y)[:, :, None, None]  # (N, f, H, W) + (N, f, 1, 1)
        tokens = self.patchify(x)  # (N, T, D)
        if self.pos_embed is not None:
            return tokens + self.pos_embed, None
        return tokens, (self.rope_cos, self.rope_sin)

    def or_null(self, y: torch.Tensor | None, t: torch.Tensor) -> torch.Tensor:
        """y as given, or for y None the unconditional input for t's N images: null labels (N,) or empty
        captions (N, L)."""
        if y is not None:
            return y
        shape = (t.shape[0], self.config.text_len) if self.config.cond == "text" else (t.shape[0],)
        return self.null_condition(torch.zeros(shape, dtype=torch.long, device=t.device))

    def condition(
        self, t: torch.Tensor, y: torch.Tensor | None, d: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """c (N, D) from t (N,), y and d (N,); text models also return the caption's tokens ctx (N, L, D)
        and keep (N, L), True where a token is not padding (class models: None, None)."""
        config = self.config
        y = self.or_null(y, t)
        want = 2 if config.cond == "text" else 1
        if y.dim() != want:
            what = "caption token ids (N, L) from its tokenizer" if want == 2 else "class labels (N,)"
            raise TinyDiTError(f"this {config.cond}-conditioned model takes y as {what}, got shape {tuple(y.shape)}")
        ctx = keep = None
        if config.cond == "class":
            c = self.t_embed(t) + self.y_embed(y)  # (N, D)
        else:
            ctx, pooled, keep = self.text(y)  # (N, L, D), (N, D), (N, L)
            c = self.t_embed(t) + self.pooled_embed(pooled)  # (N, D)
        if self.d_embed is not None:
            d = torch.zeros_like(t) if d is None else d
            if config.finest_step:  # no smaller step was trained (a shortcut model's finest level)
                d = d.clamp_min(config.finest_step)
            c = c + self.d_embed(d)
        return c, ctx, keep

    def forward(
        self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None, d: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x (N, C, H, W), t (N,), y (N,) labels or (N, L) token ids or None, d (N,) step sizes or None
        (shortcut models only) -> v (N, C, H, W)"""
        y = self.or_null(y, t)  # the class's other ways in (class_token, class_pixels) see the null label too
        c, _, _ = self.condition(t, y, d)  # (N, D), y checked; a text DiT reads the caption only through c
        tokens, rope = self.embed_image(x, y)  # (N, T, D)
        n_image = tokens.shape[1]
        if self.class_token is not None:  # the class token last: the image tokens keep their places
            tokens = torch.cat([tokens, self.class_token(y).unsqueeze(1)], dim=1)  # (N, T + 1, D)
            if rope is not None:  # the class token has no place on the grid: it is not rotated
                rope = tuple(torch.cat([r, r.new_full((1, r.shape[1]), float(i == 0))]) for i, r in enumerate(rope))
        tokens = self.trunk(tokens, c, rope)[:, :n_image]  # (N, T, D)
        return self.velocity(x, t, self.decode(tokens, c, y))  # (N, C, H, W)

    def decode(self, tokens: torch.Tensor, c: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """The network's output image (N, C, H, W) from the last tokens (N, T, D) and c (N, D); y (N,), the
        labels, where the head is told the class (``class_pixels``)."""
        out = self.unpatchify(self.final(tokens, c))  # (N, C or conv_channels, H, W)
        if self.head is None:
            return out
        if self.head_class is not None and y is not None:
            out = out + self.head_class(y)[:, :, None, None]  # (N, f, H, W) + (N, f, 1, 1)
        return self.head(out).contiguous()  # (N, C, H, W), contiguous as documented

    def velocity(self, x: torch.Tensor, t: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The velocity (N, C, H, W) from the network's output ``out`` for x_t (N, C, H, W) at t (N,).

        x-prediction (JiT, Li & He 2025): the network outputs the clean image, which lies near a
        low-dimensional manifold, and the velocity follows from the path, v = (x_t - x0) / t. A v- (or
        noise-) predicting network must instead carry the full-rank noise of every patch through its
        width: with 3-channel 4x4 patches (48 values) and a 64-wide token it cannot.
        """
        if self.config.pred == "v":
            return out
        # t in float32 (or wider) for the division: in bf16 (8 significant bits) t, and so v, is off by up to 0.4%
        dtype = torch.promote_types(out.dtype, torch.float32)
        t_ = t.to(dtype).clamp(min=X_PRED_T_MIN).view(-1, 1, 1, 1)  # (N, 1, 1, 1)
        return (x - out) / t_
