"""Datasets and DataLoaders (series post 4): ``from tinydit.data import load_dataset`` as the post shows.

The modules: ``datasets`` (transforms, loaders, CIFAR-10, Fashion-MNIST, image folders, the in-memory
cache), ``shapes`` (the built-in data), ``text`` (captions and the tokenizer), ``samples`` (writing
generated images).
"""

from tinydit.data.datasets import *  # noqa: F403  (the post's API, re-exported as it is)
from tinydit.data.datasets import __all__  # noqa: F401
