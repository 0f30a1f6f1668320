"""The built-in data sets' names and the spellings accepted for each: a run's data is named once, here,
and everything after (its checkpoint, evaluation, the sampling records) keys on the canonical name."""

from __future__ import annotations

from pathlib import Path

__all__ = ["BUILTIN_DATASETS", "canonical_name"]

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


def canonical_name(name: str) -> str:
    """A built-in data set's canonical name, or the absolute path of an image folder."""
    key = name.lower().replace("_", "-")
    return _DATA_ALIASES.get(key) or str(Path(name).expanduser().resolve())
