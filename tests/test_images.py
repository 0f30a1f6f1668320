import numpy as np
import pytest
import torch
from PIL import Image

from tinydit.images import (
    from_model_range,
    load_image,
    make_grid,
    pil_to_tensor,
    save_grid,
    save_image,
    tensor_to_pil,
    to_model_range,
    to_uint8,
)


def test_pil_tensor_round_trip_is_exact_and_channels_first():
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, size=(5, 7, 3), dtype=np.uint8)  # (H, W, C), not square on purpose
    x = pil_to_tensor(Image.fromarray(arr))
    assert x.shape == (3, 5, 7) and x.dtype == torch.float32
    assert torch.equal((x * 255).round().to(torch.uint8), torch.from_numpy(arr).permute(2, 0, 1))
    assert np.array_equal(np.asarray(tensor_to_pil(x)), arr)


def test_grayscale_tensor_saves_as_single_channel(tmp_path):
    x = torch.linspace(-1, 1, 28 * 28).view(1, 28, 28)
    save_image(x, tmp_path / "g.png")
    img = Image.open(tmp_path / "g.png")
    assert img.mode == "L" and img.size == (28, 28)
    assert np.asarray(img)[0, 0] == 0 and np.asarray(img)[-1, -1] == 255


def test_model_range_round_trip():
    x = torch.rand(2, 3, 4, 4)
    assert torch.allclose(from_model_range(to_model_range(x)), x)
    assert to_model_range(torch.tensor([0.0, 1.0])).tolist() == [-1.0, 1.0]


def test_save_and_load_image_round_trip(tmp_path):
    x = to_model_range(torch.randint(0, 256, (3, 32, 32)).float() / 255)
    save_image(x.unsqueeze(0), tmp_path / "a.png")
    y = load_image(tmp_path / "a.png", size=None)
    assert y.shape == (1, 3, 32, 32) and y.dtype == torch.float32
    assert torch.allclose(y[0], x, atol=1e-6)
    assert load_image(tmp_path / "a.png", size=16).shape == (1, 3, 16, 16)


def test_out_of_range_values_are_clamped_on_save():
    assert to_uint8(torch.tensor([-3.0, 0.0, 3.0])).tolist() == [0, 128, 255]


def test_make_grid_places_each_image():
    x = torch.stack([torch.full((3, 4, 4), v) for v in (-1.0, 0.0, 0.5)])  # (3, 3, 4, 4)
    grid = make_grid(x, nrow=2, pad=1)
    assert grid.shape == (3, 2 * 5 + 1, 2 * 5 + 1)
    assert torch.all(grid[:, 1:5, 1:5] == -1) and torch.all(grid[:, 1:5, 6:10] == 0)
    assert torch.all(grid[:, 6:10, 1:5] == 0.5) and torch.all(grid[:, 6:10, 6:10] == 1)  # empty cell: white


def test_save_grid_writes_file(tmp_path):
    save_grid(torch.zeros(5, 3, 8, 8), tmp_path / "g.png", nrow=5)
    assert Image.open(tmp_path / "g.png").size == (5 * 10 + 2, 12)


def test_save_image_rejects_a_batch(tmp_path):
    with pytest.raises(ValueError, match="save_grid"):
        save_image(torch.zeros(2, 3, 8, 8), tmp_path / "x.png")
