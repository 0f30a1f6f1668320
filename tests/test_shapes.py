"""Tests for the built-in procedural ``shapes`` dataset (tinydit.data.shapes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tinydit.data.shapes import (
    COLORS,
    SHAPES,
    SIZES,
    ShapesDataset,
    caption,
    make_shapes,
    read_shape,
    render_shape,
)


def _outer_ring(img: np.ndarray) -> np.ndarray:
    """(3, K) pixels of the outermost 1-px ring of a (3, H, W) image."""
    return np.concatenate([img[:, 0], img[:, -1], img[:, 1:-1, 0], img[:, 1:-1, -1]], axis=1)


def _accuracy(images, attrs) -> dict[str, float]:
    hits = {"shape": 0, "color": 0, "background": 0, "all": 0}
    for img, a in zip(images, attrs, strict=True):
        got = read_shape(img)
        ok = [got[k] == a[k] for k in ("shape", "color", "background")]
        for k, v in zip(("shape", "color", "background"), ok, strict=True):
            hits[k] += v
        hits["all"] += all(ok)
    return {k: v / len(attrs) for k, v in hits.items()}


def test_palette_and_constants():
    assert SHAPES == ("circle", "square", "triangle", "cross")
    assert list(COLORS) == ["red", "green", "blue", "yellow", "cyan", "magenta"]
    assert SIZES == ("small", "large")
    pal = np.array(list(COLORS.values()), dtype=float)
    d = np.linalg.norm(pal[:, None] - pal[None], axis=-1)
    assert d[~np.eye(len(pal), dtype=bool)].min() > 150  # well separated


def test_deterministic_and_prefix_stable():
    a_img, a_lab, a_att = make_shapes(10, seed=5)
    b_img, b_lab, b_att = make_shapes(10, seed=5)
    np.testing.assert_array_equal(a_img, b_img)
    np.testing.assert_array_equal(a_lab, b_lab)
    assert a_att == b_att
    c_img, c_lab, c_att = make_shapes(5, seed=5)
    np.testing.assert_array_equal(a_img[:5], c_img)
    np.testing.assert_array_equal(a_lab[:5], c_lab)
    assert a_att[:5] == c_att


def test_different_seeds_differ():
    a_img, _, a_att = make_shapes(20, seed=0)
    b_img, _, b_att = make_shapes(20, seed=1)
    assert not np.array_equal(a_img, b_img)
    assert a_att != b_att


def test_shapes_dtypes_ranges():
    images, labels, attrs = make_shapes(50, seed=2)
    assert images.shape == (50, 3, 32, 32) and images.dtype == np.uint8
    assert labels.shape == (50,) and labels.dtype == np.int64
    assert labels.min() >= 0 and labels.max() < len(SHAPES)
    assert len(attrs) == 50
    for lab, a in zip(labels, attrs, strict=True):
        assert {"shape", "color", "background", "size", "size_px", "cx", "cy"} <= set(a)
        assert SHAPES[lab] == a["shape"]
        assert a["color"] in COLORS and a["background"] in COLORS and a["color"] != a["background"]
        lo, hi = (12, 16) if a["size"] == "small" else (17, 23)
        assert lo <= a["size_px"] <= hi


def test_sizes_scale_with_img_size():
    images, _, attrs = make_shapes(200, seed=3, img_size=64)
    assert images.shape == (200, 3, 64, 64)
    for a in attrs:
        lo, hi = (24, 32) if a["size"] == "small" else (34, 46)
        assert lo <= a["size_px"] <= hi


def test_roughly_uniform_classes_and_colours():
    _, labels, attrs = make_shapes(4000, seed=4)
    frac = np.bincount(labels, minlength=len(SHAPES)) / len(labels)
    assert np.all((frac >= 0.20) & (frac <= 0.30)), frac
    colours = np.array([list(COLORS).index(a["color"]) for a in attrs])
    cfrac = np.bincount(colours, minlength=len(COLORS)) / len(colours)
    assert np.all(np.abs(cfrac - 1 / len(COLORS)) < 0.03), cfrac
    large = np.mean([a["size"] == "large" for a in attrs])
    assert 0.45 < large < 0.55


def test_shape_inside_image_and_border_is_background():
    images, _, attrs = make_shapes(1000, seed=6)
    for img, a in zip(images, attrs, strict=True):
        half = a["size_px"] / 2
        assert a["cx"] - half >= 1 - 1e-6 and a["cx"] + half <= 31 + 1e-6
        assert a["cy"] - half >= 1 - 1e-6 and a["cy"] + half <= 31 + 1e-6
        bg = np.array(COLORS[a["background"]], dtype=np.uint8)[:, None]
        assert np.array_equal(_outer_ring(img), np.broadcast_to(bg, _outer_ring(img).shape))
        # ...and the shape really is there: some pixel is fully the shape colour.
        fg = np.array(COLORS[a["color"]], dtype=np.uint8)[:, None, None]
        assert (img == fg).all(axis=0).any()


def test_render_shape_matches_make_shapes():
    images, _, attrs = make_shapes(8, seed=7)
    for img, a in zip(images, attrs, strict=True):
        out = render_shape(a["shape"], a["color"], a["background"], a["size_px"], a["cx"], a["cy"])
        np.testing.assert_array_equal(out, img)


def test_render_shape_geometry():
    red, blue = np.array(COLORS["red"]), np.array(COLORS["blue"])
    sq = render_shape("square", "red", "blue", 10, 16, 16)
    assert sq.shape == (3, 32, 32) and sq.dtype == np.uint8
    is_red = (sq == red[:, None, None]).all(axis=0)
    assert is_red[11:21, 11:21].all() and is_red.sum() == 100  # pixel-aligned: exact
    assert ((sq == blue[:, None, None]).all(axis=0) | is_red).all()

    def coverage(img: np.ndarray) -> np.ndarray:  # fraction of the way from blue to red, per pixel
        return (img[0].astype(float) - 30) / 190

    circ = coverage(render_shape("circle", "red", "blue", 20, 16, 16))
    assert abs(circ.sum() - np.pi * 10**2) < 2
    tri = coverage(render_shape("triangle", "red", "blue", 20, 16, 16))
    assert abs(tri.sum() - 200) < 2
    assert tri[16:].sum() > 2.5 * tri[:16].sum()  # points up: ~3/4 of the mass in the bottom half
    cross = coverage(render_shape("cross", "red", "blue", 18, 16, 16))
    assert abs(cross.sum() - 18 * 18 * 5 / 9) < 2
    assert cross[7:25, 13:19].min() > 0.99 and cross[8, 8] == 0  # arm 6 px wide, empty corners
    # Anti-aliasing: an off-grid edge gives intermediate values.
    soft = render_shape("square", "red", "blue", 10.5, 16, 16)
    assert ((soft[0] > 30) & (soft[0] < 220)).any()


@pytest.mark.parametrize(
    ("args", "bad"),
    [
        (("hexagon", "red", "blue"), "hexagon"),
        (("circle", "purple", "blue"), "purple"),
        (("circle", "red", "orange"), "orange"),
        (("circle", "red", "red"), "red"),
    ],
)
def test_render_shape_rejects_bad_values(args, bad):
    with pytest.raises(ValueError, match=bad):
        render_shape(*args, 10, 16, 16)


def test_captions():
    _, _, attrs = make_shapes(100, seed=8)
    for a in attrs:
        assert caption(a) == f"a {a['color']} {a['shape']} on a {a['background']} background"
        detailed = caption(a, detail=True)
        assert detailed.startswith(f"a {a['size']} {a['color']} {a['shape']} ")
        assert detailed.endswith(f" on a {a['background']} background")
    base = {"shape": "circle", "color": "red", "background": "blue", "size": "large", "size_px": 10}
    assert caption({**base, "cx": 5, "cy": 5}, detail=True) == (
        "a large red circle at the top left on a blue background"
    )
    assert caption({**base, "cx": 16, "cy": 16}, detail=True) == (
        "a large red circle in the center on a blue background"
    )
    assert caption({**base, "cx": 28, "cy": 16}, detail=True) == (
        "a large red circle at the middle right on a blue background"
    )
    assert caption({**base, "cx": 16, "cy": 30}, detail=True) == (
        "a large red circle at the bottom center on a blue background"
    )


def test_read_shape_clean_accuracy():
    images, _, attrs = make_shapes(2000, seed=9)
    acc = _accuracy(images, attrs)
    assert acc["all"] >= 0.99, acc


def test_read_shape_noisy_accuracy():
    images, _, attrs = make_shapes(2000, seed=10)
    x = images.astype(np.float32) / 127.5 - 1
    rng = np.random.default_rng(0)
    noisy = x + rng.normal(0.0, 2 * 15 / 255, x.shape).astype(np.float32)  # std 15/255 of the full range
    acc = _accuracy(torch.from_numpy(noisy), attrs)
    assert acc["all"] >= 0.95, acc


def test_read_shape_blurred_noisy_accuracy():
    # Generated samples are soft: a [1, 2, 1] / 4 blur on both axes plus the same noise.
    images, _, attrs = make_shapes(2000, seed=13)
    x = np.pad(images.astype(np.float32) / 127.5 - 1, ((0, 0), (0, 0), (1, 1), (1, 1)), mode="edge")
    x = (x[:, :, :-2] + 2 * x[:, :, 1:-1] + x[:, :, 2:]) / 4
    x = (x[..., :-2] + 2 * x[..., 1:-1] + x[..., 2:]) / 4
    rng = np.random.default_rng(1)
    acc = _accuracy(x + rng.normal(0.0, 2 * 15 / 255, x.shape).astype(np.float32), attrs)
    assert acc["all"] >= 0.97, acc


def test_read_shape_input_types_agree():
    images, _, attrs = make_shapes(40, seed=11)
    for img, a in zip(images, attrs, strict=True):
        as_u8 = read_shape(img)
        as_u8_t = read_shape(torch.from_numpy(img))
        as_float_t = read_shape(torch.from_numpy(img).float() / 127.5 - 1)
        as_float_np = read_shape(img.astype(np.float64) / 127.5 - 1)
        assert as_u8 == as_u8_t == as_float_t == as_float_np
        assert as_u8["shape"] == a["shape"] and as_u8["color"] == a["color"]


def test_read_shape_blank_image_has_no_shape():
    blank = np.broadcast_to(np.array(COLORS["green"], dtype=np.uint8)[:, None, None], (3, 32, 32))
    got = read_shape(blank.copy())
    assert got["shape"] is None and got["background"] == "green"


def test_shapes_dataset():
    train = ShapesDataset(n=64, seed=0, train=True)
    test = ShapesDataset(n=64, seed=0, train=False)
    assert len(train) == 64 and train.classes == list(SHAPES)
    assert train.images.dtype == torch.uint8 and train.images.shape == (64, 3, 32, 32)
    assert train.labels.dtype == torch.int64 and train.labels.shape == (64,)
    assert len(train.attrs) == len(train.captions) == 64
    assert train.captions[0] == caption(train.attrs[0])
    assert not torch.equal(train.images, test.images)
    x, y = train[3]
    assert x.dtype == torch.float32 and x.shape == (3, 32, 32)
    assert x.min() >= -1 and x.max() <= 1
    assert isinstance(y, int) and y == int(train.labels[3])
    torch.testing.assert_close((x + 1) * 127.5, train.images[3].float())
    # Same arguments, same data (train split is make_shapes with the given seed).
    np.testing.assert_array_equal(train.images.numpy(), make_shapes(64, seed=0)[0])


def test_make_shapes_renders_in_batches_not_per_image(monkeypatch):
    """What keeps 20,000 renders to seconds: one vectorised call per shape kind and chunk of 512 images,
    not a Python loop over images (a count of calls, not a timing, so it holds on any machine)."""
    import tinydit.data.shapes as shapes_module

    calls = []
    render = shapes_module._render_batch

    def counted(kind, fg, *args):
        calls.append(len(fg))
        return render(kind, fg, *args)

    monkeypatch.setattr(shapes_module, "_render_batch", counted)
    images, _, _ = make_shapes(10_000, seed=12)
    assert sum(calls) == 10_000 and len(calls) <= len(SHAPES) + 10_000 // 512 + 1
    np.testing.assert_array_equal(images[:50], make_shapes(50, seed=12)[0])  # the same images, however batched
