"""MMDiT and the text-conditioned DiT: joint attention against references, the padding mask, the zero
output at initialisation, presets, and guidance with the empty prompt."""

import math
import re
from dataclasses import replace

import pytest
import torch

from tinydit.data.text import BOS, PAD
from tinydit.errors import TinyDiTError
from tinydit.models.dit import Attention, DiT, DiTConfig, count_params, rope_2d
from tinydit.models.dit import get_preset as get_dit_preset
from tinydit.models.mmdit import PRESETS, MMDiT, MMDiTConfig, get_preset, joint_attention

TEXT = dict(vocab_size=12, text_len=6)
BASE = MMDiTConfig(dim=32, depth=2, n_heads=2, text_depth=1, **TEXT)
VARIANTS = [
    BASE,
    replace(BASE, single_blocks=1),
    replace(BASE, pos="rope", single_blocks=1),
    replace(BASE, norm="rmsnorm", qk_norm=True, mlp="swiglu"),
    replace(BASE, img_size=28, in_channels=1, depth=1, text_depth=0, shortcut=True),
    DiTConfig(dim=32, depth=2, n_heads=2, text_depth=1, cond="text", **TEXT),  # the pooled-text baseline
]


def _id(c) -> str:
    kind = f"mmdit-s{c.single_blocks}" if isinstance(c, MMDiTConfig) else "dit-text"
    return f"{kind}-{c.in_channels}x{c.img_size}-{c.pos}-{c.mlp}{'-qk' if c.qk_norm else ''}"


def _model(cfg, jitter: float = 0.0):
    torch.manual_seed(0)
    model = MMDiT(cfg) if isinstance(cfg, MMDiTConfig) else DiT(cfg)
    for p in model.parameters():  # off the zero init, so every weight matters
        p.data.add_(jitter * torch.randn_like(p))
    return model


def _captions(n: int, text_len: int = 6) -> torch.Tensor:
    """n captions of 0 to text_len - 1 words (ids 3..11), BOS first, padded: (n, text_len)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 12, (n, text_len), generator=g)
    lengths = torch.arange(n) % text_len + 1  # BOS plus 0, 1, ... words
    ids[torch.arange(text_len) >= lengths[:, None]] = PAD
    ids[:, 0] = BOS
    return ids


@pytest.mark.parametrize("cfg", VARIANTS, ids=_id)
def test_padded_text_tokens_change_nothing(cfg):
    model = _model(cfg, jitter=0.05)
    x, t, y = torch.randn(4, cfg.in_channels, cfg.img_size, cfg.img_size), torch.rand(4), _captions(4)
    v = model(x, t, y)
    with torch.no_grad():  # any embedding for the padding id, and for the positions only padding holds
        model.text.tok_embed.weight[PAD] = 50 * torch.randn(cfg.dim)
        model.text.pos_embed[:, 4:] += 5 * torch.randn(2, cfg.dim)  # y[3] holds 4 ids: positions 4, 5 are padding
    torch.testing.assert_close(model(x, t, y), v, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cfg", VARIANTS, ids=_id)
def test_output_depends_on_the_caption_and_its_word_order(cfg):
    model = _model(cfg, jitter=0.05)
    x, t = torch.randn(1, cfg.in_channels, cfg.img_size, cfg.img_size).expand(3, -1, -1, -1), torch.full((3,), 0.5)
    y = torch.tensor([[BOS, 3, 4, 5, PAD, PAD], [BOS, 5, 4, 3, PAD, PAD], [BOS, 3, 4, 6, PAD, PAD]])
    v = model(x, t, y)
    assert not torch.allclose(v[0], v[1], atol=1e-5) and not torch.allclose(v[0], v[2], atol=1e-5)


def _naive(q, k, v, keep):
    """softmax(q k^T / sqrt(Dh)) v with the keys masked, written out."""
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~keep, float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("rope", [False, True])
def test_joint_attention_is_one_self_attention_over_the_joined_sequence(rope):
    torch.manual_seed(0)
    n, n_img, n_txt, d = 3, 16, 5, 32
    x_attn = Attention(d, 4, qk_norm=True)
    ctx_attn = Attention(d, 4, qk_norm=True)
    ctx_attn.load_state_dict(x_attn.state_dict())  # the same projections for both streams
    x, ctx = torch.randn(n, n_img, d), torch.randn(n, n_txt, d)
    keep_txt = torch.arange(n_txt) < torch.tensor([5, 3, 1]).unsqueeze(1)  # (N, L)
    keep = torch.cat([torch.ones(n, n_img, dtype=torch.bool), keep_txt], 1)[:, None, None, :]  # (N, 1, 1, T + L)
    angles = rope_2d(d // 4, 4) if rope else None
    out_x, out_ctx = joint_attention(x_attn, ctx_attn, x, ctx, keep, angles)
    joined_angles = None
    if rope:  # the text tokens are not rotated: cos 1, sin 0
        cos, sin = angles
        joined_angles = (torch.cat([cos, torch.ones(n_txt, cos.shape[1])]), torch.cat([sin, torch.zeros(n_txt, 4)]))
    ref = x_attn(torch.cat([x, ctx], 1), joined_angles, keep)  # (N, T + L, D)
    torch.testing.assert_close(out_x, ref[:, :n_img], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_ctx, ref[:, n_img:], rtol=1e-5, atol=1e-5)


def test_joint_attention_with_two_sets_of_weights_matches_a_written_out_reference():
    torch.manual_seed(0)
    n, n_img, n_txt, d, h = 2, 9, 4, 24, 3
    x_attn, ctx_attn = Attention(d, h), Attention(d, h)
    x, ctx = torch.randn(n, n_img, d), torch.randn(n, n_txt, d)
    keep = torch.ones(n, 1, 1, n_img + n_txt, dtype=torch.bool)
    keep[1, ..., n_img + 2 :] = False  # the second caption: 2 tokens, then padding

    def split(z):  # (N, S, 3D) -> 3 x (N, h, S, Dh)
        return [p.unflatten(-1, (h, d // h)).transpose(1, 2) for p in z.chunk(3, dim=-1)]

    qx, kx, vx = split(x @ x_attn.qkv.weight.T + x_attn.qkv.bias)
    qc, kc, vc = split(ctx @ ctx_attn.qkv.weight.T + ctx_attn.qkv.bias)
    out = _naive(torch.cat([qx, qc], 2), torch.cat([kx, kc], 2), torch.cat([vx, vc], 2), keep)
    out = out.transpose(1, 2).flatten(2)  # (N, T + L, D)
    out_x, out_ctx = joint_attention(x_attn, ctx_attn, x, ctx, keep)
    torch.testing.assert_close(out_x, x_attn.proj(out[:, :n_img]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_ctx, ctx_attn.proj(out[:, n_img:]), rtol=1e-5, atol=1e-5)

    # A keys-and-values-only text stream (the last block's) gives the image tokens the same result.
    kv_only = Attention(d, h, queries=False)
    with torch.no_grad():
        kv_only.qkv.weight.copy_(ctx_attn.qkv.weight[d:])
        kv_only.qkv.bias.copy_(ctx_attn.qkv.bias[d:])
    out_x2, none = joint_attention(x_attn, kv_only, x, ctx, keep)
    assert none is None
    torch.testing.assert_close(out_x2, out_x, rtol=1e-5, atol=1e-5)


def test_the_last_joint_block_keeps_only_the_text_keys_and_values():
    last = _model(BASE).blocks[-1].ctx
    assert last.attn.proj is None and not hasattr(last, "mlp") and last.adaLN[-1].out_features == 2 * BASE.dim
    assert _model(BASE).blocks[0].ctx.attn.proj is not None
    # With single-stream blocks after it, the text output is used, so the last joint block keeps it.
    assert _model(replace(BASE, single_blocks=1)).blocks[-1].ctx.attn.proj is not None


def test_config_errors_name_the_fix():
    with pytest.raises(TinyDiTError, match="use `model` dit for class labels"):
        MMDiTConfig(cond="class", **TEXT)
    with pytest.raises(TinyDiTError, match="take both from the tokenizer"):
        MMDiTConfig()
    with pytest.raises(TinyDiTError, match="single_blocks must be >= 0"):
        replace(BASE, single_blocks=-1)
    with pytest.raises(TinyDiTError, match=r"takes y as caption token ids \(N, L\)"):
        _model(BASE)(torch.randn(2, 3, 32, 32), torch.rand(2), torch.tensor([0, 1]))
    with pytest.raises(TinyDiTError, match=r"takes y as class labels \(N,\)"):
        DiT(DiTConfig(dim=32, depth=1, n_heads=2))(torch.randn(2, 3, 32, 32), torch.rand(2), _captions(2))
    with pytest.raises(TinyDiTError, match="unknown MMDiT preset 'mmdit-huge'"):
        get_preset("mmdit-huge")


SHAPES_TEXT = dict(vocab_size=16, text_len=8, n_classes=4)  # the shapes captions' tokenizer (tests/test_text.py)


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_names_match_real_sizes(name):
    count = count_params(MMDiT(get_preset(name, **SHAPES_TEXT)))
    stated = re.fullmatch(r"mmdit-([\d.]+)m", name).group(1)
    digits = len(stated.replace(".", "").lstrip("0"))
    assert float(f"{count / 1e6:.{digits}g}") == float(stated), (name, count)


def test_mmdit_2_3m_has_exactly_the_parameters_of_the_pooled_text_dit_1_9m():
    # The pair of benchmarks/text_to_image.py: the same width, text encoder and parameter count.
    mmdit = MMDiT(get_preset("mmdit-2.3m", **SHAPES_TEXT))
    dit = DiT(get_dit_preset("dit-1.9m", cond="text", **SHAPES_TEXT))
    assert count_params(mmdit) == count_params(dit) == 2_318_384
    assert mmdit.flops_per_image() < dit.flops_per_image()  # image tokens pass through 4 blocks' weights, not 6
