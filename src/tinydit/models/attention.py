"""Softmax attention, softmax(q k^T / sqrt(Dh)) v, through the kernel that is fastest where it runs.

    attention(q, k, v, mask)   q (N, h, Tq, Dh), k and v (N, h, Tk, Dh), mask bool broadcastable to
                               (N, h, Tq, Tk), True = may attend  ->  (N, h, Tq, Dh)

Two kernels compute the same function:

- ``sdpa``: PyTorch's ``F.scaled_dot_product_attention``: a fused kernel (flash attention without a
  mask, on CUDA and on CPU; with a mask, memory-efficient attention on CUDA) that never stores the
  (Tq, Tk) score matrix, which is what long sequences on a GPU need.
- ``matmul``: the formula written out as two batched matmuls and a softmax. At the token counts TinyDiT
  trains on a CPU (49-64 patches) the score matrices are small (4 MiB for a batch of 128 at T = 64 in
  bf16), and PyTorch's CPU flash-attention backward is slow in bf16 (``python
  benchmarks/bench_attention.py`` times both).

``auto`` (the default) picks ``matmul`` for bf16 on a CPU with native bf16 matmuls (AVX512-BF16, AMX),
bf16 inputs or CPU autocast to bf16, where it was the faster kernel at every shape measured (T = 49 to
256), and ``sdpa`` everywhere else: in fp32 on a CPU SDPA was as fast or faster; fp16 matmuls are
emulated on CPUs (written out they were slower than SDPA), and so are bf16 ones without native support;
on a GPU the fused kernels are the point.

``ATTENTION.use("sdpa")`` (``attention_backend``) forces one kernel, for benchmarks and tests. The setting is one per
process, not per thread; a compiled model recompiles when it changes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tinydit.runtime import KernelSwitch, cpu_has_native_bf16

__all__ = ["ATTENTION", "BACKENDS", "attention", "attention_backend", "matmul_attention", "resolve_backend"]

ATTENTION = KernelSwitch("attention", ("sdpa", "matmul"))
BACKENDS = ATTENTION.choices
attention_backend = ATTENTION.use
_CPU_NATIVE_BF16 = cpu_has_native_bf16()  # asked once: a plain global is what torch.compile reads best


def resolve_backend(q: torch.Tensor) -> str:
    """The kernel attention() will use for queries q: the forced one, or auto's choice for q's device and
    dtype. Under CPU autocast to bf16 both kernels run in bf16 whatever q's own dtype."""
    if ATTENTION.forced != "auto":
        return ATTENTION.forced
    if q.device.type != "cpu" or not _CPU_NATIVE_BF16:
        return "sdpa"
    autocast_bf16 = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    return "matmul" if q.dtype == torch.bfloat16 or autocast_bf16 else "sdpa"


def matmul_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh)) v as two batched matmuls; shapes as in attention()."""
    scores = (q * (1 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)  # (N, h, Tq, Tk); scaling q is the cheaper side
    if mask is None:
        return scores.softmax(dim=-1) @ v  # (N, h, Tq, Dh)
    # The lowest finite logit rather than -inf: a query with no key to attend to then gets uniform weights,
    # zeroed below as SDPA zeroes them, where -inf would give NaN weights and NaN gradients.
    weights = scores.masked_fill(~mask, torch.finfo(scores.dtype).min).softmax(dim=-1)
    return weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0) @ v


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh)) v: q (N, h, Tq, Dh), k and v (N, h, Tk, Dh) -> (N, h, Tq, Dh).

    mask: bool, broadcastable to (N, h, Tq, Tk), True where a query may attend to a key; a query that
    may attend to none gets zeros, from either kernel.
    """
    if resolve_backend(q) == "matmul":
        return matmul_attention(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
