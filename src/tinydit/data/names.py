"""The built-in data sets' names and the spellings accepted for each: a run's data is named once, here,
and everything after (its checkpoint, evaluation, the sampling records) keys on the canonical name."""

from __future__ import annotations

from pathlib import Path

from tinydit.errors import TinyDiTError

__all__ = ["BUILTIN_DATASETS", "DATASET_PREFIX", "canonical_name", "dataset_name", "known_name", "mirrors"]

# The built-in data sets and the spellings accepted for them; anything else is an image folder's path.
BUILTIN_DATASETS = ("shapes", "fashion-mnist", "cifar10")
_DATA_ALIASES = {
    "fashion-mnist": "fashion-mnist",
    "fashionmnist": "fashion-mnist",
    "fmnist": "fashion-mnist",
    "cifar10": "cifar10",
    "cifar-10": "cifar10",
    "shapes": "shapes",
}


# Whether a left-right mirror image of a training image is as likely as the image itself, so that random
# flips add images of the same distribution. Not for Fashion-MNIST: its sandals, sneakers and ankle boots
# all face one way, and a flipped shoe is one no real image shows. Image folders and Dataset objects are
# taken to be photographs, which mirror (``TrainConfig.flip`` says otherwise).
MIRRORED = {"shapes": True, "fashion-mnist": False, "cifar10": True}


def mirrors(name: str) -> bool:
    """Whether the data set called ``name`` (canonical, or an image folder's path) trains with random flips
    unless told otherwise."""
    return MIRRORED.get(name, True)


# A run trained on a Dataset object given from Python is named by its class: "dataset:<class>".
DATASET_PREFIX = "dataset:"


def dataset_name(dataset: object) -> str:
    """The name a run records for the Dataset object it trains on."""
    return f"{DATASET_PREFIX}{type(dataset).__name__}"


def canonical_name(name: str) -> str:
    """A built-in data set's canonical name, or the absolute path of an image folder."""
    key = name.lower().replace("_", "-")
    return _DATA_ALIASES.get(key) or str(Path(name).expanduser().resolve())


def known_name(name: str, what: str = "data set") -> str:
    """``canonical_name(name)``, refused (naming ``name`` as the user spelled it) unless it is a built-in data
    set or a path that exists (what is there is checked where it is read: an image folder)."""
    key = canonical_name(name)
    if key not in BUILTIN_DATASETS and not Path(key).exists():
        raise TinyDiTError(
            f"unknown {what} {name!r}: use one of {', '.join(BUILTIN_DATASETS)} or the path of an image folder"
        )
    return key
