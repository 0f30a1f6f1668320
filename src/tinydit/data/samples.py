"""Writing generated images: one grid image, a folder of images, or an .npz of uint8 arrays.

The .npz holds ``images`` uint8 (N, C, H, W) and ``labels`` int64 (N,), the layout ``tinydit eval``
and most evaluation code read.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import torch

from tinydit.errors import TinyDiTError
from tinydit.files import atomic_write
from tinydit.images import make_grid, save_image, to_uint8

__all__ = ["IMAGE_SUFFIXES", "check_output", "write_samples", "safe_name"]

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}


def safe_name(name: str) -> str:
    """A class name as it appears in file names (``00012_ankle-boot.png``); ``tinydit eval`` reads it back."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-").lower()


def check_output(path: str | Path) -> Path:
    """Fail early, before any sampling, if ``path`` cannot be written."""
    path = Path(path)
    folder = path if not path.suffix else path.parent
    if folder.exists() and not folder.is_dir():
        raise TinyDiTError(f"{folder} exists and is not a directory; choose another `out`")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TinyDiTError(f"cannot create output directory {folder} ({err.strerror}); choose another `out`") from err
    if not os.access(folder, os.W_OK):
        raise TinyDiTError(f"output directory {folder} is not writable; choose another `out`")
    if path.suffix and path.suffix.lower() not in IMAGE_SUFFIXES | {".npz"}:
        raise TinyDiTError(
            f"`out` {path}: use an image file ({', '.join(sorted(IMAGE_SUFFIXES))}), an .npz, or a directory"
        )
    return path


def write_samples(
    images: torch.Tensor, labels: torch.Tensor, path: str | Path, classes: list[str], nrow: int = 8
) -> Path:
    """images (N, C, H, W) in [-1, 1], labels (N,) -> ``path`` (.png grid, .npz, or a directory)."""
    path = check_output(path)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        with atomic_write(path) as f:
            np.savez_compressed(f, images=to_uint8(images).numpy(), labels=labels.to(torch.int64).cpu().numpy())
    elif suffix:
        save_image(make_grid(images.cpu(), nrow=nrow), path)
    else:
        for i, (x, y) in enumerate(zip(images, labels.tolist(), strict=True)):
            save_image(x, path / f"{i:05d}_{safe_name(classes[y]) or f'class{y}'}.png")
    return path
