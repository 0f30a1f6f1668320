"""Line plots with matplotlib, for the sweep's quality-against-evaluations plot and training curves.

Figures are built with ``matplotlib.figure.Figure`` directly (no pyplot), so plotting never touches a
global figure state or a display, and every PNG is written through the one atomic writer.
"""

from __future__ import annotations

import math
from pathlib import Path

from tinydit.files import atomic_write

__all__ = ["line_plot", "MARKERS"]

MARKERS = ["o", "s", "^", "D"]  # one per sampler: circle, square, triangle, diamond


def line_plot(
    series: list[tuple[str, list[float], list[float]]],
    path: str | Path,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    markers: list[str] | None = None,
    size: tuple[int, int] = (960, 600),
    logx: bool = True,
) -> Path:
    """Draw ``series`` of (label, xs, ys) as lines with markers into the PNG ``path`` (``size`` in pixels).

    With ``logx`` the x axis is log2 (model evaluations double with the steps) and x must be positive.
    y is linear, or log10 when all values are positive and span more than a factor of 20. Points with a
    non-finite coordinate are left out. Colours follow matplotlib's "tab10" cycle.
    """
    from matplotlib.figure import Figure  # here: matplotlib costs a second at every start of the CLI

    dpi = 100
    fig = Figure(figsize=(size[0] / dpi, size[1] / dpi), dpi=dpi, layout="constrained")
    ax = fig.add_subplot()
    ys_all = []
    for i, (label, xs, ys) in enumerate(series):
        pts = sorted(
            (x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(x) and math.isfinite(y) and (x > 0 or not logx)
        )
        ys_all += [y for _, y in pts]
        marker = markers[i] if markers else MARKERS[i % len(MARKERS)]
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker=marker, linewidth=2, markersize=6, label=label)
    if logx:
        ax.set_xscale("log", base=2)
    if ys_all and min(ys_all) > 0 and max(ys_all) / min(ys_all) > 20:
        ax.set_yscale("log")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(True, which="major", alpha=0.3)
    if series:
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    path = Path(path)
    with atomic_write(path) as f:
        fig.savefig(f, format="png", dpi=dpi)
    return path
