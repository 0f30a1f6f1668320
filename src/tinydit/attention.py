"""Softmax attention, softmax(q k^T / sqrt(Dh)) v, through the kernel that is fastest where it runs.

    attention(q, k, v, mask)   q (N, h, Tq, Dh), k and v (N, h, Tk, Dh), mask bool broadcastable to
                               (N, h, Tq, Tk), True = may attend  ->  (N, h, Tq, Dh)

Two kernels compute the same function:

- ``sdpa``: PyTorch's ``F.scaled_dot_product_attention``, flash attention on CUDA and on CPU. It never
  stores the (Tq, Tk) score matrix, which is what long sequences on a GPU need.
- ``matmul``: the formula written out as two batched matmuls and a softmax. At the token counts TinyDiT
  trains on a CPU (49-64 patches) the score matrices are small (4 MiB for a batch of 128 at T = 64 in
  bf16), and PyTorch's CPU flash-attention backward is slow in bf16: on our 2-core AVX-512 machine a
  bf16 forward and backward at (N, h, T, Dh) = (128, 4, 64, 32) took 33 ms through SDPA and 5 ms
  written out (``python benchmarks/bench_attention.py``; table in benchmarks/README.md).

``auto`` (the default) picks ``matmul`` for bf16 and fp16 inputs on a CPU, where it was the faster
kernel at every shape measured (T = 49 to 256), and ``sdpa`` everywhere else: in fp32 on a CPU SDPA was
as fast or faster, and on a GPU its fused kernels are the point. ``attention_backend("sdpa")`` forces
one kernel, for benchmarks and tests.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from tinydit.errors import TinyDiTError

__all__ = ["BACKENDS", "attention", "attention_backend", "matmul_attention", "resolve_backend"]

BACKENDS = ("auto", "sdpa", "matmul")
_backend = "auto"  # set through attention_backend()


@contextlib.contextmanager
def attention_backend(name: str) -> Iterator[None]:
    """Use kernel ``name`` (one of BACKENDS) for every attention() call inside the block."""
    global _backend
    if name not in BACKENDS:
        raise TinyDiTError(f"attention backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    previous, _backend = _backend, name
    try:
        yield
    finally:
        _backend = previous


def resolve_backend(q: torch.Tensor) -> str:
    """The kernel attention() will use for queries q: the forced one, or auto's choice for q's device and
    dtype. Under CPU autocast to bf16 or fp16 both kernels run in that dtype whatever q's own."""
    if _backend != "auto":
        return _backend
    if q.device.type != "cpu":
        return "sdpa"
    half = (torch.bfloat16, torch.float16)
    autocast_half = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") in half
    return "matmul" if q.dtype in half or autocast_half else "sdpa"


def matmul_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh)) v as two batched matmuls; shapes as in attention()."""
    scores = (q * (1 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)  # (N, h, Tq, Tk); scaling q is the cheaper side
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v  # (N, h, Tq, Dh)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh)) v: q (N, h, Tq, Dh), k and v (N, h, Tk, Dh) -> (N, h, Tq, Dh).

    mask: bool, broadcastable to (N, h, Tq, Tk), True where a query may attend to a key; every query
    needs at least one key it may attend to.
    """
    if resolve_backend(q) == "matmul":
        return matmul_attention(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
