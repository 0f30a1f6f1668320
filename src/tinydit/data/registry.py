"""The data sets by name: one record per built-in set, holding everything the rest of the package asks of a
data set (how it loads, its spellings, image shape, classes and captions, whether it mirrors, how its
samples are evaluated, and the defaults of a run on it), and the one entry point that opens a set by name.

A run's data is named once, here (``canonical_name``), and everything after (its checkpoint, evaluation,
the sampling records) keys on the canonical name. Adding a built-in set is one record and its loader.
An image folder gets a record built from the folder (``folder_record``: its size, channels and classes);
before its images are read, and for a Dataset object given from Python, ``record_of`` gives the defaults
every such set shares.
"""

from __future__ import annotations

import functools
import hashlib
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from tinydit.data.cache import CachedDataset
from tinydit.data.datasets import (
    CIFAR10_CLASSES,
    FASHION_MNIST_CLASSES,
    CachedCIFAR10,
    decode_folder,
    folder_signature,
    get_fashion_mnist,
)
from tinydit.data.shapes import GRID_PROMPTS, RENDER_VERSION, SHAPES, ShapesDataset
from tinydit.data.text import class_captions
from tinydit.errors import TinyDiTError

__all__ = [
    "DatasetRecord",
    "DATASETS",
    "BUILTIN_DATASETS",
    "DATASET_PREFIX",
    "FOLDER_SIZE",
    "SHAPES_HOLDOUT",
    "record_of",
    "folder_record",
    "canonical_name",
    "known_name",
    "dataset_name",
    "mirrors",
    "load_dataset",
    "open_dataset",
]

# (train, root, download, size, limit) -> the split decoded, captions filled. size: how many images a generated
# set makes (None: its own number); limit: at most this many are needed, so a generated set makes no more.
Loader = Callable[[bool, Path, bool, "int | None", "int | None"], CachedDataset]


@dataclass(frozen=True)
class DatasetRecord:
    """One data set. A training default of None is the general one (``tinydit.train.resolve``)."""

    name: str  # canonical: what a run, its checkpoint and the sampling records name it by
    load: Loader
    aliases: tuple[str, ...] = ()  # other spellings of `data` taken for it (case and "_" for "-" aside)
    channels: int = 3
    img_size: int = 32  # the side in pixels: the model's input size
    classes: tuple[str, ...] = ()
    # own: the set's own captions | class: the class name in a template (tinydit.data.text.CLASS_TEMPLATE) |
    # file: a sidecar .txt beside each image, else its folder's name
    captions: str = "class"
    # Whether a left-right mirror image of a training image is as likely as the image itself, so that random
    # flips add images of the same distribution (`TrainConfig.flip` None takes it).
    mirrors: bool = True
    # -- evaluation (tinydit.eval) --
    eval_key: str = ""  # names the reference images in cache keys; "": the name
    eval_sizes: tuple[tuple[int, int], ...] = ()  # (C, side) accepted as samples, the evaluation's first; (): its own
    reference_size: int | None = None  # reference images of a split (None: the whole split)
    feature_net: str | None = None  # the shipped offline feature network (tinydit.eval.features)
    # A second shipped network that shares neither the first's architecture nor its training images, nor the
    # alignment encoder's: scores read in it cannot be flattered by a run aligned to a sibling of the first.
    independent_net: str | None = None
    judged: bool = False  # samples are read back from their pixels (the shapes judge, prompt adherence)
    # -- a run's defaults (tinydit.train.resolve) --
    presets: tuple[tuple[str, str, str], ...] = ()  # (model, cond, preset): else the model's default preset
    batch_size: int | None = None
    lr: float | None = None
    repa_encoder: str | None = None  # the shipped encoder REPA aligns to (tinydit.train.repa); None: no alignment
    repa: float = 0.0  # the alignment's weight in runs that align by default
    t_shift: float | None = None  # class runs' shift of the training times towards noise; 1: none
    holdout: str = ""  # text runs: the caption phrases held out unless told otherwise
    grid_prompts: tuple[str, ...] = ()  # text runs: the sample grids' rows; (): the first 8 distinct captions

    @property
    def accepted(self) -> tuple[tuple[int, int], ...]:
        """The (C, side) pairs its samples are evaluated at, the evaluation's own first."""
        return self.eval_sizes or ((self.channels, self.img_size),)

    def preset(self, model: str, cond: str) -> str | None:
        """The preset a run of ``model`` with ``cond`` takes on this set when none is named (None: the model's)."""
        return next((p for m, c, p in self.presets if (m, c) == (model, cond)), None)


def _load_shapes(train: bool, root: Path, download: bool, size: int | None, limit: int | None) -> CachedDataset:
    n = size if size is not None else (20000 if train else 2000)
    raw = ShapesDataset(n=n if limit is None else min(n, limit), train=train)  # image i does not depend on n
    ds = CachedDataset(raw.images, raw.labels, raw.classes)
    ds.captions = list(raw.captions)
    return ds


def _load_fashion_mnist(train: bool, root: Path, download: bool, size: int | None, limit: int | None) -> CachedDataset:
    ds = get_fashion_mnist(root, train=train, download=download)
    ds.captions = class_captions(ds.labels.tolist(), ds.classes)
    return ds


def _load_cifar10(train: bool, root: Path, download: bool, size: int | None, limit: int | None) -> CachedDataset:
    ds = CachedCIFAR10(root, train=train, download=download)
    ds.captions = class_captions(ds.labels.tolist(), ds.classes)
    return ds


# Caption combinations a shapes text run never sees unless told otherwise: prompt adherence on them measures
# compositional generalisation (tinydit.eval.adherence).
SHAPES_HOLDOUT = "red triangle,blue circle"

# fmt: off
DATASETS: dict[str, DatasetRecord] = {r.name: r for r in (
    DatasetRecord(
        "shapes", _load_shapes, classes=SHAPES, captions="own",
        eval_key=f"shapes-r{RENDER_VERSION}-n10000", reference_size=10000, feature_net="shapes_cnn", judged=True,
        independent_net="shapes_judge",
        # Class runs take the small model with pixel convolutions: their layout gains more from steps than
        # from depth, and the convolutions let neighbouring patches agree on an edge.
        presets=(("dit", "class", "dit-1.4m"),),
        # more, smaller steps gain more than a larger batch; at batch 64 a higher rate, its edge of stability
        batch_size=64, lr=2e-3,
        # Aligned to an encoder that knows where a shape's centre is, the model learns to lay out crosses,
        # which no run without it drew; REPA's own weight.
        repa_encoder="shapes_repa", repa=0.5,
        holdout=SHAPES_HOLDOUT, grid_prompts=GRID_PROMPTS,
    ),
    DatasetRecord(
        # Seen as it is, one channel at 28x28: with 4x4 patches 49 tokens instead of 64 for a padded 32x32
        # copy. Not mirrored: its sandals, sneakers and ankle boots all face one way, and a flipped shoe is
        # one no real image shows. Samples padded to 32x32 are evaluated too (their centre).
        "fashion-mnist", _load_fashion_mnist, aliases=("fashionmnist", "fmnist"), channels=1, img_size=28,
        classes=tuple(FASHION_MNIST_CLASSES), mirrors=False, eval_sizes=((1, 28), (1, 32)), feature_net="fmnist_cnn",
        # An encoder is shipped, but its gain was mixed (a lower FID, a lower recall) for a dearer step: its
        # runs align when asked. Grayscale class runs train on uniform times.
        repa_encoder="fmnist_repa", t_shift=1.0,
    ),
    DatasetRecord("cifar10", _load_cifar10, aliases=("cifar-10",), classes=tuple(CIFAR10_CLASSES)),
)}
# fmt: on

BUILTIN_DATASETS = tuple(DATASETS)
_ALIASES = {spelling: r.name for r in DATASETS.values() for spelling in (r.name, *r.aliases)}
FOLDER_SIZE = 32  # an image folder's side unless `img_size` says otherwise
# A run trained on a Dataset object given from Python is named by its class: "dataset:<class>".
DATASET_PREFIX = "dataset:"


def _no_loader(train: bool, root: Path, download: bool, size: int | None, limit: int | None) -> CachedDataset:
    raise TinyDiTError("this data set's images are read through `folder_record` or given as a Dataset")


# An image folder before its images are read, and a Dataset object: taken to be photographs, which mirror.
_OTHER = DatasetRecord("", _no_loader, captions="file")


def record_of(name: str) -> DatasetRecord:
    """The record of a canonical name: a built-in set's own, else the defaults an image folder and a Dataset
    object share (its images unread: ``folder_record`` reads a folder's)."""
    return DATASETS.get(name) or replace(_OTHER, name=name)


def folder_record(root: str | Path, img_size: int | None = None) -> DatasetRecord:
    """The record of the image folder ``root`` (an absolute path, as ``canonical_name`` makes it) at
    ``img_size`` pixels a side (None: ``FOLDER_SIZE``), from its images: their classes, size and channels."""
    root, size = Path(root), img_size or FOLDER_SIZE
    signature = folder_signature(root)  # a walk over the folder's files: once
    everything, _ = decode_folder(root, signature, size)
    digest = hashlib.sha1(repr((str(root), signature)).encode()).hexdigest()[:12]
    return replace(
        _OTHER,
        name=str(root),
        load=functools.partial(_load_folder, root, size),
        channels=everything.channels,
        img_size=size,
        classes=tuple(everything.classes),
        eval_key=f"folder-{digest}" if size == FOLDER_SIZE else f"folder-{digest}-{size}px",
    )


def _load_folder(
    folder: Path, img_size: int, train: bool, root: Path, download: bool, size: int | None, limit: int | None
) -> CachedDataset:
    """A split of an image folder (``folder``; ``root`` is where downloads go, unused): about 5% of its
    files held out for the test split (``tinydit.data.datasets.decode_folder``), all of them if that is none."""
    everything, held = decode_folder(folder, folder_signature(folder), img_size)
    keep = torch.nonzero(held != train).flatten()
    if len(keep) == 0:
        if not train:
            warnings.warn(
                f"{folder} is too small to hold images out ({len(everything)} images): "
                "the validation loss is measured on training images",
                stacklevel=4,  # load_dataset's caller
            )
        keep = torch.arange(len(everything))
    return everything.subset(keep)


def mirrors(name: str) -> bool:
    """Whether the data set called ``name`` (canonical, or an image folder's path) trains with random flips
    unless told otherwise."""
    return record_of(name).mirrors


def dataset_name(dataset: object) -> str:
    """The name a run records for the Dataset object it trains on."""
    return f"{DATASET_PREFIX}{type(dataset).__name__}"


def canonical_name(name: str) -> str:
    """A built-in data set's canonical name, or the absolute path of an image folder."""
    key = name.lower().replace("_", "-")
    return _ALIASES.get(key) or str(Path(name).expanduser().resolve())


def known_name(name: str, what: str = "data set") -> str:
    """``canonical_name(name)``, refused (naming ``name`` as the user spelled it) unless it is a built-in data
    set or a path that exists (what is there is checked where it is read: an image folder)."""
    return _check_known(canonical_name(name), name, what)


def _check_known(key: str, name: str, what: str = "data set") -> str:
    """The canonical ``key``, refused naming ``name`` unless it is a built-in set or a path that exists."""
    if key not in DATASETS and not Path(key).exists():
        raise TinyDiTError(
            f"unknown {what} {name!r}: use one of {', '.join(BUILTIN_DATASETS)} or the path of an image folder"
        )
    return key


def load_dataset(
    name: str,
    train: bool = True,
    root: str | Path = "data",
    download: bool = True,
    limit: int | None = None,
    shapes_size: int | None = None,
    flip: bool | None = None,
    img_size: int | None = None,
) -> CachedDataset:
    """A built-in data set by name (``shapes``, ``fashion-mnist``, ``cifar10``) or a folder of images,
    decoded once into memory. A training split flips at random where ``flip`` says (None: where the data
    set mirrors, ``DatasetRecord.mirrors``: not Fashion-MNIST); held-out splits never do. Setting the
    environment variable ``TINYDIT_OFFLINE=1`` turns every download off. ``img_size``: an image folder's
    side (None: ``FOLDER_SIZE``); ``shapes_size``: how many images a generated set (``shapes``) makes.

    An image folder has no test split: about 5% of its files (chosen by a hash of the path, so the
    choice is stable as files are added) are held out, and if that leaves none the whole folder is
    used for both.
    """
    return open_dataset(known_name(name), train, root, download, limit, shapes_size, flip, img_size)


def open_dataset(
    key: str,
    train: bool = True,
    root: str | Path = "data",
    download: bool = True,
    limit: int | None = None,
    shapes_size: int | None = None,
    flip: bool | None = None,
    img_size: int | None = None,
) -> CachedDataset:
    """``load_dataset`` for a name already made canonical (``canonical_name``: a built-in name, or an image
    folder's absolute path), as a resolved run holds it: its record's loader, then the first ``limit``."""
    download = download and os.environ.get("TINYDIT_OFFLINE", "") in ("", "0")
    _check_known(key, key)  # already canonical: refused in the line every data-set name is refused with
    record = DATASETS[key] if key in DATASETS else folder_record(key, img_size)
    ds = record.load(train, Path(root), download, shapes_size, limit)
    ds.flip = train and (record.mirrors if flip is None else flip)
    return ds.first(limit)
