"""The contract every model variant keeps, checked on all of them through the registry: the class DiT with
each architecture switch, the text DiT, MMDiT with and without single-stream blocks, and shortcut models.

    forward(x (N, C, H, W), t (N,), y (N,) labels | (N, L) caption ids | None[, d (N,)]) -> v (N, C, H, W)
"""

from dataclasses import replace

import pytest
import torch
from conftest import dead_parameters_after_sgd, sample_with

from tinydit.flow.guidance import guided_velocity, null_condition
from tinydit.models.dit import SWITCHES, DiTConfig
from tinydit.models.mmdit import MMDiTConfig
from tinydit.models.registry import build_model, config_from_dict, type_of
from tinydit.tokens import BOS, PAD

TEXT = dict(vocab_size=12, text_len=6)
SMALL = [
    DiTConfig(dim=32, depth=2, n_heads=2),
    DiTConfig(img_size=28, in_channels=1, patch_size=4, dim=32, depth=1, n_heads=4),
    DiTConfig(img_size=16, in_channels=3, patch_size=2, dim=48, depth=2, n_heads=3, n_classes=4),
]
MMDIT = MMDiTConfig(dim=32, depth=2, n_heads=2, text_depth=1, **TEXT)
VARIANTS = [
    *SMALL,
    *(replace(SMALL[0], **sw) for name, sw in SWITCHES.items() if name != "baseline"),  # each switch, and all
    replace(SMALL[0], shortcut=True),
    DiTConfig(dim=32, depth=2, n_heads=2, text_depth=1, cond="text", **TEXT),  # the pooled-text DiT
    DiTConfig(dim=32, depth=1, n_heads=2, text_depth=1, cond="text", shortcut=True, pred="x", **TEXT),
    MMDIT,
    replace(MMDIT, single_blocks=1),
    replace(MMDIT, pos="rope", single_blocks=1),
    replace(MMDIT, norm="rmsnorm", qk_norm=True, mlp="swiglu"),
    replace(MMDIT, img_size=28, in_channels=1, depth=1, text_depth=0, shortcut=True),
]


def _id(c: DiTConfig) -> str:
    kind = f"mmdit-s{c.single_blocks}" if isinstance(c, MMDiTConfig) else f"dit-{c.cond}"
    return (
        f"{kind}-{c.in_channels}x{c.img_size}p{c.patch_size}-{c.norm}-{c.mlp}-{c.pos}{'-qk' if c.qk_norm else ''}"
        f"-{c.pred}{'-shortcut' if c.shortcut else ''}"
    )


def _kind(config: DiTConfig) -> str:
    return "mmdit" if isinstance(config, MMDiTConfig) else "dit"


def _model(config: DiTConfig, jitter: float = 0.0):
    torch.manual_seed(0)
    model = build_model(_kind(config), config)
    for p in model.parameters():  # off the zero init, so every weight matters
        p.data.add_(jitter * torch.randn_like(p))
    return model


def _conditions(config: DiTConfig, n: int) -> torch.Tensor:
    """n labels (N,), the null label among them, or n captions of 0 to L - 1 words, BOS first: (N, L)."""
    if config.cond == "class":
        return torch.arange(n) % (config.n_classes + 1)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, config.vocab_size, (n, config.text_len), generator=g)
    lengths = torch.arange(n) % config.text_len + 1  # BOS plus 0, 1, ... words
    ids[torch.arange(config.text_len) >= lengths[:, None]] = PAD
    ids[:, 0] = BOS
    return ids


def _inputs(config: DiTConfig, n: int):
    x = torch.randn(n, config.in_channels, config.img_size, config.img_size)
    return x, torch.rand(n), _conditions(config, n)


@pytest.mark.parametrize("config", VARIANTS, ids=_id)
def test_forward_shape_and_zero_output_at_init(config):
    model = _model(config)
    x, t, y = _inputs(config, 3)
    v = model(x, t, y)
    assert v.shape == x.shape and v.dtype == torch.float32
    # adaLN-Zero + zeroed output layer: the network outputs zero; for x-prediction that is the clean
    # image x0 = 0, so the velocity is (x_t - 0) / t.
    expected = torch.zeros_like(x) if config.pred == "v" else x / t.clamp(min=0.05).view(-1, 1, 1, 1)
    assert torch.equal(v, expected)
    assert torch.equal(model(x, t, None), expected)  # None: the unconditional input of either kind


@pytest.mark.parametrize("config", VARIANTS, ids=_id)
def test_gradients_reach_every_parameter(config):
    model = _model(config)
    x, t, y = _inputs(config, 6)
    y = y % config.n_classes if config.cond == "class" else y  # real labels: the null row is trained by dropout
    # Step 1 moves the output layer, step 2 the gates, step 3 (class models) every parameter; a text
    # stream's own weights are reached one step after the gates that read it.
    steps = 3 if config.cond == "class" and not config.shortcut else 4
    args = (x, t, y, torch.rand(6)) if config.shortcut else (x, t, y)
    dead = dead_parameters_after_sgd(model, args, steps=steps)
    assert dead == [], dead


@pytest.mark.parametrize("config", VARIANTS, ids=_id)
def test_guidance_is_one_batched_forward_against_the_models_null_condition(config):
    model = _model(config, jitter=0.05).eval()
    x, _, y = _inputs(config, 3)
    t = torch.full((3,), 0.6)
    null = null_condition(model, y)
    assert null.shape == y.shape and null.dtype == y.dtype
    calls = []
    model.register_forward_hook(lambda m, args, out: calls.append(args[2].clone()))
    with torch.no_grad():
        v, nfe = guided_velocity(model, x, t, y, 3.0)
        assert nfe == 2 and len(calls) == 1 and torch.equal(calls[0], torch.cat([y, null]))
        v_cond, v_uncond = model(x, t, y), model(x, t, null)
    torch.testing.assert_close(v, v_uncond + 3.0 * (v_cond - v_uncond), rtol=1e-4, atol=1e-5)
    res = sample_with("euler", model, x, y, steps=2, cfg_scale=2.0)  # the samplers take y as it is
    assert res.x.shape == x.shape and res.nfe == 4 and torch.isfinite(res.x).all()


@pytest.mark.parametrize("config", VARIANTS, ids=_id)
def test_the_checkpoint_form_rebuilds_the_same_model(config):
    """config.to_dict() and the state dict, as a checkpoint holds them, give back the same function."""
    model = _model(config, jitter=0.05).eval()
    kind = type_of(model)
    assert kind == _kind(config)
    again = build_model(kind, config_from_dict(kind, config.to_dict()))
    again.load_state_dict(model.state_dict())
    x, t, y = _inputs(config, 2)
    with torch.no_grad():
        assert torch.equal(again.eval()(x, t, y), model(x, t, y))


@pytest.mark.parametrize("config", VARIANTS, ids=_id)
def test_each_image_is_computed_on_its_own(config):
    """No image's velocity depends on the others in its batch (no batch statistics, no cross-image mixing)."""
    model = _model(config, jitter=0.05).eval()
    x, t, y = _inputs(config, 4)
    with torch.no_grad():
        whole = model(x, t, y)
        alone = torch.cat([model(x[i : i + 1], t[i : i + 1], y[i : i + 1]) for i in range(4)])
    torch.testing.assert_close(whole, alone, rtol=1e-4, atol=1e-5)
