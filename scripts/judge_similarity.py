"""How alike the evaluation's feature network and the alignment encoder are: linear CKA (Kornblith et al.
2019, ``tinydit.eval.metrics.linear_cka``) of their features on held-out images, with controls that say
what a value means.

    python scripts/judge_similarity.py [--n 2000]

For each data set (shapes, and Fashion-MNIST where it is on disk), on the first ``--n`` test images:

* ``eval vs align, pooled``: the evaluation network's pooled 128-d features (what FID, KID and
  precision/recall compare) against the alignment encoder's pooled features;
* ``eval vs align, per cell``: the two networks' last feature maps (N, 128, 8, 8 for shapes), one row
  per image and cell: the per-position features training aligns the model's tokens to (``tinydit.train.repa``),
  against the evaluation network's at the same layer;
* control ``eval vs random init``: the evaluation network against an untrained one of the same
  architecture (seed 0), pooled: what the architecture and the images alone give;
* control ``eval: first vs last block``: the evaluation network's first block (pooled over space) against
  its pooled features: two layers of one network that should differ;
* where the data set has an independent network (``DatasetRecord.independent_net``: another architecture
  trained on other images), the same pooled and per-cell CKAs of it against the alignment encoder, and
  pooled against the evaluation network.

CPU-light: about 2,000 images through four small CNNs.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from tinydit.data import load_dataset
from tinydit.errors import TinyDiTError
from tinydit.eval.evaluate import eval_spec, to_eval_images
from tinydit.eval.features import FeatureNet, load_feature_net
from tinydit.eval.metrics import linear_cka
from tinydit.images import from_uint8
from tinydit.train.repa import REPA_ENCODERS

PAIRS = {"shapes": "shapes_cnn", "fashion-mnist": "fmnist_cnn"}  # data set -> the evaluation's network


@torch.no_grad()
def layers(net: FeatureNet, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The pooled features (N, F), the last feature map as rows per image and cell (N * h * w, F), and the
    first block pooled over space (N, w) of ``net`` on images x (N, C, S, S) in [-1, 1]."""
    pool = next(i for i, m in enumerate(net.body) if isinstance(m, nn.AdaptiveAvgPool2d))
    first = next(i for i, m in enumerate(net.body) if isinstance(m, nn.MaxPool2d))
    grid = net.body[:pool](x)  # (N, F, h, w)
    return {
        "pooled": grid.mean((2, 3)),  # (N, F): what net.features gives
        "cells": grid.flatten(2).transpose(1, 2).flatten(0, 1),  # (N * h * w, F)
        "first": net.body[:first](x).mean((2, 3)),  # (N, w)
    }


def measure(data: str, n: int) -> dict[str, float]:
    """The CKAs of ``data``'s evaluation network, its alignment encoder and the controls on n test images."""
    test = load_dataset(data, train=False, shapes_size=eval_spec(data).reference_size)
    x = from_uint8(to_eval_images(test.images[:n], data))  # (n, C, S, S), as the evaluation sees them
    judge, _ = load_feature_net(PAIRS[data])
    encoder, _ = load_feature_net(REPA_ENCODERS[data])
    torch.manual_seed(0)
    untrained = FeatureNet(judge.body[0].in_channels, judge.head.out_features).eval()
    j, e, r = layers(judge, x), layers(encoder, x), layers(untrained, x)
    # the per-cell CKA's kernel is over every image's every cell: a fixed subsample of rows keeps it small
    rows = torch.randperm(len(j["cells"]), generator=torch.Generator().manual_seed(0))[: 4 * n]
    results = {
        "eval vs align, pooled": linear_cka(j["pooled"], e["pooled"]),
        "eval vs align, per cell": linear_cka(j["cells"][rows], e["cells"][rows]),
        "control: eval vs random init, pooled": linear_cka(j["pooled"], r["pooled"]),
        "control: eval, first vs last block": linear_cka(j["first"], j["pooled"]),
    }
    other = eval_spec(data).independent_net
    if other is not None:
        i = layers(load_feature_net(other)[0], x)  # the same grid of cells as the others': rows match
        results |= {
            f"{other} vs align, pooled": linear_cka(i["pooled"], e["pooled"]),
            f"{other} vs align, per cell": linear_cka(i["cells"][rows], e["cells"][rows]),
            f"{other} vs eval, pooled": linear_cka(i["pooled"], j["pooled"]),
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000, help="test images per data set")
    args = parser.parse_args()
    for data in PAIRS:
        try:
            results = measure(data, args.n)
        except TinyDiTError as err:  # Fashion-MNIST not on disk: said, and the other data set still measured
            print(f"{data}: not measured ({err})")
            continue
        print(f"{data} ({PAIRS[data]} vs {REPA_ENCODERS[data]}, {args.n} test images): linear CKA")
        for name, value in results.items():
            print(f"  {name:40} {value:.3f}")


if __name__ == "__main__":
    main()
