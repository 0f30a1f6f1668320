"""Train the offline feature network of a built-in data set and record it in assets/feature_nets.json.

    python scripts/train_feature_net.py --data fashion-mnist
    python scripts/train_feature_net.py --data shapes
    python scripts/train_feature_net.py --data shapes --epochs 2 --seed 101 --geometry --name shapes_repa
    python scripts/train_feature_net.py --data shapes --epochs 2 --seed 202 --width 64 --data-seed 7 --name shapes_judge

The first two are the evaluation's feature networks (``tinydit.eval.features.FEATURE_NETS``); the third is
the encoder whose features training aligns the model's tokens to (``--repa``, ``tinydit.train.repa``): the
same architecture with another seed, so that training never optimises the network that scores it, and with
``--geometry`` also taught, at every cell of its 8 x 8 feature map, where the image's shape has its centre
and how large it is (the render's own attributes), so that its features say where a shape's parts belong.

The fourth is a judge the aligned runs do not share (docs/notes/independent_judges.md): twice as wide
(256-d features), another seed, and trained on other images of `shapes` (``--data-seed``: the renderer's
seed; the test split keeps its own), so that it shares with the alignment encoder neither weights nor data.

Deterministic for a seed on a CPU. Writes src/tinydit/assets/<name>.pt (a plain state dict) and its
SHA-256, test accuracy, training command, torch version and date into the manifest.
"""

import argparse
import json
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from tinydit.data import load_dataset
from tinydit.data.shapes import SHAPES, ShapesDataset, make_shapes
from tinydit.eval.evaluate import eval_spec, to_eval_images
from tinydit.eval.features import ASSETS, FEATURE_NETS, FeatureNet, extract, file_sha256, train_feature_net
from tinydit.images import from_uint8


def train_geometry_net(epochs: int, seed: int, batch_size: int = 128, lr: float = 2e-3) -> FeatureNet:
    """A shapes FeatureNet trained on the class and, densely, on the geometry: a 1x1 convolution on its last
    feature map (N, F, 8, 8) regresses at every cell the offset from the cell's centre to the shape's centre
    (in units of 8 px) and the shape's size (size / 16 - 1); the loss is cross-entropy + 10 x that MSE. The
    regression head is dropped afterwards: the network is saved as any FeatureNet."""
    torch.manual_seed(seed)
    images, labels, attrs = make_shapes(20000, 0)  # the training split of `shapes`
    x, y = from_uint8(torch.from_numpy(images)), torch.from_numpy(labels)
    cx, cy = torch.tensor([a["cx"] for a in attrs]), torch.tensor([a["cy"] for a in attrs])
    size = torch.tensor([a["size_px"] for a in attrs])
    centres = (torch.arange(8) + 0.5) * 4  # the cells' centres in px
    tx = (cx[:, None, None] - centres[None, None, :]) / 8  # (N, 1, 8): along the columns
    ty = (cy[:, None, None] - centres[None, :, None]) / 8  # (N, 8, 1): along the rows
    target = torch.stack([tx.expand(-1, 8, 8), ty.expand(-1, 8, 8), (size / 16 - 1)[:, None, None].expand(-1, 8, 8)], 1)
    net = FeatureNet(3, len(SHAPES))
    pool = next(i for i, m in enumerate(net.body) if isinstance(m, nn.AdaptiveAvgPool2d))
    trunk, dense = net.body[:pool], nn.Conv2d(net.feature_dim, 3, 1)
    opt = torch.optim.AdamW([*net.parameters(), *dense.parameters()], lr=lr, weight_decay=5e-4)
    steps = epochs * (len(x) // batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps)
    gen = torch.Generator().manual_seed(seed)
    net.train()
    for epoch in range(epochs):
        perm = torch.randperm(len(x), generator=gen)
        for i in range(len(x) // batch_size):
            idx = perm[i * batch_size : (i + 1) * batch_size]
            f = trunk(x[idx])  # (B, F, 8, 8)
            ce = F.cross_entropy(net.head(f.mean((2, 3))), y[idx])
            mse = F.mse_loss(dense(f), target[idx])
            loss = ce + 10 * mse
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        print(f"epoch {epoch + 1}/{epochs}: cross-entropy {ce.item():.4f}, geometry MSE {mse.item():.4f}", flush=True)
    return net.eval()


def code_version() -> str:
    """The commit of the code that trained the net, ``-dirty`` with uncommitted changes: its provenance, which
    the manifest records in place of a date."""
    try:
        cmd = ["git", "describe", "--always", "--dirty", "--abbrev=7"]
        return subprocess.run(cmd, cwd=ASSETS, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, choices=sorted(FEATURE_NETS))
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default=None, help="the file's name (default: the data set's evaluation network)")
    parser.add_argument("--geometry", action="store_true", help="shapes: also regress each cell's offset to the centre")
    parser.add_argument("--width", type=int, default=32, help="the first block's channels; the features are 4x")
    parser.add_argument("--data-seed", type=int, default=None, help="shapes: render the training images from this seed")
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    name = args.name or FEATURE_NETS[args.data]

    if args.data_seed is not None and args.data != "shapes":
        parser.error("--data-seed renders other training images: --data shapes")
    if args.geometry and (args.width != 32 or args.data_seed is not None):
        parser.error("--geometry trains the alignment encoder: width 32 on the training split")
    train = load_dataset(args.data, train=True)
    if args.data_seed is not None:  # other images of the same distribution, none of the training split's
        train = ShapesDataset(len(train), seed=args.data_seed)
    test = load_dataset(args.data, train=False, shapes_size=eval_spec(args.data).reference_size)
    x_train, x_test = to_eval_images(train.images, args.data), to_eval_images(test.images, args.data)
    started = time.perf_counter()
    if args.geometry:
        if args.data != "shapes":
            parser.error("--geometry needs the render's attributes: --data shapes")
        net = train_geometry_net(args.epochs, args.seed)
    else:
        net = train_feature_net(
            x_train, train.labels, len(train.classes), epochs=args.epochs, seed=args.seed, width=args.width
        )
    seconds = time.perf_counter() - started
    _, preds = extract(net, x_test)
    accuracy = (preds == test.labels).double().mean().item()
    print(f"{name}: test accuracy {accuracy:.4f} after {seconds:.0f} s")

    ASSETS.mkdir(exist_ok=True)
    path = ASSETS / f"{name}.pt"
    torch.save(
        {
            "model": net.state_dict(),
            "in_channels": x_train.shape[1],
            "img_size": x_train.shape[2],
            "n_classes": len(train.classes),
            "width": args.width,
            "classes": list(train.classes),
        },
        path,
    )
    manifest_path = ASSETS / "feature_nets.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    manifest[name] = {
        "file": path.name,
        "sha256": file_sha256(path),
        "data": args.data,
        "test_accuracy": round(accuracy, 4),
        "test_images": len(test),
        "train_seconds": round(seconds),
        "command": "python scripts/train_feature_net.py " + " ".join(sys.argv[1:]),
        "torch_version": torch.__version__,
        "commit": code_version(),
    }
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB) and {manifest_path}")


if __name__ == "__main__":
    main()
