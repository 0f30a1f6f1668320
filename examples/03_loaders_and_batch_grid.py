"""Series post 4: Dataset, DataLoader, and a grid of one batch.

Uses the built-in shapes (no download), writes a small image folder and reads it back with
ImageFolderDataset, and shows Fashion-MNIST too when it is installed.

    python examples/03_loaders_and_batch_grid.py --out examples_out
"""

import argparse
from pathlib import Path

import torch

from tinydit.data import ImageFolderDataset, get_fashion_mnist, make_loader
from tinydit.data.shapes import ShapesDataset
from tinydit.errors import TinyDiTError
from tinydit.images import save_grid, save_image


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="examples_out")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    shapes = ShapesDataset(n=512)
    x, y = shapes[0]
    print("one sample:", tuple(x.shape), x.dtype, "| label", y, shapes.classes[y], "|", shapes.captions[0])
    loader = make_loader(shapes, batch_size=64, shuffle=True, num_workers=0)
    images, labels = next(iter(loader))
    print(
        "batch:",
        tuple(images.shape),
        images.dtype,
        f"range [{images.min():.2f}, {images.max():.2f}]",
        "| labels",
        tuple(labels.shape),
        labels.dtype,
        "| batches per epoch:",
        len(loader),
    )
    save_grid(images, out / "shapes_batch.png", nrow=8)

    # Your own pictures: one sub-folder per class.
    folder = out / "my_images"
    for i in range(40):
        img, label = shapes[i]
        sub = folder / shapes.classes[label]
        sub.mkdir(parents=True, exist_ok=True)
        save_image(img, sub / f"{i:04d}.png")
    mine = ImageFolderDataset(folder, img_size=32)
    xb, yb = next(iter(make_loader(mine, batch_size=8, shuffle=False, num_workers=0)))
    print(len(mine), "images in", folder, "| classes:", mine.class_to_idx, "| batch", tuple(xb.shape))

    try:
        fmnist = get_fashion_mnist("data", train=False, download=False)
        idx = torch.arange(64)
        save_grid(fmnist.batch(idx)[0], out / "fashion_mnist_batch.png", nrow=8)
        print("Fashion-MNIST test split:", tuple(fmnist.images.shape), "->", out / "fashion_mnist_batch.png")
    except TinyDiTError as err:
        print("Fashion-MNIST skipped:", str(err).split(". Fix")[0])
    print("wrote", out / "shapes_batch.png")


if __name__ == "__main__":
    main()
