"""The built-in ``shapes`` dataset: procedurally rendered toy images, no download needed.

Each image is a small RGB picture (default 32x32) of one coloured shape (circle,
square, upward triangle or plus-shaped cross) on a plain background of a different
colour. Colours come from a fixed palette of the 6 saturated inset corners of the RGB
cube, so they are far apart and can be read back from pixels reliably, which lets
``read_shape`` score generated samples (shape / colour / background accuracy).

Render version 2 dropped white and black from the palette and raised the smallest size
from 9 to 12 px: a five-minute CPU model drew speckle on white and black backgrounds and
could not draw the smallest crosses through 4x4 patches.

Everything is deterministic per seed: ``make_shapes(n, seed)`` draws a fixed row
of uniforms per image, so image ``i`` does not depend on ``n``. The class label is
the shape kind (an index into ``SHAPES``) and every image has a caption such as
"a red circle on a blue background".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tinydit.images import from_uint8

__all__ = [
    "GRID_PROMPTS",
    "SHAPES",
    "COLORS",
    "SIZES",
    "RENDER_VERSION",
    "render_shape",
    "make_shapes",
    "caption",
    "read_shape",
    "shape_coverage",
    "shape_mask",
    "ShapesDataset",
]

SHAPES = ("circle", "square", "triangle", "cross")
RENDER_VERSION = 2  # bump whenever rendering changes: cached reference features are keyed on it
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 220, 30),
    "blue": (30, 30, 220),
    "yellow": (220, 220, 30),
    "cyan": (30, 220, 220),
    "magenta": (220, 30, 220),
}
SIZES = ("small", "large")

_COLOR_NAMES = tuple(COLORS)
_PALETTE = np.array([COLORS[c] for c in _COLOR_NAMES], dtype=np.float32)  # (6, 3)
# Size ranges as fractions of the image side (12-16 px and 17-23 px at 32 px): a small cross's arms
# are at least 4 px wide, one patch of the CPU presets.
_SIZE_RANGES = {"small": (12 / 32, 16 / 32), "large": (17 / 32, 23 / 32)}
_MARGIN = 1.0  # px kept free between the shape and the image border
# Shape prototypes in feature space (fill ratio of the box, bottom-minus-top mass fraction,
# corner occupancy), measured on clean renders: the estimators are biased for small
# shapes (e.g. a triangle's thin apex is under-counted, so its fill reads ~0.64 not 0.5).
_PROTOTYPES = np.array([[0.80, 0.0, 0.565], [1.0, 0.0, 0.93], [0.64, 0.45, 0.45], [0.56, 0.0, 0.07]])
# Fill drifts most under blur (it fills a cross's inner corners), so it counts half.
_WEIGHTS = np.array([0.5, 1.0, 1.0])


# The rows of a shapes text run's sample grids: each shape and most colours, and the two combinations
# held out by default (tinydit.data.registry.SHAPES_HOLDOUT) in the last rows.
GRID_PROMPTS = (
    "a red circle on a blue background",
    "a green square on a magenta background",
    "a yellow triangle on a magenta background",
    "a cyan cross on a red background",
    "a cyan circle on a yellow background",
    "a blue square on a green background",
    "a red triangle on a green background",
    "a blue circle on a yellow background",
)


def shape_coverage(
    kind: int, size: np.ndarray, cx: np.ndarray, cy: np.ndarray, img_size: int, supersample: int = 4
) -> np.ndarray:
    """The share of each pixel that B shapes of one kind cover: float32 (B, H, W) in [0, 1].

    size/cx/cy (B,) in px; each pixel is sampled on a supersample x supersample grid (anti-aliasing)."""
    b, s = len(size), img_size * supersample
    # Sub-pixel sample centres in pixel units; broadcast x over columns, y over rows.
    grid = (np.arange(s, dtype=np.float32) + 0.5) / supersample
    x = grid[None, None, :] - np.asarray(cx, dtype=np.float32)[:, None, None]  # (B, 1, S)
    y = grid[None, :, None] - np.asarray(cy, dtype=np.float32)[:, None, None]  # (B, S, 1)
    half = (np.asarray(size, dtype=np.float32) / 2)[:, None, None]
    if kind == 0:  # circle
        mask = x * x + y * y <= half * half
    elif kind == 1:  # square
        mask = (np.abs(x) <= half) & (np.abs(y) <= half)
    elif kind == 2:  # triangle pointing up: apex at top centre, base along the bottom edge
        mask = (y <= half) & (2 * np.abs(x) <= y + half)
    else:  # plus-sign cross, arm width a third of the size
        ax, ay, arm = np.abs(x), np.abs(y), half / 3
        mask = ((ax <= half) & (ay <= arm)) | ((ax <= arm) & (ay <= half))
    cover = mask.reshape(b, img_size, supersample, img_size, supersample)  # (B, H, ss, W, ss)
    return cover.sum(axis=(2, 4), dtype=np.float32) / supersample**2  # (B, H, W)


def shape_mask(kind: int, size: np.ndarray, cx: np.ndarray, cy: np.ndarray, img_size: int) -> np.ndarray:
    """Binary clean renders: bool (B, H, W), the pixels at least half covered by the shape."""
    return shape_coverage(kind, size, cx, cy, img_size) >= 0.5


def _render_batch(
    kind: int,
    fg: np.ndarray,
    bg: np.ndarray,
    size: np.ndarray,
    cx: np.ndarray,
    cy: np.ndarray,
    img_size: int,
    supersample: int,
) -> np.ndarray:
    """Render B shapes of one kind at once; fg/bg (B, 3), size/cx/cy (B,). Returns uint8 (B, 3, H, W)."""
    alpha = shape_coverage(kind, size, cx, cy, img_size, supersample)  # (B, H, W)
    fg_ = fg.astype(np.float32)[:, :, None, None]
    bg_ = bg.astype(np.float32)[:, :, None, None]
    img = bg_ + (fg_ - bg_) * alpha[:, None]
    return np.rint(img).astype(np.uint8)


def render_shape(
    shape: str, color: str, background: str, size: float, cx: float, cy: float, img_size: int = 32, supersample: int = 4
) -> np.ndarray:
    """Render one anti-aliased shape; size is side/diameter in px, (cx, cy) its centre in px.

    Returns a uint8 array of shape (3, img_size, img_size).
    """
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")
    for name in (color, background):
        if name not in COLORS:
            raise ValueError(f"unknown colour {name!r}; expected one of {_COLOR_NAMES}")
    if background == color:
        raise ValueError(f"background {background!r} must differ from the shape colour {color!r}")
    if size <= 0 or img_size <= 0 or supersample <= 0:
        raise ValueError(
            f"size, img_size and supersample must be positive, "
            f"got size={size}, img_size={img_size}, supersample={supersample}"
        )
    fg = np.array([COLORS[color]], dtype=np.float32)
    bg = np.array([COLORS[background]], dtype=np.float32)
    params = np.array([[size], [cx], [cy]], dtype=np.float32)  # a batch of one
    return _render_batch(SHAPES.index(shape), fg, bg, *params, img_size, supersample)[0]


def make_shapes(n: int, seed: int = 0, img_size: int = 32) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """Generate n random images: uint8 (n, 3, H, W), int64 labels (n,), and per-image attribute dicts."""
    # One row of 7 uniforms per image, drawn sequentially: row i never depends on n.
    u = np.random.default_rng(seed).random((n, 7))
    kinds = np.minimum((u[:, 0] * len(SHAPES)).astype(np.int64), len(SHAPES) - 1)
    ncol = len(_COLOR_NAMES)
    colors = np.minimum((u[:, 1] * ncol).astype(np.int64), ncol - 1)
    # An offset of 1..ncol-1 from the colour guarantees a different, uniformly chosen background.
    backs = (colors + 1 + np.minimum((u[:, 2] * (ncol - 1)).astype(np.int64), ncol - 2)) % ncol
    large = u[:, 3] >= 0.5
    lo = np.where(large, _SIZE_RANGES["large"][0], _SIZE_RANGES["small"][0]) * img_size
    hi = np.where(large, _SIZE_RANGES["large"][1], _SIZE_RANGES["small"][1]) * img_size
    sizes = lo + u[:, 4] * (hi - lo)
    # Centre range keeps the whole bounding box at least _MARGIN px from every border.
    span = img_size - 2 * _MARGIN - sizes
    cxs = _MARGIN + sizes / 2 + u[:, 5] * span
    cys = _MARGIN + sizes / 2 + u[:, 6] * span
    images = np.empty((n, 3, img_size, img_size), dtype=np.uint8)
    chunk = 512  # bounds the (chunk, 4H, 4W) supersampled mask to a few tens of MB
    for kind in range(len(SHAPES)):
        idx = np.flatnonzero(kinds == kind)
        for start in range(0, len(idx), chunk):
            j = idx[start : start + chunk]
            images[j] = _render_batch(
                kind, _PALETTE[colors[j]], _PALETTE[backs[j]], sizes[j], cxs[j], cys[j], img_size, 4
            )
    attrs = [
        {
            "shape": SHAPES[kinds[i]],
            "color": _COLOR_NAMES[colors[i]],
            "background": _COLOR_NAMES[backs[i]],
            "size": SIZES[int(large[i])],
            "size_px": float(sizes[i]),
            "cx": float(cxs[i]),
            "cy": float(cys[i]),
            "img_size": img_size,
        }
        for i in range(n)
    ]
    return images, kinds, attrs


def caption(attrs: dict, detail: bool = False) -> str:
    """Caption from attributes, e.g. "a red circle on a blue background".

    With detail=True: "a large red circle at the top left on a blue background", the
    position taken from thirds of the image ("in the center" for the middle cell).
    """
    what = f"{attrs['color']} {attrs['shape']}"
    bg = f"on a {attrs['background']} background"
    if not detail:
        return f"a {what} {bg}"
    third = attrs.get("img_size", 32) / 3
    col = ("left", "center", "right")[min(int(attrs["cx"] // third), 2)]
    row = ("top", "middle", "bottom")[min(int(attrs["cy"] // third), 2)]
    where = "in the center" if (row, col) == ("middle", "center") else f"at the {row} {col}"
    return f"a {attrs['size']} {what} {where} {bg}"


def _nearest_color(rgb: np.ndarray, exclude: int | None = None) -> int:
    d = ((_PALETTE - rgb) ** 2).sum(axis=1)
    if exclude is not None:
        d[exclude] = np.inf
    return int(np.argmin(d))


def _outer_thirds(profile: np.ndarray) -> np.ndarray:
    """Per pixel, the overlap with the outer thirds of the sub-pixel extent given by a coverage profile."""
    extent = max(profile.sum(), 1e-6)
    pos = np.arange(len(profile))
    centre = ((pos + 0.5) * profile).sum() / extent
    lo, hi = centre - extent / 2, centre + extent / 2

    def overlap(a: float, b: float) -> np.ndarray:
        return np.clip(np.minimum(pos + 1, b) - np.maximum(pos, a), 0, 1)

    return overlap(lo, lo + extent / 3) + overlap(hi - extent / 3, hi)


def _shape_features(t: np.ndarray, mask: np.ndarray) -> tuple[float, float, float]:
    """(box fill ratio, vertical asymmetry, corner occupancy) from coverage t (H, W) and its mask."""
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    box = mask[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    # Fill ratio from soft coverage in the box grown by 1 px: a hard box gains or loses a
    # whole row when an edge row is ~half covered, which would blur square vs circle.
    r0, c0 = max(rows[0] - 1, 0), max(cols[0] - 1, 0)
    win = np.clip(t[r0 : rows[-1] + 2, c0 : cols[-1] + 2], -1.0, 2.0)  # loose clip keeps noise unbiased
    area = win.sum()
    # Extents: per row (column) the peak coverage, averaged 3-wide along the edge against noise.
    pad = np.pad(np.clip(win, 0, 1), 1, mode="edge")
    along_rows = (pad[1:-1, :-2] + pad[1:-1, 1:-1] + pad[1:-1, 2:]) / 3
    along_cols = (pad[:-2, 1:-1] + pad[1:-1, 1:-1] + pad[2:, 1:-1]) / 3
    prof_y, prof_x = np.clip(along_rows.max(axis=1), 0, 1), np.clip(along_cols.max(axis=0), 0, 1)
    height, width = prof_y.sum(), prof_x.sum()
    fill = area / max(height * width, 1.0)
    # Vertical asymmetry: an upward triangle has ~3/4 of its mass in the bottom half.
    ys = np.arange(box.shape[0]) + 0.5 - box.shape[0] / 2
    row_mass = box.sum(axis=1)
    asym = (row_mass[ys > 0].sum() - row_mass[ys < 0].sum()) / box.sum()
    # Corner occupancy: mean coverage over the 4 corner cells of a 3x3 grid laid on the
    # sub-pixel box (cross ~0.07, triangle ~0.45, circle ~0.565, square ~0.93). It separates a
    # small blurred cross, whose fill creeps up towards a circle's, from a circle. Pixels
    # count by their overlap with the cells, so the grid does not snap to whole pixels.
    wy, wx = _outer_thirds(prof_y), _outer_thirds(prof_x)
    cells = wy[:, None] * wx[None, :]
    corner = (np.clip(win, 0, 1) * cells).sum() / max(cells.sum(), 1e-6)
    return float(fill), float(asym), float(corner)


def read_shape(image: Any) -> dict:
    """Read shape kind, colour and background back from pixels (e.g. to score generated samples).

    Range rule, by dtype: integer arrays/tensors (uint8) are in [0, 255]; floating
    ones are in the model range [-1, 1]. Input layout is (3, H, W). Returns
    {"shape", "color", "background"}; shape and color are None when no foreground is found.
    """
    if isinstance(image, torch.Tensor):
        image = image.detach().cpu()
        # numpy has no bfloat16, so widen floats (the range rule only looks at "float or not").
        image = (image.float() if image.is_floating_point() else image).numpy()
    img = np.asarray(image)
    if img.ndim != 3 or img.shape[0] != 3:
        raise ValueError(f"expected an image of shape (3, H, W), got {img.shape}")
    if np.issubdtype(img.dtype, np.floating):
        img = (img.astype(np.float32) + 1) * 127.5
    img = np.clip(img.astype(np.float32), 0, 255)
    h, w = img.shape[1:]
    pix = img.reshape(3, -1).T  # (H*W, 3)
    # Background: the outer ring is always background, the median shrugs off noise.
    border = np.concatenate([img[:, 0], img[:, -1], img[:, 1:-1, 0], img[:, 1:-1, -1]], axis=1)
    bg_i = _nearest_color(np.median(border, axis=1))
    bg = _PALETTE[bg_i]
    dist = np.linalg.norm(pix - bg, axis=1)
    # Palette colours are >= ~190 apart, so 90 is far above pixel noise (std 15 -> ~26).
    cand = dist > 90
    if cand.sum() < 3:
        return {"shape": None, "color": None, "background": _COLOR_NAMES[bg_i]}
    # Foreground colour from the most distinct half of candidates (interior, not edges).
    strong = pix[cand][dist[cand] >= np.median(dist[cand])]
    fg_i = _nearest_color(np.median(strong, axis=0), exclude=bg_i)
    axis = _PALETTE[fg_i] - bg
    # Foreground = more than half way from background towards foreground colour.
    t = ((pix - bg) @ axis / (axis @ axis)).reshape(h, w)  # (H, W) position between bg and fg
    mask = t > 0.5
    # Drop isolated speckles (no 8-neighbour in the mask) left by noise or artefacts.
    p = np.pad(mask, 1).astype(np.int32)
    neigh = sum(p[1 + dy : h + 1 + dy, 1 + dx : w + 1 + dx] for dy in (-1, 0, 1) for dx in (-1, 0, 1)) - mask
    mask &= neigh > 0
    if mask.sum() < 3:
        return {"shape": None, "color": None, "background": _COLOR_NAMES[bg_i]}
    fill, asym, corner = _shape_features(t, mask)
    kind = int(np.argmin((((_PROTOTYPES - [fill, asym, corner]) * _WEIGHTS) ** 2).sum(axis=1)))
    return {"shape": SHAPES[kind], "color": _COLOR_NAMES[fg_i], "background": _COLOR_NAMES[bg_i]}


class ShapesDataset(torch.utils.data.Dataset):
    """Torch dataset over ``make_shapes``; items are (float32 (3, H, W) in [-1, 1], int label)."""

    _TEST_SEED_OFFSET = 1_000_003  # test split uses its own stream, never a training one

    def __init__(self, n: int = 20000, seed: int = 0, img_size: int = 32, train: bool = True) -> None:
        images, labels, attrs = make_shapes(n, seed if train else seed + self._TEST_SEED_OFFSET, img_size)
        self.images = torch.from_numpy(images)
        self.labels = torch.from_numpy(labels)
        self.attrs = attrs
        self.captions = [caption(a) for a in attrs]
        self.classes = list(SHAPES)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return from_uint8(self.images[i]), int(self.labels[i])
