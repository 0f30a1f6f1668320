"""The strict shapes judge passes clean renders and fails the failures a person would reject, made on purpose."""

import numpy as np
import pytest
import torch

from tinydit.data.shapes import COLORS, SHAPES, ShapesDataset, shape_coverage
from tinydit.eval.shape_fit import MIN_IOU, fit_shapes, foreground, on_palette, strict_pass, strict_scores
from tinydit.images import from_uint8, to_uint8


def paint(alpha: np.ndarray, fg: str = "red", bg: str = "blue") -> np.ndarray:
    """uint8 (3, H, W): coverage alpha (H, W) painted in fg over bg."""
    f = np.array(COLORS[fg], np.float32)[:, None, None]
    b = np.array(COLORS[bg], np.float32)[:, None, None]
    return np.rint(b + (f - b) * alpha[None]).astype(np.uint8)


def coverage(kind: int, size: float = 20.0, cx: float = 16.0, cy: float = 16.0) -> np.ndarray:
    return shape_coverage(kind, np.array([size]), np.array([cx]), np.array([cy]), 32)[0]


def supersampled(inside, s: int = 4) -> np.ndarray:
    """Coverage (32, 32) of a region given as inside(x, y) over centred sub-pixel coordinates."""
    g = (np.arange(32 * s) + 0.5) / s - 16
    return inside(g[None, :], g[:, None]).reshape(32, s, 32, s).mean((1, 3))


def thin_triangle(ratio: float = 0.45, half: float = 10.0) -> np.ndarray:
    """A triangle as tall as a real one but `ratio` as wide: the model's "fir tree"."""
    return supersampled(lambda x, y: (y <= half) & (2 * np.abs(x) / ratio <= y + half))


def y_shape(half: float = 10.0, w: float = 3.0) -> np.ndarray:
    """Two strokes from the top corners meeting at the centre and a stem down to the base: a "Y"."""
    return supersampled(
        lambda x, y: (
            ((y <= 0) & (y >= -half) & (np.abs(np.abs(x) + y) <= 0.7 * w))
            | ((y >= 0) & (y <= half) & (np.abs(x) <= w / 2))
        )
    )


def speckle(alpha: np.ndarray, rng: np.random.Generator, p: float = 0.3, tile: int = 4) -> np.ndarray:
    """Flip whole 4x4 tiles of a coverage map: a cross drawn as a patchwork of tiles."""
    a = alpha.round()
    for i in range(0, 32, tile):
        for j in range(0, 32, tile):
            if rng.random() < p:
                a[i : i + tile, j : j + tile] = 1 - a[i : i + tile, j : j + tile]
    return a


@pytest.fixture(scope="module")
def held_out():
    return ShapesDataset(n=400, train=False)


def test_real_renders_pass_and_wrong_labels_fail(held_out):
    labels = held_out.labels.numpy()
    fit = fit_shapes(held_out.images)
    assert fit.passes(labels).all()
    assert (fit.kind == labels).all()
    own = fit.iou[np.arange(len(labels)), labels]
    assert own.min() >= 0.85  # a clean render of every kind fits well above the bar
    wrong = (labels + 1 + np.arange(len(labels)) % 3) % 4  # every other kind, in turn
    assert not fit.passes(wrong).any()


def test_noisy_real_renders_pass(held_out):
    g = torch.Generator().manual_seed(0)
    x = from_uint8(held_out.images)
    noisy = to_uint8(x + (2 * 25 / 255) * torch.randn(x.shape, generator=g))  # std 25/255 in pixel units
    scores = strict_scores(noisy, held_out.labels)
    assert scores["strict"] >= 0.99
    assert scores["colours"] >= 0.99


def test_made_failures_fail():
    rng = np.random.default_rng(0)
    triangle, cross = SHAPES.index("triangle"), SHAPES.index("cross")
    cases = {
        "thin triangle": (paint(thin_triangle()), triangle),
        "Y for a triangle": (paint(y_shape()), triangle),
        "speckled cross": (paint(speckle(coverage(cross), rng)), cross),
        "a square asked to be a circle": (paint(coverage(1, 18)), 0),
        "nothing drawn": (paint(np.zeros((32, 32))), 0),
        "two circles for one": (paint(np.maximum(coverage(0, 10, 9, 9), coverage(0, 10, 23, 23))), 0),
    }
    images = np.stack([img for img, _ in cases.values()])
    labels = np.array([label for _, label in cases.values()])
    passed = strict_pass(images, labels)
    assert not passed.any(), [name for name, ok in zip(cases, passed, strict=True) if ok]
    # The controls the failures were made from pass.
    controls = np.stack([paint(coverage(triangle)), paint(coverage(cross)), paint(coverage(0, 18))])
    assert strict_pass(controls, np.array([triangle, cross, 0])).all()


def test_a_heavy_blur_fails():
    from torchvision.transforms.functional import gaussian_blur

    cross = SHAPES.index("cross")
    sharp = torch.from_numpy(paint(coverage(cross))).float()[None]  # (1, 3, H, W)
    blurred = gaussian_blur(sharp, kernel_size=15, sigma=3.0).round().to(torch.uint8)
    assert strict_pass(sharp.to(torch.uint8), np.array([cross]))[0]
    assert not strict_pass(blurred, np.array([cross]))[0]


def two_colour(alpha: np.ndarray, fg: str = "red", other: str = "green", bg: str = "blue") -> np.ndarray:
    """A clean outline painted half in fg and half (the right half) in another colour."""
    img = paint(alpha, fg, bg)
    img[:, :, 16:] = paint(alpha, other, bg)[:, :, 16:]
    return img


def test_a_shape_patched_from_two_colours_fails():
    square = SHAPES.index("square")
    images = np.stack([two_colour(coverage(square, 18)), paint(coverage(square, 18))])
    fit = fit_shapes(images)
    assert (fit.kind == square).all() and (fit.iou[:, square] >= MIN_IOU).all()  # the outline is right ...
    assert fit.one_colour.tolist() == [False, True]  # ... but one is two shapes' worth of colour
    assert strict_pass(images, np.array([square, square])).tolist() == [False, True]


def test_foreground_drops_isolated_pixels_and_fills_pinholes():
    alpha = coverage(1, 16)
    alpha[16, 16] = 0  # a pinhole inside the square
    alpha[2, 2] = 1  # a lone pixel on the background
    fg = foreground(paint(alpha)[None])[0]
    assert fg[16, 16] and not fg[2, 2]


def test_fit_takes_float_images_as_a_png_would_be(held_out):
    x = from_uint8(held_out.images[:16])
    a, b = fit_shapes(x), fit_shapes(held_out.images[:16])
    np.testing.assert_allclose(a.iou, b.iou)


def test_on_palette_fails_mixed_colours():
    alpha = coverage(0, 18)
    good = paint(alpha)
    mixed = ((good.astype(np.float32) + paint(alpha, "green", "blue")) / 2).astype(np.uint8)  # a red-green shape
    assert on_palette(np.stack([good, mixed])).tolist() == [True, False]
    assert MIN_IOU == 0.8


def test_the_template_bank_holds_shape_masks_renders():
    """The bank reads every centre's coverage from one fine render per kind and size: the same pixels as
    rendering each template with ``shape_mask``, checked on a spread of kinds, sizes and centres."""
    from tinydit.data.shapes import SHAPES, shape_mask
    from tinydit.eval import shape_fit

    bank, areas, kinds = shape_fit._template_bank()
    offsets = np.arange(-shape_fit.CENTRE_SEARCH_PX, shape_fit.CENTRE_SEARCH_PX + 0.51, 0.5)
    per_size, canvas = len(offsets) ** 2, shape_fit._CANVAS
    assert bank.shape == (len(SHAPES) * len(shape_fit.SIZES_PX) * per_size, canvas * canvas)
    rng = np.random.default_rng(0)
    for index in rng.choice(len(bank), 60, replace=False):
        kind, rest = divmod(index, len(shape_fit.SIZES_PX) * per_size)
        size, centre = divmod(rest, per_size)
        iy, ix = divmod(centre, len(offsets))
        want = shape_mask(
            kind,
            np.array([shape_fit.SIZES_PX[size]]),
            np.array([canvas / 2 + offsets[ix]]),
            np.array([canvas / 2 + offsets[iy]]),
            canvas,
        )[0]
        assert np.array_equal(bank[index].reshape(canvas, canvas), want), (SHAPES[kind], size, iy, ix)
        assert kinds[index] == kind and areas[index] == want.sum()
