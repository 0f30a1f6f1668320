"""Datasets and DataLoaders (series post 4): ``from tinydit.data import load_dataset`` as the post shows.

The modules: ``registry`` (one record per data set, and ``load_dataset``, which opens a set by name),
``datasets`` (transforms, loaders, CIFAR-10, Fashion-MNIST, image folders), ``cache`` (the in-memory
cache), ``shapes`` (the built-in data), ``text`` (captions and the tokenizer), ``samples`` (writing
generated images).
"""

from tinydit.data import datasets, registry
from tinydit.data.datasets import *  # noqa: F403  (the post's API, re-exported as it is)
from tinydit.data.registry import *  # noqa: F403

__all__ = [*datasets.__all__, *registry.__all__]
