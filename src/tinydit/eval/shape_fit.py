"""The strict shapes judge: does a sample hold a clean shape of the kind it was asked for?

``read_shape`` (``tinydit.data.shapes``) classifies a foreground by three summary features, so a thin
"Y" reads as a triangle and a speckle of tiles laid out like a plus reads as a cross. This judge asks
what a person asks: is there a clean shape here, and which one? It fits a clean render of every kind
to the foreground and keeps each kind's best intersection over union (IoU):

1. foreground: the pixels further than ``FG_DISTANCE`` (RGB, 0-255) from the median colour of the
   image's border, then a 3x3 majority vote (a pixel is foreground when at least 5 of the 9 pixels
   around and including it are), which drops isolated pixels and fills pinholes;
2. fit: binary clean renders (coverage >= 1/2) of each kind, at every size from ``SIZES_PX`` and at
   centres within ``CENTRE_SEARCH_PX`` of the foreground's box centre in half-pixel steps;
3. one colour: at least ``MIN_ONE_COLOUR`` of the foreground's interior (the foreground less its edge
   pixels, where anti-aliasing mixes the two colours) lies within ``COLOUR_TOL`` of the interior's
   median colour, so a shape patched together from two or three colours does not pass as one shape;
4. verdict: a sample passes when the asked kind fits best, its IoU is at least ``MIN_IOU`` and the
   shape is one colour.

All renders share one bank of templates on a canvas centred on the foreground's box, so judging a
batch is one matrix product of foregrounds (N, P) and templates (P, K).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from tinydit.data.shapes import _PALETTE, SHAPES, shape_coverage
from tinydit.images import to_uint8

__all__ = [
    "FG_DISTANCE",
    "MIN_IOU",
    "MIN_ONE_COLOUR",
    "COLOUR_TOL",
    "ShapeFit",
    "foreground",
    "one_colour",
    "fit_shapes",
    "strict_pass",
    "on_palette",
    "strict_scores",
]

FG_DISTANCE = 90.0  # palette colours are >= 190 apart; pixel noise of std 25/255 moves a pixel by ~43
MIN_IOU = 0.8  # clean renders fit at >= 0.85 for every kind and size; a "Y" or a speckled cross does not
MIN_ONE_COLOUR = 0.9  # share of the interior within COLOUR_TOL of its median colour
COLOUR_TOL = 80.0  # RGB distance: noise of std 25/255 exceeds it in about 1% of pixels; palette colours are 190+ apart
SIZES_PX = np.arange(8.0, 28.01, 0.5)  # the data's sizes (12-23 px) with room on both sides
CENTRE_SEARCH_PX = 2.5  # search radius around the box centre, half-pixel steps
SUPERSAMPLE = 4  # shape_mask's samples per pixel side
_CANVAS = 48  # the foreground is pasted here with its box centre near _CANVAS / 2
_PALETTE_TOL = 40.0  # a colour is "on the palette" within this RGB distance of a palette colour


@dataclass(frozen=True)
class ShapeFit:
    """The judge's reading of N images: each kind's best IoU, the best kind, and the verdict."""

    iou: np.ndarray  # (N, 4) the best IoU of each kind in SHAPES
    kind: np.ndarray  # (N,) int index into SHAPES of the best fit (-1: no foreground)
    one_colour: np.ndarray  # (N,) bool: the shape's interior is one colour

    def passes(self, labels: np.ndarray | torch.Tensor) -> np.ndarray:
        """(N,) bool: the asked kind fits best and at least MIN_IOU, and the shape is one colour."""
        labels = np.asarray(labels, dtype=np.int64)
        own = self.iou[np.arange(len(labels)), labels]
        return (self.kind == labels) & (own >= MIN_IOU) & self.one_colour


def _as_uint8(images) -> np.ndarray:
    """uint8 (N, 3, H, W) from float images in [-1, 1] (quantised as a PNG would be) or uint8 ones."""
    if isinstance(images, torch.Tensor):
        images = to_uint8(images.detach().cpu()) if images.is_floating_point() else images.cpu()
        return images.numpy()
    images = np.asarray(images)
    if np.issubdtype(images.dtype, np.floating):
        return to_uint8(torch.from_numpy(images)).numpy()
    return images.astype(np.uint8)


def _border_median(img: np.ndarray) -> np.ndarray:
    """(N, 3) median colour of each image's outer ring of pixels."""
    ring = np.concatenate([img[:, :, 0], img[:, :, -1], img[:, :, 1:-1, 0], img[:, :, 1:-1, -1]], axis=2)
    return np.median(ring, axis=2)


def _neighbours(mask: np.ndarray) -> np.ndarray:
    """int (N, H, W): how many of the 3x3 pixels around and including each pixel are in mask (N, H, W)."""
    h, w = mask.shape[1:]
    p = np.pad(mask, ((0, 0), (1, 1), (1, 1))).astype(np.int8)
    return sum(p[:, 1 + dy : h + 1 + dy, 1 + dx : w + 1 + dx] for dy in (-1, 0, 1) for dx in (-1, 0, 1))


def foreground(images) -> np.ndarray:
    """bool (N, H, W): pixels far from the border's median colour, after a 3x3 majority vote."""
    img = _as_uint8(images).astype(np.float32)  # (N, 3, H, W)
    if img.ndim != 4 or img.shape[1] != 3:
        raise ValueError(f"expected RGB images of shape (N, 3, H, W), got {img.shape}")
    bg = _border_median(img)  # (N, 3)
    far = np.linalg.norm(img - bg[:, :, None, None], axis=1) > FG_DISTANCE  # (N, H, W)
    return _neighbours(far) >= 5


def one_colour(images, fg: np.ndarray) -> np.ndarray:
    """(N,) bool: at least MIN_ONE_COLOUR of the foreground's interior (fg (N, H, W) less its edge pixels)
    is within COLOUR_TOL of the interior's median colour. No interior (no shape, or one a pixel thin): False."""
    img = _as_uint8(images).astype(np.float32)  # (N, 3, H, W)
    interior = _neighbours(fg) == 9  # (N, H, W): the pixel and its 8 neighbours are all foreground
    out = np.zeros(len(img), dtype=bool)
    for i in range(len(img)):
        pix = img[i][:, interior[i]].T  # (K, 3)
        if len(pix) < 3:
            continue
        near = np.linalg.norm(pix - np.median(pix, axis=0), axis=1) <= COLOUR_TOL
        out[i] = near.mean() >= MIN_ONE_COLOUR
    return out


@lru_cache(maxsize=2)
def _template_bank(canvas: int = _CANVAS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every template on the canvas: masks (K, canvas * canvas) float32, their areas (K,) and kinds (K,).

    Centres lie at canvas / 2 + offsets in [-CENTRE_SEARCH_PX, CENTRE_SEARCH_PX + 0.5] (the extra half
    pixel takes box centres that fall between pixels), in half-pixel steps, cy major. A template is
    ``shape_mask``'s render (its pixels at least half covered on a 4 x 4 sample grid): a half-pixel move of
    the centre moves the samples by two, so each kind and size is sampled once, at 4x the resolution and
    with a margin, and every centre's coverage is read from sums over 2 x 2 sample blocks of that one image
    (the same numbers as rendering each centre: the sample positions are the same exact binary fractions)."""
    offsets = np.arange(-CENTRE_SEARCH_PX, CENTRE_SEARCH_PX + 0.51, 0.5)
    k = np.rint(2 * offsets).astype(int)  # each offset in samples of the 4x grid, halved: (O,)
    pad = 2 * int(np.abs(k).max())  # the margin, in samples, that the furthest centre needs
    side = SUPERSAMPLE * canvas + 2 * pad
    rows = (2 * np.arange(canvas))[None, :] - k[:, None] + pad // 2  # (O, canvas) block row of each pixel
    masks, kinds = [], []
    for kind in range(len(SHAPES)):
        for size in SIZES_PX:
            centre = SUPERSAMPLE * canvas / 2 + pad  # the canvas centre on the fine grid, margin included
            fine = shape_coverage(
                kind, np.array([SUPERSAMPLE * size]), np.array([centre]), np.array([centre]), side, supersample=1
            )[0]  # (side, side) 0/1: one sample per fine pixel
            pairs = fine.reshape(side // 2, 2, side // 2, 2).sum((1, 3))  # 2 x 2 sample blocks
            quads = pairs[:-1, :-1] + pairs[1:, :-1] + pairs[:-1, 1:] + pairs[1:, 1:]  # 4 x 4 samples from each
            cover = quads[rows[:, None, :, None], rows[None, :, None, :]]  # (O, O, canvas, canvas) cy, cx major
            masks.append((cover >= SUPERSAMPLE**2 / 2).reshape(len(k) ** 2, -1))
            kinds.append(np.full(len(k) ** 2, kind))
    bank = np.concatenate(masks).astype(np.float32)  # (K, P)
    return bank, bank.sum(1), np.concatenate(kinds)


def _paste(fg: np.ndarray, canvas: int = _CANVAS) -> np.ndarray:
    """Each foreground (N, H, W) on a canvas (N, canvas, canvas), moved by whole pixels so that its
    box centre lands in [canvas / 2, canvas / 2 + 0.5]."""
    n, h, w = fg.shape
    out = np.zeros((n, canvas, canvas), dtype=np.float32)
    for i in range(n):
        rows, cols = np.flatnonzero(fg[i].any(1)), np.flatnonzero(fg[i].any(0))
        if not len(rows):
            continue
        # Box centre (pixel i spans [i, i + 1]) is (first + last + 1) / 2; move it by a whole number.
        dy = canvas // 2 - (rows[0] + rows[-1] + 1) // 2
        dx = canvas // 2 - (cols[0] + cols[-1] + 1) // 2
        y0, x0 = max(0, -dy), max(0, -dx)
        y1, x1 = min(h, canvas - dy), min(w, canvas - dx)
        out[i, y0 + dy : y1 + dy, x0 + dx : x1 + dx] = fg[i, y0:y1, x0:x1]
    return out


def fit_shapes(images, chunk: int = 256) -> ShapeFit:
    """Fit a clean render of every kind to each image's foreground (N images, (N, 3, H, W), float in
    [-1, 1] or uint8). Images larger than the canvas allows are refused."""
    images = _as_uint8(images)  # once: the foreground and the colour test both read it
    fg = foreground(images)  # (N, H, W)
    if max(fg.shape[1:]) > _CANVAS - 8:
        raise ValueError(f"the shape judge takes images up to {_CANVAS - 8} px, got {fg.shape[1:]}")
    bank, areas, kinds = _template_bank()
    n = len(fg)
    iou = np.zeros((n, len(SHAPES)), dtype=np.float32)
    for start in range(0, n, chunk):
        f = _paste(fg[start : start + chunk]).reshape(-1, _CANVAS * _CANVAS)  # (B, P)
        inter = f @ bank.T  # (B, K)
        union = f.sum(1, keepdims=True) + areas[None] - inter
        scores = inter / np.maximum(union, 1.0)
        for k in range(len(SHAPES)):
            iou[start : start + chunk, k] = scores[:, kinds == k].max(1)
    kind = np.where(fg.reshape(n, -1).any(1), iou.argmax(1), -1)
    return ShapeFit(iou=iou, kind=kind, one_colour=one_colour(images, fg))


def strict_pass(images, labels) -> np.ndarray:
    """(N,) bool: the strict verdict for images (N, 3, H, W) asked to be the kinds ``labels`` (N,)."""
    return fit_shapes(images).passes(labels)


def on_palette(images) -> np.ndarray:
    """(N,) bool: the background (the border's median) and the shape (the median of the pixels far from
    it) are both within 40/255 (RGB distance) of a palette colour, and there is a shape at all."""
    img = _as_uint8(images).astype(np.float32)
    bg = _border_median(img)  # (N, 3)
    out = np.zeros(len(img), dtype=bool)
    for i in range(len(img)):
        pix = img[i].reshape(3, -1).T  # (H*W, 3)
        far = pix[np.linalg.norm(pix - bg[i], axis=1) > FG_DISTANCE]
        if len(far) < 3:
            continue
        fg = np.median(far, axis=0)
        out[i] = all(np.linalg.norm(_PALETTE - c, axis=1).min() < _PALETTE_TOL for c in (bg[i], fg))
    return out


def strict_scores(images, labels) -> dict[str, float]:
    """The strict judge's summary of class-conditional samples: the pass rate overall (``strict``) and per
    asked kind (``strict_circle`` ...), and the share with both colours on the palette (``colours``)."""
    labels = np.asarray(labels, dtype=np.int64)
    images = _as_uint8(images)  # once, for the fit and the palette test
    passed = strict_pass(images, labels)
    out = {"strict": float(passed.mean())}
    for k, name in enumerate(SHAPES):
        sel = labels == k
        if sel.any():
            out[f"strict_{name}"] = float(passed[sel].mean())
    out["colours"] = float(on_palette(images).mean())
    return out
