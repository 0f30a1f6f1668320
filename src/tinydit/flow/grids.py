"""Time grids for the fixed-step samplers: where they step, from t = 1 (noise) down to t = 0 (data).

Each grid is a function ``steps -> (steps + 1,)`` float64 tensor on the CPU (exact in the sampler's
arithmetic on any device), registered by name in ``GRIDS`` and chosen with ``time_grid(steps, name)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from tinydit.errors import TinyDiTError

__all__ = [
    "DEFAULT_SHIFT",
    "GRIDS",
    "GRID_NAMES",
    "uniform_grid",
    "shifted_grid",
    "time_grid",
    "check_grid",
    "checked_time_grid",
]

DEFAULT_SHIFT = 3.0  # SD3's sampling shift (Esser et al. 2024, sec. 5.3.2)


def uniform_grid(steps: int) -> torch.Tensor:
    """Equal steps from t = 1 to t = 0: (steps + 1,)."""
    return torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)


def shifted_grid(steps: int, shift: float = DEFAULT_SHIFT) -> torch.Tensor:
    """The uniform grid mapped through t' = s t / (1 + (s - 1) t) (SD3 eq. 23): (steps + 1,).

    With s > 1 the steps are short near the noise (dt'/dt = 1/s at t = 1), where the layout of an image
    is decided, and long near the data (dt'/dt = s at t = 0). s = 1 is the uniform grid.
    """
    t = uniform_grid(steps)
    return shift * t / (1 + (shift - 1) * t)


GRIDS: dict[str, Callable[..., torch.Tensor]] = {"uniform": uniform_grid, "shifted": shifted_grid}
GRID_NAMES = tuple(GRIDS)


def check_grid(grid: str, shift: float | None = None) -> None:
    """Raise TinyDiTError unless ``grid`` names a grid and ``shift`` is one it takes."""
    if grid not in GRIDS:
        raise TinyDiTError(f"unknown time grid {grid!r}: use one of {', '.join(GRIDS)}")
    if shift is not None and grid != "shifted":
        raise TinyDiTError(f"`shift` applies to the shifted grid only; add `grid` shifted (got `grid` {grid})")
    if shift is not None and not (math.isfinite(shift) and shift > 0):
        raise TinyDiTError(f"`shift` must be a positive number (1 = uniform, SD3 uses 3), got {shift}")


def time_grid(steps: int, grid: str = "uniform", shift: float | None = None) -> torch.Tensor:
    """The grid called ``grid``: (steps + 1,) float64, t[0] = 1 and t[-1] = 0 exactly."""
    check_grid(grid, shift)
    return checked_time_grid(steps, grid, shift)


def checked_time_grid(steps: int, grid: str, shift: float | None) -> torch.Tensor:
    """``time_grid`` for callers that checked ``grid`` and ``shift`` already (the samplers)."""
    ts = uniform_grid(steps) if grid == "uniform" else shifted_grid(steps, DEFAULT_SHIFT if shift is None else shift)
    ts[0], ts[-1] = 1.0, 0.0  # exact ends, whatever the rounding in between
    return ts
