"""Datasets and DataLoaders (series post 4): ``from tinydit.data import load_dataset`` as the post shows.

The modules: ``datasets`` (transforms, loaders, CIFAR-10, Fashion-MNIST, image folders, the in-memory
cache), ``shapes`` (the built-in data), ``text`` (captions and the tokenizer), ``samples`` (writing
generated images).
"""

from tinydit.data.datasets import (
    BUILTIN_DATASETS,
    CIFAR10_CLASSES,
    DEBIAN_FASHION_MNIST,
    FASHION_MNIST_CLASSES,
    IMG_EXTS,
    CachedCIFAR10,
    CachedDataset,
    ImageFolderDataset,
    canonical_name,
    folder_caption,
    get_cifar10,
    get_fashion_mnist,
    load_dataset,
    make_loader,
    make_transform,
)

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
    "CachedCIFAR10",
    "load_dataset",
    "canonical_name",
    "BUILTIN_DATASETS",
    "folder_caption",
]
