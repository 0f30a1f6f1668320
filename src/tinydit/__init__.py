"""TinyDiT: flow-matching Diffusion Transformers on small images, on a CPU or a GPU.

The package, one idea a folder, imports pointing one way (``tests/test_layers.py`` enforces it):

    errors, config, runtime, files, images, tokens, progress, distributed   leaves: what every layer shares
    models/   architecture only: DiT, MMDiT, their layers and kernels, the registry, reading checkpoints
    data/     data sets and the in-memory cache, shapes, captions and the tokenizer, writing samples
    flow/     the method: path and loss, guidance, samplers, time grids, generation, few-step losses
    train/    the loop, optimizer and EMA, checkpoint writing and resume checks, teacher paths
    eval/     feature networks, metrics, evaluation, prompt adherence, sweeps, reports, plots
    export/   ONNX, torch.export and a web page of a model; a sampler with numpy and onnxruntime alone
    api       one function per command;  cli: the ``tinydit`` command over it

Conventions used across the package:

* images are float32, layout (N, C, H, W), values in [-1, 1]; files on disk are 8-bit images
* time follows the rectified-flow convention of SD3 / minRF: t = 0 is data, t = 1 is noise
  (see ``tinydit.flow.path``)

The one legend of letters, in comments, docstrings and names (each letter has this meaning only):

    N  images (or captions) in a batch     C  image channels (3 RGB, 1 grayscale)
    H  image height, W image width         p  patch size, g = H / p patches per side
    T  tokens per image = g * g            D  model width (``dim``)
    h  attention heads                     Dh head width = D / h
    L  token ids per caption (BOS + the longest training caption; ``tinydit.tokens``)
    x  images or tokens                    t  times (N,)            y  labels (N,) or caption ids (N, L)
    c  the conditioning vector (N, D)      ctx caption tokens (N, L, D)     v  velocity, shaped like x
    d  a shortcut model's step size (N,)   dt a sampler's signed step in t (negative: towards the data)
    cfg  a TrainConfig; ``config`` a model's DiTConfig; ``cfg_scale`` a guidance scale
"""

from __future__ import annotations

import os

# Before torch loads, which reads it once: an operation MPS lacks then runs on the CPU with a warning, not an error.
os.environ.setdefault("PYTORCH_ENABLE_MPS_FALLBACK", "1")

from tinydit.runtime import get_device  # noqa: E402 (it imports torch: after the line above)
from tinydit.version import __version__  # noqa: E402

__all__ = ["__version__", "get_device", "from_pretrained"]


def from_pretrained(path, ema: bool = True, device="cpu"):
    """The model of a pretrained folder, a Hub id, a training checkpoint or a run directory, in eval mode
    (``tinydit.api.from_pretrained``, imported on the first call, so that ``import tinydit`` stays light)."""
    from tinydit.api import from_pretrained as load

    return load(path, ema=ema, device=device)
