"""Which way do the images of each class face? The share that face as the training set's mean image of their
class does, for real images and for a checkpoint's samples.

    python scripts/mirror_share.py --n 5000                                   # the test split only
    python scripts/mirror_share.py --checkpoint runs/fm/checkpoint.pt --n 5000

An image faces the mean's way when it lies nearer (in pixels) to the class's mean training image than its
own mirror image does. Real Fashion-MNIST shoes face one way, so the share is near 1 for sandals, sneakers
and ankle boots; a model trained on randomly mirrored images draws half of them the other way, near 0.5.
For classes that look much the same in a mirror (a T-shirt, a bag) the share says less: their mean is
nearly its own mirror image. Prints a Markdown table with the machine, torch version and date.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys

import torch

from tinydit import api
from tinydit.data import load_dataset
from tinydit.images import from_uint8


def facing_share(x: torch.Tensor, labels: torch.Tensor, means: torch.Tensor) -> list[float | None]:
    """Per class, the share of images x (N, C, H, W) in [-1, 1] nearer to their class's mean (K, C, H, W)
    than their mirror images are (None for a class with no image)."""
    mean = means[labels]  # (N, C, H, W)
    as_is = (x - mean).flatten(1).square().sum(1)  # (N,)
    mirrored = (x.flip(-1) - mean).flatten(1).square().sum(1)
    faces = as_is < mirrored
    return [faces[labels == k].float().mean().item() if (labels == k).any() else None for k in range(len(means))]


def class_means(data: str) -> tuple[torch.Tensor, list[str]]:
    """The mean training image of each class (K, C, H, W) in [-1, 1], unflipped, and the class names."""
    train = load_dataset(data, train=True, flip=False)
    x = from_uint8(train.images)
    means = torch.stack([x[train.labels == k].mean(0) for k in range(len(train.classes))])
    return means, train.classes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="fashion-mnist")
    parser.add_argument("--checkpoint", action="append", default=[], help="a checkpoint to sample (repeatable)")
    parser.add_argument("--n", type=int, default=5000, help="test images, and samples per checkpoint")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    means, classes = class_means(args.data)
    test = load_dataset(args.data, train=False, limit=args.n)
    rows = [("test images", facing_share(from_uint8(test.images), test.labels, means))]
    for checkpoint in args.checkpoint:
        drawn = api.sample(checkpoint, n=args.n, seed=args.seed, device="cpu")
        labels = torch.as_tensor(drawn.labels)
        rows.append((f"`{checkpoint}`, {args.n} samples", facing_share(drawn.x, labels, means)))
    print(f"{args.data}; {platform.machine()}, torch {torch.__version__}, {datetime.date.today()}")
    print(f"command: python scripts/mirror_share.py {' '.join(sys.argv[1:])}\n")
    print("| images | " + " | ".join(classes) + " |")
    print("|---|" + "---|" * len(classes))
    for name, shares in rows:
        print(f"| {name} | " + " | ".join("" if s is None else f"{s:.3f}" for s in shares) + " |")


if __name__ == "__main__":
    main()
