"""The two attention kernels of ``tinydit.models.attention``, timed against each other on this machine.

    python benchmarks/bench_attention.py              # the table in benchmarks/README.md
    python benchmarks/bench_attention.py --device cuda
    python benchmarks/bench_attention.py --dtype fp16 --shape 128,4,64,32 --reps 1 --timings 1   # emulated: slow

For each shape (N, h, T, Dh) and dtype: milliseconds for a forward and backward (training) and for a
forward alone (sampling) through PyTorch's ``F.scaled_dot_product_attention`` ("sdpa") and through two
batched matmuls and a softmax ("matmul"), and the kernel ``auto`` picks. q, k and v are slices of one
fused QKV tensor, as in the model. Each figure is the median of 7 timings, the kernels timed in turns.
The shapes are those of the presets: dit-1.9m and dit-9.8m on 32x32 (T = 64) and 28x28 (T = 49) images,
dit-32m (T = 256), and a 128-token sequence between them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from tinydit.models.attention import attention, attention_backend, resolve_backend
from tinydit.runtime import resolve_device

SHAPES = [(128, 4, 64, 32), (128, 4, 49, 32), (128, 4, 64, 64), (64, 4, 128, 32), (32, 6, 256, 64)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def shape_arg(text: str) -> tuple[int, ...]:
    """'N,h,T,Dh' -> (N, h, T, Dh), or one clear argparse error."""
    try:
        shape = tuple(int(v) for v in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"expected four positive integers N,h,T,Dh, got {text!r}")
    return shape


def timed(fn: Callable, fn_args: tuple, device: torch.device, reps: int) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn(*fn_args)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps


def train(fused: torch.Tensor, grad: torch.Tensor, backend: str) -> None:
    """Forward and backward through q, k, v sliced from one fused QKV tensor (N, T, 3, h, Dh)."""
    with attention_backend(backend):
        attention(*fused.permute(2, 0, 3, 1, 4).unbind(0)).backward(grad)


@torch.no_grad()
def sample(fused: torch.Tensor, backend: str) -> None:
    with attention_backend(backend):
        attention(*fused.permute(2, 0, 3, 1, 4).unbind(0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--reps", type=int, default=3, help="calls per timing")
    parser.add_argument("--timings", type=int, default=7, help="timings per figure (the median is printed)")
    parser.add_argument(
        "--dtype",
        action="append",
        choices=list(DTYPES),
        help="dtype(s) to time (default: fp32 and bf16; fp16 is emulated on CPUs: slow)",
    )
    parser.add_argument(
        "--shape", action="append", type=shape_arg, help="N,h,T,Dh to time (default: the presets' shapes)"
    )
    args = parser.parse_args()
    dtypes = args.dtype or ["fp32", "bf16"]
    shapes = args.shape or SHAPES
    device = resolve_device(args.device)
    print(f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print()
    print("| (N, h, T, Dh) | dtype | train ms: sdpa | train ms: matmul | sample ms: sdpa | sample ms: matmul | auto |")
    print("|---|---|---|---|---|---|---|")
    for n, h, t, dh in shapes:
        for name in dtypes:
            dtype = DTYPES[name]
            fused = torch.randn(n, t, 3, h, dh, device=device, dtype=dtype, requires_grad=True)
            grad = torch.randn(n, h, t, dh, device=device, dtype=dtype)

            times: dict[tuple[str, str], list[float]] = {}
            for backend in ("sdpa", "matmul"):  # warm-up
                train(fused, grad, backend), sample(fused, backend)
            for _ in range(args.timings):
                for backend in ("sdpa", "matmul"):
                    jobs = (("train", train, (fused, grad, backend)), ("sample", sample, (fused, backend)))
                    for job, fn, fn_args in jobs:
                        times.setdefault((job, backend), []).append(timed(fn, fn_args, device, args.reps))
            ms = {key: 1000 * statistics.median(v) for key, v in times.items()}
            print(
                f"| ({n}, {h}, {t}, {dh}) | {name} | {ms['train', 'sdpa']:.1f} | {ms['train', 'matmul']:.1f} | "
                f"{ms['sample', 'sdpa']:.1f} | {ms['sample', 'matmul']:.1f} | {resolve_backend(grad)} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
