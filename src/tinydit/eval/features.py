"""Offline feature networks: small classifiers whose penultimate features replace Inception's.

Inception FID needs ImageNet weights from the internet, and on 28x28 grayscale clothes or rendered
shapes its features say little anyway. For each built-in data set TinyDiT ships a small CNN, trained
by ``scripts/train_feature_net.py`` with a fixed seed, its weights committed beside this file with
their SHA-256 and test accuracy in ``assets/feature_nets.json``. Metrics computed in its feature space
carry its name (``fid_fmnist_cnn``, ...) so nobody mistakes them for Inception FID; its accuracy on
conditional samples is the class consistency.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from tinydit.data.cache import random_flip
from tinydit.data.registry import DATASETS
from tinydit.errors import TinyDiTError
from tinydit.images import from_uint8

__all__ = ["FeatureNet", "ASSETS", "FEATURE_NETS", "load_feature_net", "file_sha256", "train_feature_net", "extract"]

ASSETS = Path(__file__).parent.parent / "assets"
# data set -> its feature net's name, as the data sets' records name them
FEATURE_NETS = {r.name: r.feature_net for r in DATASETS.values() if r.feature_net}


class FeatureNet(nn.Module):
    """A small VGG-style CNN: (N, C, S, S) in [-1, 1] -> 128-d features -> class logits.

    Four 3x3 convolutions with batch norm, two 2x2 poolings and a global average: about 0.13M weights
    and 15M multiply-adds per 28x28 image, so it trains in minutes on a CPU.
    """

    def __init__(self, in_channels: int, n_classes: int, width: int = 32):
        super().__init__()
        w = width

        def conv(cin: int, cout: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

        self.body = nn.Sequential(
            *conv(in_channels, w),
            nn.MaxPool2d(2),  # (N, w, S/2, S/2)
            *conv(w, 2 * w),
            *conv(2 * w, 2 * w),
            nn.MaxPool2d(2),  # (N, 2w, S/4, S/4)
            *conv(2 * w, 4 * w),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),  # (N, 4w)
        )
        self.head = nn.Linear(4 * w, n_classes)
        self.feature_dim = 4 * w

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, S, S) -> (N, 128)"""
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _manifest() -> dict:
    path = ASSETS / "feature_nets.json"
    return json.loads(path.read_text()) if path.exists() else {}


def load_feature_net(name: str, path: str | Path | None = None) -> tuple[FeatureNet, dict]:
    """A shipped feature network (checked against its recorded hash) or one at ``path``.

    Returns the network in eval mode and its record: name, file, sha256, data, test_accuracy, ...
    """
    record = dict(_manifest().get(name, {}))
    file = Path(path) if path is not None else ASSETS / record.get("file", f"{name}.pt")
    if not file.is_file():
        raise TinyDiTError(
            f"feature network {name} is missing ({file}); reinstall tinydit or retrain it with "
            f"scripts/train_feature_net.py"
        )
    digest = file_sha256(file)
    if path is None and record.get("sha256") not in (None, digest):
        raise TinyDiTError(
            f"{file} does not match its recorded SHA-256 in assets/feature_nets.json: the file is "
            "damaged or was replaced; reinstall tinydit"
        )
    state = torch.load(file, map_location="cpu", weights_only=True)
    net = FeatureNet(state["in_channels"], state["n_classes"], state.get("width", 32))
    net.load_state_dict(state["model"])
    record.update(
        name=name,
        file=str(file),
        sha256=digest,
        in_channels=state["in_channels"],
        img_size=state["img_size"],
        n_classes=state["n_classes"],
    )
    return net.eval(), record


@torch.no_grad()
def extract(net: FeatureNet, images_uint8: torch.Tensor, batch_size: int = 500) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images (N, C, S, S) -> features (N, 128) and predicted classes (N,)."""
    feats, preds = [], []
    for i in range(0, images_uint8.shape[0], batch_size):
        x = from_uint8(images_uint8[i : i + batch_size])  # the same conversion for every metric
        f = net.features(x)
        feats.append(f)
        preds.append(net.head(f).argmax(1))
    return torch.cat(feats), torch.cat(preds)


def train_feature_net(
    train_images: torch.Tensor,
    train_labels: torch.Tensor,
    n_classes: int,
    epochs: int = 4,
    batch_size: int = 128,
    lr: float = 2e-3,
    seed: int = 0,
    log=print,
) -> FeatureNet:
    """Train a FeatureNet on uint8 images (N, C, S, S) with random flips; deterministic for a seed on a CPU."""
    torch.manual_seed(seed)
    net = FeatureNet(train_images.shape[1], n_classes)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=5e-4)
    steps = epochs * (len(train_images) // batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps)
    gen = torch.Generator().manual_seed(seed)
    step = 0
    net.train()
    for epoch in range(epochs):
        perm = torch.randperm(len(train_images), generator=gen)
        for i in range(len(train_images) // batch_size):
            idx = perm[i * batch_size : (i + 1) * batch_size]
            x = random_flip(from_uint8(train_images[idx]), gen)
            loss = F.cross_entropy(net(x), train_labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if step % 100 == 0:
                log(f"epoch {epoch + 1}/{epochs} step {step}/{steps} loss {loss.item():.4f}")
    return net.eval()
