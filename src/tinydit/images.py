"""Image <-> tensor utilities (series post 2).

Convention for the whole package:

* model tensors are float32, layout (N, C, H, W), values in [-1, 1]
* files on disk are ordinary 8-bit images (RGB, or grayscale "L" for one-channel data)

Channels always move with ``permute``; ``reshape`` would silently interleave them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from tinydit.files import atomic_write

__all__ = [
    "GRAY_MODES",
    "to_rgb",
    "pil_to_tensor",
    "tensor_to_pil",
    "to_model_range",
    "from_model_range",
    "to_uint8",
    "from_uint8",
    "load_image",
    "save_image",
    "make_grid",
    "save_grid",
]


GRAY_MODES = ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F")


def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL image as 8-bit RGB. 16- and 32-bit images are scaled to 8 bits (PIL's own conversion
    clips them, which turns a 16-bit photo almost white); transparency is composited onto white;
    palette, CMYK and the rest convert as PIL converts them; an animation gives its first frame."""
    if img.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
        arr = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0
        img = Image.fromarray(np.clip(arr / top * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")
    if img.mode in ("RGBA", "LA", "PA", "La", "RGBa") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        img = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    return img.convert("RGB")


def pil_to_tensor(img: Image.Image) -> torch.Tensor:
    """PIL image -> float tensor (3, H, W) in [0, 1] (the image is converted to 8-bit RGB first, ``to_rgb``)."""
    arr = np.asarray(to_rgb(img), dtype=np.uint8)  # (H, W, 3)
    x = torch.from_numpy(arr.copy())  # uint8 (H, W, 3)
    x = x.permute(2, 0, 1)  # (3, H, W)
    return x.float() / 255.0


def tensor_to_pil(x: torch.Tensor) -> Image.Image:
    """Float tensor (C, H, W) in [0, 1], C = 3 or 1 -> PIL image ("RGB" or "L")."""
    if x.dim() != 3 or x.shape[0] not in (1, 3):
        raise ValueError(f"tensor_to_pil expects a (3, H, W) or (1, H, W) tensor, got {tuple(x.shape)}")
    x = x.detach().to("cpu", torch.float32).clamp(0, 1)
    arr = (x.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()  # (H, W, C)
    if arr.shape[2] == 1:
        return Image.fromarray(arr[:, :, 0])  # 2-D uint8 -> mode "L"
    return Image.fromarray(arr)  # (H, W, 3) uint8 -> mode "RGB"


def to_model_range(x: torch.Tensor) -> torch.Tensor:
    """[0, 1] -> [-1, 1]"""
    return x * 2.0 - 1.0


def from_model_range(x: torch.Tensor) -> torch.Tensor:
    """[-1, 1] -> [0, 1]"""
    return (x + 1.0) / 2.0


def to_uint8(x: torch.Tensor) -> torch.Tensor:
    """Model-range tensor (..., C, H, W) in [-1, 1] -> uint8 in [0, 255] on the CPU, rounded."""
    x = from_model_range(x.detach().to("cpu", torch.float32)).clamp(0, 1)
    return (x * 255).round().to(torch.uint8)


def from_uint8(x: torch.Tensor) -> torch.Tensor:
    """uint8 [0, 255] -> float32 in [-1, 1] (the inverse of ``to_uint8`` up to rounding)."""
    return x.float() / 127.5 - 1.0


def load_image(path: str | Path, size: int | None = 32, device: str | torch.device = "cpu") -> torch.Tensor:
    """Read an image file -> (1, 3, size, size) float tensor in [-1, 1] on ``device``."""
    with Image.open(path) as opened:
        img = to_rgb(opened)
    if size is not None:
        img = img.resize((size, size), Image.BICUBIC)
    x = to_model_range(pil_to_tensor(img))  # (3, H, W)
    return x.unsqueeze(0).to(device)  # (1, 3, H, W)


def save_image(x: torch.Tensor, path: str | Path) -> None:
    """Save a (C, H, W) or (1, C, H, W) tensor in [-1, 1] (C = 3 or 1) as an image file."""
    if x.dim() == 4:
        if x.shape[0] != 1:
            raise ValueError(f"save_image takes one image, got a batch of {x.shape[0]}; use save_grid")
        x = x[0]
    path = Path(path)
    fmt = Image.registered_extensions().get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"cannot tell an image format from {path.name!r}; use a suffix such as .png")
    with atomic_write(path) as f:  # never a half-written image, even on a full disk
        tensor_to_pil(from_model_range(x)).save(f, format=fmt)


def make_grid(x: torch.Tensor, nrow: int = 8, pad: int = 2) -> torch.Tensor:
    """(N, C, H, W) in [-1, 1] -> one (C, H', W') grid image in [-1, 1], ``nrow`` images per row.

    The background between images is white (+1).
    """
    n, c, h, w = x.shape
    ncol = max(1, min(nrow, n))
    nrows = (n + ncol - 1) // ncol
    grid = torch.ones(c, nrows * (h + pad) + pad, ncol * (w + pad) + pad, dtype=x.dtype, device=x.device)  # (C, H', W')
    for i in range(n):
        r, col = divmod(i, ncol)
        top, left = pad + r * (h + pad), pad + col * (w + pad)
        grid[:, top : top + h, left : left + w] = x[i]
    return grid


def save_grid(x: torch.Tensor, path: str | Path, nrow: int = 8, pad: int = 2) -> None:
    """Save a batch (N, C, H, W) in [-1, 1] as one grid image."""
    save_image(make_grid(x, nrow=nrow, pad=pad), path)
