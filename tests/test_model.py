import math
import re
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from tinydit.errors import TinyDiTError
from tinydit.models.dit import (
    PRESETS,
    Attention,
    DiT,
    DiTConfig,
    count_params,
    get_preset,
    make_norm,
    norm_modulate,
    rope_2d,
    sincos_2d,
)
from tinydit.models.layers import SwiGLU, apply_rope, swiglu_hidden

SMALL = [
    DiTConfig(dim=32, depth=2, n_heads=2),
    DiTConfig(img_size=28, in_channels=1, patch_size=4, dim=32, depth=1, n_heads=4),
    DiTConfig(img_size=16, in_channels=3, patch_size=2, dim=48, depth=2, n_heads=3, n_classes=4),
]

# The contract every variant keeps (shapes, zero output at initialisation, gradients, guidance) is in
# tests/test_contract.py; this file checks the DiT's own pieces.


def test_unpatchify_inverts_patchify_layout():
    cfg = DiTConfig(img_size=8, in_channels=2, patch_size=2, dim=8, depth=1, n_heads=2)
    model = DiT(cfg)
    x = torch.randn(2, 2, 8, 8)
    # cut into row-major patches by hand: (N, C, g, p, g, p) -> (N, g, g, p, p, C)
    patches = x.reshape(2, 2, 4, 2, 4, 2).permute(0, 2, 4, 3, 5, 1).reshape(2, 16, 8)
    assert torch.equal(model.unpatchify(patches), x)


def test_the_conv_stem_hands_patchify_a_channels_last_map_and_the_head_gets_one_back(monkeypatch):
    """Channels-last, cutting patches copies runs of C values rather than runs of p (the faster copy)."""
    cfg = DiTConfig(
        img_size=8, in_channels=3, patch_size=2, dim=8, depth=1, n_heads=2, stem="conv", head="conv", pred="v"
    )
    model = DiT(cfg)
    maps = []
    real_patchify, real_head = model.patchify, model.head.forward
    monkeypatch.setattr(model, "patchify", lambda x: maps.append(x) or real_patchify(x))
    monkeypatch.setattr(model.head, "forward", lambda x: maps.append(x) or real_head(x))
    v = model(torch.randn(2, 3, 8, 8), torch.rand(2), torch.tensor([0, 1]))
    assert [m.shape for m in maps] == [(2, model.config.conv_channels, 8, 8)] * 2 and v.shape == (2, 3, 8, 8)
    assert all(m.is_contiguous(memory_format=torch.channels_last) for m in maps)
    assert v.is_contiguous()  # what the model returns keeps the usual layout: v.view(N, -1) works


def test_patchify_hands_on_contiguous_tokens():
    """A transposed view would pass its layout on to every residual addition, and each norm would copy."""
    model = DiT(DiTConfig(img_size=8, in_channels=2, patch_size=2, dim=8, depth=1, n_heads=2))
    tokens, _ = model.embed_image(torch.randn(2, 2, 8, 8))
    assert tokens.shape == (2, 16, 8) and tokens.is_contiguous()


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("channels, patch", [(3, 4), (16, 4), (16, 2), (1, 4)])
def test_patchify_is_the_strided_convolution_of_its_weights(channels, patch, layout):
    cfg = DiTConfig(img_size=16, in_channels=channels, patch_size=patch, dim=32, depth=1, n_heads=2)
    model = DiT(cfg)
    torch.nn.init.normal_(model.patch_embed.bias)
    x = torch.randn(3, channels, 16, 16).contiguous(memory_format=layout)
    want = F.conv2d(x, model.patch_embed.weight, model.patch_embed.bias, stride=patch)  # (N, D, g, g)
    torch.testing.assert_close(model.patchify(x), want.flatten(2).transpose(1, 2), rtol=1e-5, atol=1e-5)


def test_bf16_autocast_forward_agrees_with_fp32_for_the_conv_stem():
    """oneDNN's bf16 convolution for 16 input channels and a 4x4 stride-4 filter returns wrong values on
    AMX CPUs; the conv stem feeds the patch embedding exactly those 16 channels. bf16 rounding alone stays
    within a few percent of the fp32 output."""
    torch.manual_seed(0)
    model = DiT(DiTConfig(dim=64, depth=2, n_heads=2, patch_size=4, stem="conv", head="conv", skips=True)).eval()
    for p in model.parameters():  # away from the zero-initialised output, so the whole path is compared
        torch.nn.init.normal_(p, std=0.1)
    x, t, y = torch.randn(8, 3, 32, 32), torch.rand(8), torch.randint(0, 10, (8,))
    with torch.no_grad():
        want = model(x, t, y)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = model(x, t, y).float()
    assert ((got - want).norm() / want.norm()).item() < 0.05


def test_output_depends_on_label_and_time_after_training_step():
    torch.manual_seed(0)
    cfg = SMALL[0]
    model = DiT(cfg)
    for p in model.parameters():  # move off the zero init
        p.data.add_(0.05 * torch.randn_like(p))
    x = torch.randn(1, 3, 32, 32)
    base = model(x, torch.tensor([0.3]), torch.tensor([1]))
    assert not torch.allclose(base, model(x, torch.tensor([0.3]), torch.tensor([2])))
    assert not torch.allclose(base, model(x, torch.tensor([0.7]), torch.tensor([1])))


def test_sincos_positions_are_distinct_and_bounded():
    pos = sincos_2d(32, 4)
    assert pos.shape == (16, 32) and pos.abs().max() <= 1
    assert torch.cdist(pos, pos).fill_diagonal_(1).min() > 0.1


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_names_match_real_sizes(name):
    count = count_params(DiT(get_preset(name)))  # 32x32 RGB, 10 classes
    stated = re.fullmatch(r"dit-([\d.]+)m", name).group(1)
    digits = len(stated.replace(".", "").lstrip("0"))  # significant digits in the name
    assert float(f"{count / 1e6:.{digits}g}") == float(stated), (name, count)


def test_preset_completed_by_data():
    cfg = get_preset("dit-1.9m", img_size=28, in_channels=1, n_classes=10)
    assert (cfg.img_size, cfg.in_channels, cfg.n_tokens) == (28, 1, 49)


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(patch_size=5), "does not divide"),
        (dict(dim=30, n_heads=4), "not divisible"),
        (dict(depth=0), "depth must be >= 1"),
    ],
)
def test_config_validation_names_the_value(bad, match):
    with pytest.raises(TinyDiTError, match=match):
        replace(DiTConfig(), **bad)


def test_unknown_preset_lists_the_choices():
    with pytest.raises(TinyDiTError, match="dit-1.9m"):
        get_preset("huge")


def test_wrong_input_shape_is_a_clear_error():
    model = DiT(SMALL[0])
    with pytest.raises(TinyDiTError, match=r"\(N, 3, 32, 32\)"):
        model(torch.randn(1, 1, 28, 28), torch.rand(1), torch.tensor([0]))


def naive_attention(q, k, v, mask=None):
    """softmax(q k^T / sqrt(Dh)) v written out, the reference for the fused kernel."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (N, h, T, T)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v


@pytest.mark.parametrize("masked", [False, True])
def test_sdpa_attention_matches_naive_softmax_reference(masked):
    torch.manual_seed(0)
    attn = Attention(dim=32, n_heads=4)
    x = torch.randn(3, 10, 32)
    mask = None
    if masked:  # key padding: image n may attend to its first 10 - 3n tokens only
        keep = torch.arange(10) < torch.tensor([10, 7, 4]).unsqueeze(1)  # (N, T)
        mask = keep[:, None, None, :]  # (N, 1, 1, T)
    q, k, v = attn.heads(x)
    ref = attn.proj(naive_attention(q, k, v, mask).transpose(1, 2).reshape(3, 10, 32))
    torch.testing.assert_close(attn(x, attn_mask=mask), ref, rtol=1e-5, atol=1e-5)
    if masked:  # the masked-out tokens really change nothing
        x2 = x.clone()
        x2[1, 7:] = 100 * torch.randn(3, 32)
        torch.testing.assert_close(attn(x2, attn_mask=mask)[1, :7], attn(x, attn_mask=mask)[1, :7])


def test_rmsnorm_matches_its_formula():
    x = 3 * torch.randn(4, 5, 16) + 1
    expected = x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(make_norm("rmsnorm", 16)(x), expected)
    layer = make_norm("layernorm", 16)(x)  # LayerNorm also removes the mean: a different map
    assert not torch.allclose(layer, expected, atol=1e-2)


def _max_logit(attn: Attention, x: torch.Tensor) -> float:
    q, k, _ = attn.heads(x)
    return (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).abs().max().item()


def test_qk_norm_bounds_attention_logits_for_large_inputs():
    torch.manual_seed(0)
    x = torch.randn(2, 16, 32)
    plain, normed = Attention(32, 4), Attention(32, 4, qk_norm=True)
    normed.qkv.load_state_dict(plain.qkv.state_dict())
    head_dim = 8
    for scale in (1.0, 1e2, 1e4):
        # |q_hat . k_hat| <= |q_hat| |k_hat| = Dh with unit gains, so logits stay within sqrt(Dh).
        assert _max_logit(normed, scale * x) <= math.sqrt(head_dim) + 1e-4
    assert _max_logit(plain, 1e4 * x) > 1e6  # without the norm the logits grow with x squared


def test_rope_scores_depend_only_on_the_2d_offset():
    torch.manual_seed(0)
    g, head_dim = 5, 16
    cos, sin = rope_2d(head_dim, g)
    q = apply_rope(torch.randn(head_dim).expand(1, 1, g * g, head_dim), cos, sin)[0, 0]  # (T, Dh)
    k = apply_rope(torch.randn(head_dim).expand(1, 1, g * g, head_dim), cos, sin)[0, 0]
    scores = q @ k.T  # (T, T): the same content at every position, so only positions can differ
    by_offset: dict[tuple[int, int], list[float]] = {}
    for i in range(g * g):
        for j in range(g * g):
            offset = (i // g - j // g, i % g - j % g)
            by_offset.setdefault(offset, []).append(scores[i, j].item())
    for values in by_offset.values():
        assert max(values) - min(values) < 1e-4
    means = {o: v[0] for o, v in by_offset.items()}
    assert abs(means[(0, 1)] - means[(1, 0)]) > 1e-3  # rows and columns are told apart
    assert len({round(v, 3) for v in means.values()}) > 0.9 * len(means)  # offsets are distinguishable
    # Rotations keep norms: RoPE moves information between channels, it never scales it.
    torch.testing.assert_close(q.norm(dim=-1), q.norm(dim=-1)[0].expand(g * g))


def test_swiglu_computes_its_formula_on_the_stacked_fc1():
    """fc1 stacks W_gate over W_up: the layout of every SwiGLU checkpoint, whatever the forward does with it."""
    torch.manual_seed(0)
    mlp = SwiGLU(16, 24)
    x = torch.randn(2, 5, 16)
    gate, up = mlp.fc1(x).chunk(2, dim=-1)
    torch.testing.assert_close(mlp(x), mlp.fc2(F.silu(gate) * up), rtol=1e-5, atol=1e-6)


def test_swiglu_has_about_the_parameters_of_the_gelu_mlp():
    base = DiT(DiTConfig(dim=128, depth=2, n_heads=4))
    swiglu = DiT(DiTConfig(dim=128, depth=2, n_heads=4, mlp="swiglu"))
    assert swiglu_hidden(128, 4.0) == 344  # 2/3 of 512, rounded up to a multiple of 8
    assert abs(count_params(swiglu) / count_params(base) - 1) < 0.01


def test_flops_count_the_token_matmuls_and_attention():
    cfg = DiTConfig(dim=32, depth=2, n_heads=2)  # 3x32x32, patch 4: T = 64
    model = DiT(cfg)
    per_block = 3 * 32 * 32 + 32 * 32 + 2 * 4 * 32 * 32  # QKV, projection, MLP
    patch = 3 * 4 * 4 * 32
    assert model.token_params() == 2 * per_block + 2 * patch  # embedding in, output layer out
    assert model.flops_per_image() == 2 * model.token_params() * 64 + 4 * 2 * 64**2 * 32


def test_configs_from_older_checkpoints_load_with_the_original_architecture():
    old = {k: v for k, v in DiTConfig().to_dict().items() if k not in ("norm", "qk_norm", "mlp", "pos")}
    cfg = DiTConfig.from_dict(old)
    assert (cfg.norm, cfg.qk_norm, cfg.mlp, cfg.pos) == ("layernorm", False, "gelu", "sincos")


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(norm="batchnorm"), "norm must be one of layernorm, rmsnorm"),
        (dict(mlp="relu"), "mlp must be one of gelu, swiglu"),
        (dict(pos="learned"), "pos must be one of sincos, rope"),
        (dict(dim=24, n_heads=4, pos="rope"), "divisible by 4"),
    ],
)
def test_switch_validation_names_the_choices(bad, match):
    with pytest.raises(TinyDiTError, match=match):
        replace(DiTConfig(), **bad)


def test_x_prediction_derives_the_velocity_from_the_predicted_clean_image():
    torch.manual_seed(0)
    cfg = replace(SMALL[0], pred="x")
    model = DiT(cfg)
    x = torch.randn(3, cfg.in_channels, cfg.img_size, cfg.img_size)
    t = torch.tensor([0.01, 0.5, 1.0])
    y = torch.tensor([0, 1, cfg.n_classes])
    # At initialisation the network outputs x0 = 0, so the velocity points straight from the origin to x_t.
    v = model(x, t, y)
    assert torch.allclose(v, x / t.clamp(min=0.05).view(-1, 1, 1, 1))
    # Off the initialisation the network's clean image comes back as x_t - t v (above the clip).
    for p in model.parameters():
        p.data.add_(0.05 * torch.randn_like(p))
    v_model = model(x, t, y)
    tokens, rope = model.embed_image(x)
    c, _, _ = model.condition(t, y)
    for block in model.blocks:
        tokens = block(tokens, c, rope)
    x0 = model.unpatchify(model.final(tokens, c))  # the network's own output: (N, C, H, W)
    assert torch.allclose(x[1:] - t[1:].view(-1, 1, 1, 1) * v_model[1:], x0[1:], atol=1e-5)
    # A clean image is a fixed point: if the network returned x_t itself, the velocity would be zero.
    assert torch.equal(model.velocity(x, t, x), torch.zeros_like(x))


def test_prediction_switch_is_validated():
    with pytest.raises(TinyDiTError, match="pred"):
        DiTConfig(pred="eps")


def test_presets_predict_x_on_rgb_and_v_on_grayscale_unless_told():
    assert get_preset("dit-1.9m", in_channels=3).pred == "x"
    assert get_preset("dit-1.9m", in_channels=1).pred == "v"
    assert get_preset("dit-1.9m", in_channels=1, pred="x").pred == "x"
    stored = get_preset("dit-0.2m", in_channels=1).to_dict()
    assert stored["pred"] == "v" and DiTConfig.from_dict(stored).pred == "v"  # checkpoints hold the resolved value
    assert DiTConfig().pred == "v"  # configs written before the field existed load as v


def test_norm_modulate_runs_in_the_autocast_dtype_on_cpu_and_in_fp32_without_it():
    norm = make_norm("layernorm", 16)
    x, shift, scale = 3 * torch.randn(2, 5, 16) + 1, torch.randn(2, 16), torch.randn(2, 16)
    exact = norm(x) * (1 + scale[:, None]) + shift[:, None]
    torch.testing.assert_close(norm_modulate(norm, x, shift, scale), exact)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = norm_modulate(norm, x, shift.bfloat16(), scale.bfloat16())
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), exact, rtol=3e-2, atol=3e-2)  # bf16 rounding, nothing more


def test_rope_keeps_the_dtype_of_its_input():
    cos, sin = rope_2d(8, 4)  # fp32 tables
    assert apply_rope(torch.randn(2, 2, 16, 8, dtype=torch.bfloat16), cos, sin).dtype == torch.bfloat16


def test_conv_stem_head_and_long_skips_keep_shapes_and_start_at_zero():
    cfg = get_preset("dit-1.4m", n_classes=4)
    assert (cfg.stem, cfg.head, cfg.skips, cfg.qk_norm) == ("conv", "conv", True, True)
    model = DiT(cfg)
    assert len(model.skip_proj) == cfg.depth // 2
    x, t, y = torch.randn(3, 3, 32, 32), torch.rand(3), torch.tensor([0, 1, 2])
    assert model(x, t, y).shape == x.shape
    out = model.decode(torch.randn(3, cfg.n_tokens, cfg.dim), torch.randn(3, cfg.dim))
    assert out.shape == x.shape and out.abs().max() == 0  # the head's last map (the conv) starts at zero


def test_a_closed_long_skip_passes_the_stream_on_and_then_learns():
    base = get_preset("dit-1.3m", n_classes=4)
    plain, skipped = DiT(base), DiT(DiTConfig(**{**base.to_dict(), "skips": True}))
    skipped.load_state_dict(plain.state_dict(), strict=False)  # the same weights, skips at their start
    for p in plain.parameters():  # move every weight off its initial zero so the blocks do something
        p.data.add_(0.05 * torch.randn_like(p))
    skipped.load_state_dict(plain.state_dict(), strict=False)
    x, t, y = torch.randn(2, 3, 32, 32), torch.rand(2), torch.tensor([0, 3])
    torch.testing.assert_close(skipped(x, t, y), plain(x, t, y))  # [I | 0]: as if there were no skip
    skipped(x, t, y).pow(2).mean().backward()
    assert skipped.skip_proj[0].weight.grad[:, base.dim :].abs().sum() > 0  # the skip half gets a gradient


def test_conv_head_mixes_neighbouring_patches():
    model = DiT(get_preset("dit-1.4m", n_classes=4))
    for p in model.parameters():
        p.data.add_(0.05 * torch.randn_like(p))
    c = torch.randn(1, model.config.dim)
    tokens = torch.zeros(1, model.config.n_tokens, model.config.dim, requires_grad=True)
    out = model.decode(tokens, c)  # (1, 3, 32, 32)
    out[0, :, 4, 4].sum().backward()  # the first pixel of the token at grid (1, 1)
    touched = tokens.grad.abs().sum(-1).view(8, 8) > 0
    assert touched[1, 1] and touched[0, 0] and touched[0, 1] and touched[1, 0]  # its neighbours up and left
    assert not touched[2, 2]


def test_deeper_conv_stem_and_head_start_at_zero_and_keep_the_single_convs_keys():
    one = DiT(get_preset("dit-1.4m", n_classes=4))
    assert isinstance(one.head, torch.nn.Conv2d) and "head.weight" in one.state_dict()  # older checkpoints load
    cfg = get_preset("dit-1.4m", n_classes=4, patch_size=8, conv_depth=2, conv_channels=32)
    model = DiT(cfg)
    convs = [m for part in (model.stem, model.head) for m in part.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(m.in_channels, m.out_channels) for m in convs] == [(3, 32), (32, 32), (32, 32), (32, 3)]
    x, t, y = torch.randn(2, 3, 32, 32), torch.rand(2), torch.tensor([0, 1])
    assert model(x, t, y).shape == x.shape and cfg.n_tokens == 16
    out = model.decode(torch.randn(2, cfg.n_tokens, cfg.dim), torch.randn(2, cfg.dim))
    assert out.abs().max() == 0  # the head's last convolution starts at zero, as a single one does
    pixel_convs = 2 * sum(m.weight.numel() for m in convs) * 32 * 32
    assert model.flops_per_image() - pixel_convs == 2 * model.token_params() * 16 + 4 * cfg.depth * 16**2 * cfg.dim
    with pytest.raises(TinyDiTError, match="conv_depth"):
        DiTConfig(stem="conv", conv_depth=0)


@pytest.mark.parametrize("switch", ["class_token", "class_pixels"])
def test_the_class_reaches_the_network_through_its_other_way_in(switch):
    """With every label's adaLN embedding made the same, only the switch's own way in can tell the labels
    apart: the outputs differ with it and agree without it (the negative control)."""
    outputs = {}
    for on in (True, False):
        torch.manual_seed(0)
        model = DiT(get_preset("dit-1.4m", n_classes=4, **{switch: on}))
        for p in model.parameters():  # past the zero initialisations, so that every way in carries something
            p.data.add_(0.05 * torch.randn_like(p))
        model.y_embed.weight.data[:] = model.y_embed.weight.data[0]  # c no longer knows the label
        x, t = torch.randn(1, 3, 32, 32).expand(2, -1, -1, -1), torch.full((2,), 0.7)
        outputs[on] = model(x, t, torch.tensor([0, 3]))
    assert not torch.allclose(outputs[True][0], outputs[True][1])
    torch.testing.assert_close(outputs[False][0], outputs[False][1])


def test_class_ways_in_start_as_the_model_without_them_and_leave_the_image_tokens_in_place():
    base = get_preset("dit-1.4m", n_classes=4)
    plain = DiT(base)
    both = DiT(replace(base, class_token=True, class_pixels=True))
    assert both.load_state_dict(plain.state_dict(), strict=False).unexpected_keys == []
    for p in plain.parameters():
        p.data.add_(0.05 * torch.randn_like(p))
    both.load_state_dict(plain.state_dict(), strict=False)
    both.class_token.weight.data.zero_()  # a zero token, which only adds a key of score 0 to each softmax
    x, t, y = torch.randn(2, 3, 32, 32), torch.rand(2), torch.tensor([1, 2])
    # the pixel biases start at zero: with the class token's key the only difference, the outputs move a little
    assert not torch.equal(both(x, t, y), plain(x, t, y))
    both.class_token = None
    torch.testing.assert_close(both(x, t, y), plain(x, t, y))  # the zero pixel biases change nothing
    with pytest.raises(TinyDiTError, match="a text model takes neither"):
        DiTConfig(cond="text", vocab_size=8, text_len=4, class_token=True)
    with pytest.raises(TinyDiTError, match="set stem or head to conv"):
        DiTConfig(class_pixels=True)


def test_stem_and_head_names_are_checked():
    with pytest.raises(TinyDiTError, match="DiTConfig.head must be one of linear, conv"):
        DiTConfig(head="unet")
    with pytest.raises(TinyDiTError, match="conv_channels"):
        DiTConfig(stem="conv", conv_channels=0)
