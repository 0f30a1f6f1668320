"""What a larger image costs: the FLOPs of one training forward and backward pass per image, at each image
size, counted by ``torch.utils.flop_counter.FlopCounterMode`` (machine-independent, so it needs no quiet
machine). Attention runs on PyTorch's math kernel here, whose matmuls the counter sees.

    python benchmarks/flops_by_size.py --preset dit-1.9m --sizes 32,48,64
"""

from __future__ import annotations

import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from tinydit.models.registry import build_model, preset_config


def training_flops(preset: str, img_size: int, batch: int = 8) -> tuple[float, float, int]:
    """(all, attention) FLOPs of one forward and backward pass per image, and the tokens per image."""
    model = build_model("dit", preset_config("dit", preset, img_size=img_size, in_channels=3, n_classes=10))
    x = torch.randn(batch, 3, img_size, img_size)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        (model(x, torch.rand(batch), torch.zeros(batch, dtype=torch.long)) - x).pow(2).mean().backward()
    by_op = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    # the math kernel's two batched matmuls per head are the attention: Q K^T and its weights times V
    return counter.get_total_flops() / batch, by_op.get("aten.bmm", 0) / batch, model.config.n_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="dit-1.9m", help="a DiT preset (default: an image folder's)")
    parser.add_argument("--sizes", default="32,64", help="comma-separated image sides in pixels")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = {size: training_flops(args.preset, size) for size in sizes}
    base = rows[sizes[0]][0]
    print(f"{args.preset}, one training forward + backward pass per image, torch {torch.__version__}")
    print("| size | tokens | MFLOP | of them attention | vs the first |")
    print("|---|---|---|---|---|")
    for size, (total, attention, tokens) in rows.items():
        print(f"| {size} | {tokens} | {total / 1e6:.0f} | {attention / 1e6:.0f} | {total / base:.2f}x |")


if __name__ == "__main__":
    main()
