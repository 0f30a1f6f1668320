"""Generated images on disk: one grid image, a folder of images, or an .npz of uint8 arrays, written by
``write_samples`` and read back by ``load_samples`` (what ``tinydit eval --samples`` scores).

The .npz holds ``images`` uint8 (N, C, H, W) and ``labels`` int64 (N,), the layout ``tinydit eval``
and most evaluation code read.
"""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from tinydit.data.datasets import IMG_EXTS
from tinydit.errors import TinyDiTError
from tinydit.files import atomic_write
from tinydit.images import GRAY_MODES, make_grid, save_image, to_rgb, to_uint8

__all__ = ["IMAGE_SUFFIXES", "check_output", "write_samples", "load_samples", "safe_name"]

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


def load_samples(path: str | Path, classes: list[str] | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Images (as stored) and labels (or None) from an .npz or a folder of images.

    In a folder, a file named like ``00012_sneaker.png`` (as ``tinydit sample --out DIR`` writes)
    carries its class name; labels are read only when every file has one of ``classes``.
    """
    path = Path(path)
    if path.suffix == ".npz":
        if not path.is_file():
            raise TinyDiTError(f"samples file {path} does not exist")
        try:
            with np.load(path, allow_pickle=False) as npz:
                if "images" not in npz:
                    raise TinyDiTError(
                        f"{path} has no 'images' array (found {', '.join(npz.files) or 'none'}); "
                        "save the samples as images=(N, C, H, W) uint8"
                    )
                return npz["images"], (npz["labels"] if "labels" in npz else None)
        except (zipfile.BadZipFile, ValueError, OSError, EOFError) as err:
            raise TinyDiTError(f"{path} is not a readable .npz of arrays ({type(err).__name__}: {err})") from err
    if not path.is_dir():
        raise TinyDiTError(f"`samples` {path}: pass an .npz file or a folder of images")
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMG_EXTS)
    if not files:
        raise TinyDiTError(f"no images in {path}")
    arrays = []
    for p in files:
        with Image.open(p) as img:  # 16-bit, palette or RGBA files become plain 8-bit L or RGB pixels
            rgb = to_rgb(img)
            arrays.append(np.asarray(rgb.convert("L") if img.mode in GRAY_MODES else rgb))
    if len({a.shape for a in arrays}) > 1:
        raise TinyDiTError(f"the images in {path} have different sizes or modes; give all samples one size")
    images = np.stack(arrays)  # (N, H, W) or (N, H, W, 3)
    labels = None
    if classes:
        lookup = {safe_name(c): i for i, c in enumerate(classes)}
        names = [p.stem.partition("_")[2].lower() for p in files]
        if all(n in lookup for n in names):
            labels = np.array([lookup[n] for n in names], dtype=np.int64)
    return images, labels
