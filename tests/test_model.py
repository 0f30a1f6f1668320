import re
from dataclasses import replace

import pytest
import torch

from tinydit.errors import TinyDiTError
from tinydit.model import PRESETS, DiT, DiTConfig, count_params, get_preset, sincos_2d

SMALL = [
    DiTConfig(dim=32, depth=2, n_heads=2),
    DiTConfig(img_size=28, in_channels=1, patch_size=4, dim=32, depth=1, n_heads=4),
    DiTConfig(img_size=16, in_channels=3, patch_size=2, dim=48, depth=2, n_heads=3, n_classes=4),
]


@pytest.mark.parametrize("cfg", SMALL, ids=lambda c: f"{c.in_channels}x{c.img_size}p{c.patch_size}")
def test_forward_shape_and_zero_output_at_init(cfg):
    model = DiT(cfg)
    x = torch.randn(3, cfg.in_channels, cfg.img_size, cfg.img_size)
    v = model(x, torch.rand(3), torch.tensor([0, 1, cfg.n_classes]))  # the null label is valid
    assert v.shape == x.shape and v.dtype == torch.float32
    assert torch.count_nonzero(v) == 0  # adaLN-Zero + zeroed output layer
    assert torch.count_nonzero(model(x, torch.rand(3), None)) == 0


@pytest.mark.parametrize("cfg", SMALL, ids=lambda c: f"{c.in_channels}x{c.img_size}p{c.patch_size}")
def test_gradients_reach_every_parameter_after_one_step(cfg):
    torch.manual_seed(0)
    model = DiT(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, cfg.in_channels, cfg.img_size, cfg.img_size)
    args = (x, torch.rand(4), torch.randint(0, cfg.n_classes, (4,)))
    # Zero-initialised layers pass no gradient through themselves: step 1 moves the output layer,
    # step 2 the gates, and from step 3 on every parameter receives a gradient.
    for _ in range(3):
        opt.zero_grad()
        (model(*args) - x).pow(2).mean().backward()
        opt.step()
    dead = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert dead == [], dead


def test_unpatchify_inverts_patchify_layout():
    cfg = DiTConfig(img_size=8, in_channels=2, patch_size=2, dim=8, depth=1, n_heads=2)
    model = DiT(cfg)
    x = torch.randn(2, 2, 8, 8)
    # cut into row-major patches by hand: (N, C, g, p, g, p) -> (N, g, g, p, p, C)
    patches = x.reshape(2, 2, 4, 2, 4, 2).permute(0, 2, 4, 3, 5, 1).reshape(2, 16, 8)
    assert torch.equal(model.unpatchify(patches), x)


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


@pytest.mark.parametrize("bad, match", [
    (dict(patch_size=5), "does not divide"),
    (dict(dim=30, n_heads=4), "not divisible"),
    (dict(depth=0), "depth must be >= 1"),
])  # fmt: skip
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
