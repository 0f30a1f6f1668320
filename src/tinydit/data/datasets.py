"""Datasets and DataLoaders (series post 4): the loaders behind ``tinydit.data.registry``.

Every dataset yields ``(image, label)`` and every loader yields ``(images, labels)``:

    images: float32 (N, C, H, W), values in [-1, 1]
    labels: int64 (N,)

Built-in data (``tinydit.data.registry.load_dataset``):

* ``shapes``: rendered 32x32 RGB shapes (``tinydit.data.shapes``), no download, the default.
* ``fashion-mnist``: 28x28 grayscale. The model sees it as it is, one channel at 28x28: with
  4x4 patches that is 49 tokens instead of 64 for a padded 32x32 copy (about 25% less compute per
  image on a CPU), and samples come out at the data's own size. Looked up in the given root, then in
  Debian's ``/usr/share/datasets/fashion-mnist/`` (package ``dataset-fashion-mnist``), then downloaded
  by torchvision.
* ``cifar10``: 32x32 RGB, downloaded by torchvision.
* any folder of images (``ImageFolderDataset``), resized and centre-cropped to 32x32 RGB, or to the
  side asked (``img_size``).

The sets are named, and opened by name, in ``tinydit.data.registry``, one record each. For training, each
set is decoded once into a ``CachedDataset``: one uint8 tensor in memory, flipped on the fly where the data
set mirrors (``DatasetRecord.mirrors``: every set but Fashion-MNIST).
On a CPU this removes decoding, PIL and worker processes from the training loop.

Every set from ``load_dataset`` also has one caption per image (``CachedDataset.captions``), for text
conditioning: ``shapes`` its own ("a red circle on a blue background"), CIFAR-10 and Fashion-MNIST
the class name in a template ("a photo of a sneaker", ``tinydit.data.text.CLASS_TEMPLATE``), an image
folder the text of a sidecar file beside each image (``cat1.jpg`` -> ``cat1.txt``), else the name of
the image's folder. None of them names left or right, so random flips keep every caption true.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import struct
import warnings
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Subset

from tinydit.data.cache import CachedDataset
from tinydit.errors import TinyDiTError
from tinydit.images import to_rgb

__all__ = [
    "CIFAR10_CLASSES",
    "FASHION_MNIST_CLASSES",
    "IMG_EXTS",
    "DEBIAN_FASHION_MNIST",
    "make_transform",
    "get_cifar10",
    "get_fashion_mnist",
    "make_loader",
    "ImageFolderDataset",
    "CachedDataset",
    "decode_folder",
    "CachedCIFAR10",
    "folder_signature",
    "folder_caption",
]

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
FASHION_MNIST_CLASSES = [
    "t-shirt",
    "trouser",
    "pullover",
    "dress",
    "coat",
    "sandal",
    "shirt",
    "sneaker",
    "bag",
    "ankle-boot",
]
IMG_EXTS = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff"}
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


def make_transform(img_size: int = 32, train: bool = True):  # -> torchvision.transforms.v2.Compose
    """PIL image -> float tensor (3, img_size, img_size) in [-1, 1]; a random flip when training."""
    from torchvision.transforms import v2  # imported here: torchvision costs seconds at start-up

    steps = [
        v2.ToImage(),  # PIL -> uint8 tensor (C, H, W)
        v2.Resize(img_size, antialias=True),  # short side -> img_size
        v2.CenterCrop(img_size),  # square crop
    ]
    if train:
        steps.append(v2.RandomHorizontalFlip())  # a mirrored object is still a normal object
    steps += [
        v2.ToDtype(torch.float32, scale=True),  # uint8 [0, 255] -> float [0, 1]
        v2.Normalize(mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5]),  # [0, 1] -> [-1, 1]
    ]
    return v2.Compose(steps)


def _subset_indices(targets: list[int], classes: list[int] | None, limit: int | None) -> list[int]:
    indices = list(range(len(targets)))
    if classes is not None:
        keep = set(classes)
        indices = [i for i in indices if int(targets[i]) in keep]
    if limit is not None:
        indices = indices[:limit]
    return indices


def _torchvision_cifar10(root: str | Path, train: bool, download: bool, transform=None):
    from torchvision import datasets

    try:
        return datasets.CIFAR10(root=str(root), train=train, download=download, transform=transform)
    except Exception as err:  # RuntimeError when absent, URLError/OSError when offline
        how = "the download failed" if download else "downloading is off"
        raise TinyDiTError(
            f"CIFAR-10 is not in {root}/cifar-10-batches-py and {how} ({type(err).__name__}: {err}). "
            f"Fix: run once with internet access, or copy cifar-10-python.tar.gz into {root}/"
        ) from err


def get_cifar10(
    root: str | Path = "data",
    train: bool = True,
    classes: list[int] | None = None,
    limit: int | None = None,
    download: bool = True,
) -> Dataset:
    """CIFAR-10 in [-1, 1]. ``classes`` keeps only those labels, ``limit`` caps the size (for CPU runs)."""
    ds = _torchvision_cifar10(root, train, download, transform=make_transform(32, train))
    indices = _subset_indices(ds.targets, classes, limit)
    return ds if len(indices) == len(ds) else Subset(ds, indices)


def make_loader(
    dataset: Dataset,
    batch_size: int = 128,
    shuffle: bool = True,
    num_workers: int = 2,
    drop_last: bool | None = None,
) -> DataLoader:
    """Training loaders shuffle and drop the last ragged batch; evaluation loaders do neither."""
    if drop_last is None:
        drop_last = shuffle
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        num_workers=num_workers,
        drop_last=drop_last,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=num_workers > 0,
    )


class ImageFolderDataset(Dataset):
    """Every image under ``root`` (recursively). Label = index of its parent folder's name.

        root/
          cats/001.jpg      -> label 0
          dogs/abc.png      -> label 1
          loose.png         -> label of folder "." (one flat folder of pictures works too)

    Files that cannot be decoded are skipped with one warning each, naming the file.
    """

    def __init__(self, root: str | Path, img_size: int = 32, train: bool = True):
        self.root = Path(root)
        if not self.root.is_dir():
            what = "is not a folder" if self.root.exists() else "does not exist"
            raise TinyDiTError(f"image folder {self.root} {what}; pass a folder of images")
        candidates = sorted(p for p in self.root.rglob("*") if p.is_file() and p.suffix.lower() in IMG_EXTS)
        self.paths = [p for p in candidates if _readable(p)]
        if not self.paths:
            found = f"{len(candidates)} unreadable" if candidates else "no"
            raise TinyDiTError(
                f"{found} images found under {self.root} (extensions {', '.join(sorted(IMG_EXTS))}); "
                "put readable images in it or in one sub-folder per class"
            )
        folders = sorted({self._folder(p) for p in self.paths})
        self.class_to_idx = {name: i for i, name in enumerate(folders)}
        self.classes = folders
        self.targets = [self.class_to_idx[self._folder(p)] for p in self.paths]
        self.transform = make_transform(img_size, train)

    def _folder(self, path: Path) -> str:
        return str(path.parent.relative_to(self.root))

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.paths[idx]) as img:
            x = self.transform(to_rgb(img))  # (3, img_size, img_size) in [-1, 1]
        return x, self.targets[idx]


def _readable(path: Path) -> bool:
    try:
        with Image.open(path) as img:
            img.load()  # a full decode: verify() alone misses truncated files
        return True
    except Exception as err:  # PIL raises many types for bad files
        warnings.warn(f"skipping unreadable image {path}: {err}", stacklevel=3)
        return False


class CachedCIFAR10(CachedDataset):
    """CIFAR-10 held in memory as one uint8 tensor (150 MB for the training split), flipped on the fly."""

    def __init__(
        self,
        root: str | Path = "data",
        train: bool = True,
        classes: list[int] | None = None,
        limit: int | None = None,
        download: bool = True,
    ):
        raw = _torchvision_cifar10(root, train, download)
        idx = _subset_indices(raw.targets, classes, limit)
        images = torch.from_numpy(raw.data[idx]).permute(0, 3, 1, 2)  # (N, 32, 32, 3) -> (N, 3, 32, 32)
        labels = torch.tensor([raw.targets[i] for i in idx], dtype=torch.int64)
        super().__init__(images, labels, CIFAR10_CLASSES, flip=train)


# ---------------------------------------------------------------------------------------- Fashion-MNIST


def _read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (optionally gzipped) of unsigned bytes -> uint8 array of its shape."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise TinyDiTError(f"{path} is not an IDX file of unsigned bytes; replace it with the original file")
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise TinyDiTError(f"{path} is truncated ({arr.size} of {int(np.prod(dims))} values); download it again")
    return arr.reshape(dims)  # e.g. (N, 28, 28) images or (N,) labels


def _find_idx(folder: Path, stem: str) -> Path | None:
    for name in (f"{stem}.gz", stem):
        if (folder / name).is_file():
            return folder / name
    return None


def get_fashion_mnist(root: str | Path = "data", train: bool = True, download: bool = True) -> CachedDataset:
    """Fashion-MNIST as a ``CachedDataset`` of uint8 (N, 1, 28, 28), never flipped (its shoes face one way).

    Looked up in ``root`` (also ``root/fashion-mnist`` and torchvision's ``root/FashionMNIST/raw``), then
    in Debian's ``/usr/share/datasets/fashion-mnist``, then downloaded with torchvision into ``root``.
    """
    prefix = "train" if train else "t10k"
    root = Path(root)
    for folder in (root, root / "fashion-mnist", root / "FashionMNIST" / "raw", DEBIAN_FASHION_MNIST):
        img_path = _find_idx(folder, f"{prefix}-images-idx3-ubyte")
        lbl_path = _find_idx(folder, f"{prefix}-labels-idx1-ubyte")
        if img_path and lbl_path:
            images = torch.from_numpy(_read_idx(img_path).copy()).unsqueeze(1)  # (N, 28, 28) -> (N, 1, 28, 28)
            labels = torch.from_numpy(_read_idx(lbl_path).astype(np.int64))
            return CachedDataset(images, labels, FASHION_MNIST_CLASSES, flip=False)
    if download:
        from torchvision import datasets

        try:
            raw = datasets.FashionMNIST(root=str(root), train=train, download=True)
        except Exception as err:
            raise TinyDiTError(
                f"Fashion-MNIST is not in {root} or {DEBIAN_FASHION_MNIST}, and the download failed "
                f"({type(err).__name__}). Fix: `apt-get install dataset-fashion-mnist`, or copy the four "
                f"*-ubyte.gz files into {root}/, or run once with internet access"
            ) from err
        images, labels = raw.data.unsqueeze(1).clone(), raw.targets.clone()  # (N, 1, 28, 28), (N,)
        return CachedDataset(images, labels, FASHION_MNIST_CLASSES, flip=False)
    raise TinyDiTError(
        f"Fashion-MNIST is not in {root} or {DEBIAN_FASHION_MNIST} and download is off. "
        "Fix: `apt-get install dataset-fashion-mnist`, or copy the *-ubyte.gz files into the data root"
    )


# ---------------------------------------------------------------------------------------- image folders


def _held_out(relative: Path) -> bool:
    """About 1 in 20 files of an image folder is held out, chosen by a hash of its path in the folder
    (never of the absolute path: the split must not depend on how the folder is named or reached)."""
    return hashlib.sha1(relative.as_posix().encode()).digest()[0] < 13  # 13 / 256 ~ 5%


def folder_signature(root: Path) -> tuple:
    """Names, sizes and modification times of the files under root: cheap to compute, changes with them."""
    return tuple(
        sorted(
            (str(p.relative_to(root)), st.st_size, st.st_mtime_ns)
            for p in root.rglob("*")
            if p.is_file()
            for st in [p.stat()]
        )
    )


@functools.lru_cache(maxsize=4)
def decode_folder(root: Path, signature: tuple, img_size: int = 32) -> tuple[CachedDataset, torch.Tensor]:
    """Decode an image folder once at ``img_size`` pixels a side (train and validation splits share it): all
    images, held-out mask."""
    folder = ImageFolderDataset(root, img_size=img_size, train=False)  # warns once per unreadable file
    held = torch.tensor([_held_out(p.relative_to(root)) for p in folder.paths])  # (N,) bool
    ds = CachedDataset.from_dataset(folder, folder.classes)
    ds.captions = [folder_caption(p, root) for p in folder.paths]
    return ds, held


def folder_caption(path: Path, root: Path) -> str:
    """An image's caption in a folder: its sidecar ``.txt`` (whitespace collapsed), else its folder's name."""
    sidecar = path.with_suffix(".txt")
    if sidecar.is_file():
        text = " ".join(sidecar.read_text(errors="replace").split())
        if text:
            return text
    return (path.parent if path.parent != root else root).name
