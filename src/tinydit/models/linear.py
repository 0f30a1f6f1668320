"""Linear maps over tokens, through whichever of PyTorch's two CPU matmul libraries is faster here.

    TokenLinear(in_features, out_features)   an ``nn.Linear`` (same weights, same state dict) whose
                                             forward maps x (..., D_in) -> (..., D_out)
    onednn_linear(x, weight, bias)           F.linear(x, weight, bias) computed as a 1x1 convolution

On a CPU PyTorch sends an fp32 ``F.linear`` to its BLAS (MKL in the x86 wheels) and a convolution to
oneDNN, and on some CPUs (our AMD EPYC among them) MKL runs far below oneDNN's rate
(``python benchmarks/bench_train.py`` prints both). A linear map applied to every token is a 1x1
convolution over a one-pixel-wide image whose pixels are the tokens, and a contiguous (..., D) tensor
already is such an image in channels-last layout, so the convolution reads and writes the tokens
where they lie.

Backends, chosen per process with ``LINEAR.use(name)`` (``linear_backend``) (for benchmarks and tests):

- ``blas``: ``F.linear``.
- ``onednn``: ``onednn_linear`` for inputs on a CPU, ``F.linear`` elsewhere.
- ``auto`` (the default): ``onednn`` for fp32 inputs on a CPU outside autocast where a probe, run once
  per machine on first use (tens of milliseconds) and kept in the machine record (``tinydit.machine``),
  timed oneDNN at least ``PROBE_SPEEDUP`` times faster than BLAS; ``blas`` everywhere else. The margin
  keeps a machine where the two libraries are level on BLAS, so that a noisy probe cannot flip the choice.
  Under bf16 autocast PyTorch already sends linear maps to oneDNN, and in the trainer the convolution
  gained nothing there; on a GPU both go to cuBLAS/cuDNN.

PyTorch (2.14) hands a one-image fp32 convolution to oneDNN only above 20,480 input values and with
more than one thread. Smaller inputs (one or two images) get its generic kernel, which copies them and
was slightly slower than ``F.linear``, by too little to be worth a second rule. With
one thread every input gets that kernel, the probe times it too, and it
finds nothing to gain.

The two kernels sum in different orders, so their outputs differ by float32 rounding (about 1e-7
relative). So the probe's answer is kept per machine: two runs of one command and seed on a machine use
one kernel, whatever each process would time. A training checkpoint records the kernel its run used, and
a continuation on the same kind of device in the same precision keeps it (``tinydit.train.trainer``), so
that it stays exact on another machine too.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from tinydit import machine
from tinydit.runtime import KernelSwitch

__all__ = [
    "LINEAR",
    "BACKENDS",
    "PROBE_SPEEDUP",
    "TokenLinear",
    "linear_backend",
    "onednn_is_faster",
    "onednn_linear",
    "resolve_backend",
    "token_linear",
]

PROBE_SPEEDUP = 1.15  # auto takes oneDNN only where the probe timed it at least this much faster
_onednn_faster: bool | None = None  # the probe's answer, read or measured on first use


def _pixels(x: torch.Tensor) -> torch.Tensor:
    """(..., D) -> (1, D, M, 1): the M tokens as one image one pixel wide, channels-last (for a contiguous
    x, x's own memory)."""
    return x.reshape(1, -1, 1, x.shape[-1]).permute(0, 3, 1, 2)


def _tokens(y: torch.Tensor, lead: torch.Size | tuple) -> torch.Tensor:
    """(1, D, M, 1) -> (*lead, D), the inverse of _pixels; contiguous."""
    return y.permute(0, 2, 3, 1).reshape(*lead, y.shape[1])


def _conv_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The 1x1 convolution itself, on plain tensors (PyTorch's autograd differentiates it in eager mode)."""
    y = F.conv2d(_pixels(x), weight[:, :, None, None], bias)  # (1, D_out, M, 1), channels-last
    return _tokens(y, x.shape[:-1])  # (..., D_out)


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., D_in), weight (D_out, D_in), bias (D_out,) -> x weight^T + bias (..., D_out), as a 1x1
    convolution over the M = x.numel() / D_in tokens laid out as one channels-last image.

    Eager code calls the convolution directly. Compiled code calls it as one opaque operator
    (``tinydit::onednn_linear``, with its own backward), because Inductor would otherwise lay the
    one-pixel-wide image out channels-first, and oneDNN then converts it, in and out, at every call,
    which made compiled code slower than eager (``benchmarks/bench_train.py --modes``).
    """
    if x.numel() == 0:  # no pixels to convolve
        return F.linear(x, weight, bias)
    if not torch.compiler.is_compiling():
        return _conv_linear(x, weight, bias)
    if torch.is_autocast_enabled(x.device.type):  # a custom operator gets no autocast casts of its own
        dtype = torch.get_autocast_dtype(x.device.type)
        x, weight = x.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    return _onednn_linear_op(x, weight, bias)


@torch.library.custom_op("tinydit::onednn_linear", mutates_args=())
def _onednn_linear_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return _conv_linear(x.contiguous(), weight, bias)


@_onednn_linear_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


@torch.library.custom_op("tinydit::onednn_linear_backward", mutates_args=())
def _onednn_linear_backward_op(
    grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, needed: list[bool]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients for x, weight and bias in one oneDNN call; an empty tensor where ``needed`` is False."""
    d_out, d_in = weight.shape
    gx, gw, gb = torch.ops.aten.convolution_backward(
        _pixels(grad.contiguous()),
        _pixels(x.contiguous()),
        weight[:, :, None, None],
        [d_out],
        [1, 1],
        [0, 0],
        [1, 1],
        False,
        [0, 0],
        1,
        needed,
    )
    gx = _tokens(gx, x.shape[:-1]) if needed[0] else x.new_empty(0)
    gw = gw.reshape(d_out, d_in) if needed[1] else weight.new_empty(0)
    return gx, gw, gb if needed[2] else weight.new_empty(0)


@_onednn_linear_backward_op.register_fake
def _(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, needed: list[bool]):
    def like(t: torch.Tensor, shape: tuple, n: bool) -> torch.Tensor:
        return t.new_empty(shape if n else (0,))

    return like(x, x.shape, needed[0]), like(weight, weight.shape, needed[1]), like(weight, weight.shape[:1], needed[2])


def _setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _backward(ctx, grad: torch.Tensor):
    x, weight = ctx.saved_tensors
    needed = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
    grads = _onednn_linear_backward_op(grad, x, weight, needed)
    return tuple(g if n else None for g, n in zip(grads, needed, strict=True))


_onednn_linear_op.register_autograd(_backward, setup_context=_setup_context)


def _probe(rounds: int = 5) -> bool:
    """The machine record's answer, else ``_time_kernels``' (then recorded), never traced, even when a model
    is compiled before anything probed (disabled here, at the first probe, and not at import:
    ``torch.compiler.disable`` imports TorchDynamo, seconds of start-up that a process which never probes
    should not pay)."""
    return torch.compiler.disable(machine.answer)("onednn_is_faster", lambda: _time_kernels(rounds))


def _time_kernels(rounds: int) -> bool:
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
    """Whether auto sends fp32 CPU linear maps to oneDNN: the probe's answer, measured once per machine and
    read from the machine record by every later process (``tinydit.machine``).

    ``tinydit.runtime.maybe_compile`` asks before compiling (``LINEAR.warm_up``), so that compiled code
    only reads the answer.
    """
    global _onednn_faster
    if _onednn_faster is None:
        _onednn_faster = _probe()
    return _onednn_faster


LINEAR = KernelSwitch("linear", ("blas", "onednn"), warm_up=onednn_is_faster)
BACKENDS = LINEAR.choices
linear_backend = LINEAR.use


def resolve_backend(x: torch.Tensor) -> str:
    """The kernel a TokenLinear uses for input x: ``blas`` or ``onednn`` (see the module docstring)."""
    if LINEAR.forced == "blas" or x.device.type != "cpu":
        return "blas"
    if LINEAR.forced == "onednn":
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
    parameters and state dict, computed through ``tinydit.models.linear``'s faster kernel for the input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., in_features) -> (..., out_features)"""
        return token_linear(x, self.weight, self.bias)
