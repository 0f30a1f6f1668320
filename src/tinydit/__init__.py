"""TinyDiT: flow-matching Diffusion Transformers on small images, on a laptop CPU or a GPU.

Conventions used across the package:

* images are float32, layout (N, C, H, W), values in [-1, 1]; files on disk are 8-bit images
* time follows the rectified-flow convention of SD3 / minRF: t = 0 is data, t = 1 is noise
  (see ``tinydit.flow``)

Shape legend used in comments and docstrings:

    N  batch size              C  image channels (3 RGB, 1 grayscale)
    H  image height            W  image width
    p  patch size              T  tokens per image = (H / p) * (W / p)
    D  model width (``dim``)   h  attention heads, Dh = D / h the head width
    L  token ids per caption (BOS + the longest training caption; ``tinydit.text``)
"""

from __future__ import annotations

import torch

__version__ = "0.1.0"

__all__ = ["__version__", "get_device"]


def get_device() -> torch.device:
    """The best available device: CUDA, then Apple's MPS, then the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")
