"""A small line plot drawn with PIL, so plots need no matplotlib: axes, ticks, grid lines, a legend.

``line_plot`` draws series of (x, y) points, x on a log2 axis (model evaluations double with the
steps), y on a linear axis, or on a log10 axis when the values span more than a factor of 20.
"""

from __future__ import annotations

import math
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

__all__ = ["line_plot", "nice_ticks"]

# matplotlib's "tab10" colours: distinct, and readable by most colour-blind viewers
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf"]  # fmt: skip
MARKERS = ["circle", "square", "triangle", "diamond"]


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)  # a scalable font (Pillow >= 10.1 with FreeType)
    except (TypeError, OSError, ImportError):
        return ImageFont.load_default()


def nice_ticks(lo: float, hi: float, target: int = 6) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / target
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    return [round(first + i * step, 12) for i in range(int(math.ceil((hi - first) / step)) + 1)]


def _text(draw: ImageDraw.ImageDraw, xy: tuple[float, float], text: str, font, anchor: str = "la") -> None:
    """Text placed by an anchor (horizontal l/m/r, vertical t/m/b), computed here so bitmap fonts work too."""
    x0, y0, x1, y1 = draw.textbbox((0, 0), text, font=font)
    w, h = x1 - x0, y1 - y0
    dx = {"l": 0, "m": w / 2, "r": w}[anchor[0]] + x0
    dy = {"t": 0, "m": h / 2, "b": h, "a": 0}[anchor[1]] + y0
    draw.text((xy[0] - dx, xy[1] - dy), text, fill="black", font=font)


def _label(v: float) -> str:
    return f"{v:.6g}" if abs(v) < 1e5 else f"{v:.0e}"


def _marker(draw: ImageDraw.ImageDraw, kind: str, x: float, y: float, r: float, color: str) -> None:
    if kind == "square":
        draw.rectangle([x - r, y - r, x + r, y + r], fill=color)
    elif kind == "triangle":
        draw.polygon([(x, y - r * 1.2), (x - r * 1.1, y + r * 0.8), (x + r * 1.1, y + r * 0.8)], fill=color)
    elif kind == "diamond":
        draw.polygon([(x, y - r * 1.3), (x + r * 1.3, y), (x, y + r * 1.3), (x - r * 1.3, y)], fill=color)
    else:
        draw.ellipse([x - r, y - r, x + r, y + r], fill=color)


def line_plot(
    series: list[tuple[str, list[float], list[float]]],
    path: str | Path,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    markers: list[str] | None = None,
    size: tuple[int, int] = (960, 600),
) -> Path:
    """Draw ``series`` of (label, xs, ys) as lines with markers into the PNG ``path``.

    x must be positive (log2 axis). Points with a non-finite coordinate are left out. ``markers`` names
    one marker per series (circle, square, triangle, diamond); colours cycle through ``COLORS``.
    """
    width, height = size
    font, small = _font(15), _font(13)
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    pts = [[(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(x) and math.isfinite(y) and x > 0]
           for _, xs, ys in series]  # fmt: skip
    allx = [p[0] for s in pts for p in s] or [1.0, 2.0]
    ally = [p[1] for s in pts for p in s] or [0.0, 1.0]

    # axes ranges, a little wider than the data: log2 x; log10 y if all y > 0 and they span more than 20x
    logy = min(ally) > 0 and max(ally) / min(ally) > 20
    x_lo, x_hi = math.log2(min(allx)) - 0.15, math.log2(max(allx)) + 0.15
    xticks = [2.0**k for k in range(math.ceil(x_lo), math.floor(x_hi) + 1)] or sorted(set(allx))
    if logy:
        y_lo, y_hi = math.log10(min(ally)), math.log10(max(ally))
        y_lo, y_hi = y_lo - 0.05 * (y_hi - y_lo), y_hi + 0.05 * (y_hi - y_lo)
        yticks = [m * 10.0**k for k in range(math.floor(y_lo), math.ceil(y_hi) + 1) for m in (1, 2, 5)
                  if y_lo <= math.log10(m * 10.0**k) <= y_hi]  # fmt: skip
    else:
        pad = 0.05 * (max(ally) - min(ally)) or 0.5
        y_lo, y_hi = min(ally) - pad, max(ally) + pad
        if min(ally) >= 0:
            y_lo = max(y_lo, 0.0)
        yticks = [v for v in nice_ticks(y_lo, y_hi, target=8) if y_lo <= v <= y_hi]

    legend_w = max((draw.textlength(label, font=small) for label, _, _ in series), default=0) + 50
    left, right, top, bottom = 80, width - 30 - legend_w, 50, height - 70

    def px(x: float) -> float:
        return left + (math.log2(x) - x_lo) / (x_hi - x_lo) * (right - left)

    def py(y: float) -> float:
        v = math.log10(y) if logy else y
        return bottom - (v - y_lo) / (y_hi - y_lo) * (bottom - top)

    # grid, ticks and tick labels
    for v in xticks:
        x = px(v)
        draw.line([(x, top), (x, bottom)], fill="#e6e6e6")
        draw.line([(x, bottom), (x, bottom + 5)], fill="black")
        _text(draw, (x, bottom + 8), _label(v), small, "mt")
    for v in yticks:
        y = py(v)
        draw.line([(left, y), (right, y)], fill="#e6e6e6")
        draw.line([(left - 5, y), (left, y)], fill="black")
        _text(draw, (left - 8, y), _label(v), small, "rm")
    draw.rectangle([left, top, right, bottom], outline="black")
    _text(draw, ((left + right) / 2, 18), title, font, "mt")
    _text(draw, ((left + right) / 2, height - 22), f"{xlabel} (log scale)".strip(), font, "mm")
    label_img = Image.new("RGBA", (bottom - top, 24), (255, 255, 255, 0))
    _text(ImageDraw.Draw(label_img), ((bottom - top) / 2, 12), ylabel + (" (log scale)" if logy else ""), font, "mm")
    rotated = label_img.rotate(90, expand=True)
    img.paste(rotated, (8, top), rotated)

    # the series, then the legend
    for i, ((label, _, _), points) in enumerate(zip(series, pts, strict=True)):
        color, marker = COLORS[i % len(COLORS)], (markers[i] if markers else MARKERS[0])
        xy = [(px(x), py(y)) for x, y in sorted(points)]
        if len(xy) > 1:
            draw.line(xy, fill=color, width=2, joint="curve")
        for x, y in xy:
            _marker(draw, marker, x, y, 4, color)
        ly = top + 10 + 22 * i
        draw.line([(right + 15, ly), (right + 40, ly)], fill=color, width=2)
        _marker(draw, marker, right + 27.5, ly, 4, color)
        _text(draw, (right + 46, ly), label, small, "lm")
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.png")
    img.save(tmp)
    tmp.replace(path)
    return path
