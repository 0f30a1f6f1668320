"""Linear maps over tokens, through whichever of PyTorch's two CPU matmul libraries is faster here.

    TokenLinear(in_features, out_features)   an ``nn.Linear`` (same weights, same state dict) whose
                                             forward maps x (..., D_in) -> (..., D_out)
    onednn_linear(x, weight, bias)           F.linear(x, weight, bias) computed as a 1x1 convolution

On a CPU PyTorch sends an fp32 ``F.linear`` to its BLAS (MKL in the x86 wheels) and a convolution to
oneDNN. On our 2-core AMD EPYC with AVX-512, MKL's best square fp32 matmul ran at 223 GFLOP/s and
oneDNN's at 448 (``python benchmarks/bench_train.py`` prints both; ``MKL_ENABLE_INSTRUCTIONS=AVX512``
changed nothing). A
linear map applied to every token is a 1x1 convolution over a one-pixel-wide image whose pixels are the
tokens, and a contiguous (..., D) tensor already is such an image in channels-last layout, so the
convolution reads and writes the tokens where they lie. The forward and backward of dit-1.9m's token
linears ran 1.7-2.0x faster this way, and a whole fp32 training step of ``tinydit train`` 1.28x and
1.36x (benchmarks/README.md).

Backends, chosen per process with ``linear_backend(name)`` (for benchmarks and tests):

- ``blas``: ``F.linear``.
- ``onednn``: ``onednn_linear`` for inputs on a CPU, ``F.linear`` elsewhere.
- ``auto`` (the default): ``onednn`` for fp32 inputs on a CPU outside autocast where a probe, run once
  per process on first use (about 30 ms), timed oneDNN at least ``PROBE_SPEEDUP`` times faster than
  BLAS; ``blas`` everywhere else. The margin keeps a machine where the two libraries are level on
  BLAS, so that a noisy probe cannot flip the choice. Under bf16 autocast PyTorch already sends
  linear maps to oneDNN, and in the trainer the convolution gained nothing there; on a GPU both go to
  cuBLAS/cuDNN.

PyTorch (2.14) hands a one-image fp32 convolution to oneDNN only above 20,480 input values and with
more than one thread. Smaller inputs (one or two images) get its generic kernel, which copies them and
was slightly slower than ``F.linear`` (0.09 against 0.06 ms for 64 tokens of width 128): too little to
be worth a second rule. With one thread every input gets that kernel, the probe times it too, and it
finds nothing to gain.

The two kernels sum in different orders, so their outputs differ by float32 rounding (about 1e-7
relative). A training checkpoint records the kernel its run used, and a continuation on the same kind
of device in the same precision keeps it (``tinydit.train``), so that it stays exact.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from tinydit.errors import TinyDiTError

__all__ = ["BACKENDS", "PROBE_SPEEDUP", "TokenLinear", "linear_backend", "onednn_is_faster",
           "onednn_linear", "resolve_backend", "token_linear"]  # fmt: skip

BACKENDS = ("auto", "blas", "onednn")
PROBE_SPEEDUP = 1.15  # auto takes oneDNN only where the probe timed it at least this much faster
_backend = "auto"  # set through linear_backend()
_onednn_faster: bool | None = None  # the probe's answer, measured on first use


@contextlib.contextmanager
def linear_backend(name: str) -> Iterator[None]:
    """Use kernel ``name`` (one of BACKENDS) for every TokenLinear inside the block."""
    global _backend
    if name not in BACKENDS:
        raise TinyDiTError(f"linear backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    previous, _backend = _backend, name
    try:
        yield
    finally:
        _backend = previous


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., D_in), weight (D_out, D_in), bias (D_out,) -> x weight^T + bias (..., D_out), as a 1x1
    convolution over the M = x.numel() / D_in tokens laid out as one channels-last image."""
    *lead, d = x.shape
    if x.numel() == 0:  # no pixels to convolve
        return F.linear(x, weight, bias)
    pixels = x.reshape(1, -1, 1, d).permute(0, 3, 1, 2)  # (1, D_in, M, 1), channels-last: x's own memory
    y = F.conv2d(pixels, weight[:, :, None, None], bias)  # (1, D_out, M, 1), channels-last
    return y.permute(0, 2, 3, 1).reshape(*lead, weight.shape[0])  # (..., D_out)


@torch.compiler.disable  # timing code: never traced, even when a model is compiled before anything probed
def _probe(rounds: int = 5) -> bool:
    """True if oneDNN ran an fp32 (4096 x 256) @ (256 x 256) product at least PROBE_SPEEDUP times faster
    than BLAS on this CPU (fastest of ``rounds`` timings each, taken in turns after a warm-up)."""
    if not torch.backends.mkldnn.is_available():
        return False
    g = torch.Generator().manual_seed(0)  # its own generator: the probe leaves the global RNG alone
    x, w, b = torch.randn(4096, 256, generator=g), torch.randn(256, 256, generator=g), torch.zeros(256)
    blas, onednn = [], []
    try:
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            for _ in range(rounds + 1):  # the first round is the warm-up
                start = time.perf_counter()
                F.linear(x, w, b)
                mid = time.perf_counter()
                onednn_linear(x, w, b)
                blas.append(mid - start)
                onednn.append(time.perf_counter() - mid)
    except RuntimeError:  # a build whose oneDNN cannot run this convolution
        return False
    return min(blas[1:]) >= PROBE_SPEEDUP * min(onednn[1:])


def onednn_is_faster() -> bool:
    """Whether auto sends fp32 CPU linear maps to oneDNN: the probe's answer, measured once per process.

    ``tinydit.runtime.maybe_compile`` asks before compiling, so that compiled code only reads the answer.
    """
    global _onednn_faster
    if _onednn_faster is None:
        _onednn_faster = _probe()
    return _onednn_faster


def resolve_backend(x: torch.Tensor) -> str:
    """The kernel a TokenLinear uses for input x: ``blas`` or ``onednn`` (see the module docstring)."""
    if _backend == "blas" or x.device.type != "cpu":
        return "blas"
    if _backend == "onednn":
        return "onednn"
    fp32 = x.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
    return "onednn" if fp32 and onednn_is_faster() else "blas"


def token_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) through the kernel resolve_backend(x) names: x (..., D_in) -> (..., D_out)."""
    if resolve_backend(x) == "onednn":
        return onednn_linear(x, weight, bias)
    return F.linear(x, weight, bias)


class TokenLinear(nn.Linear):
    """``nn.Linear`` for maps applied to every token (QKV, projections, MLPs, the output layer): the same
    parameters and state dict, computed through ``tinydit.linear``'s faster kernel for the input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., in_features) -> (..., out_features)"""
        return token_linear(x, self.weight, self.bias)
