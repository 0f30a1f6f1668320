"""A whole data set decoded once into memory, for training without decoding or worker processes.

    CachedDataset.images   uint8 (N, C, H, W)        labels  int64 (N,)        captions  N strings (or None)
    CachedDataset.batch(indices, generator)  ->  float32 (N, C, H, W) in [-1, 1], flipped at random; labels (N,)
    CachedDataset.draw_flips(n, generator)   ->  (N,) bool: the flips ``batch`` draws, to pass it and keep

``CachedDataset.from_dataset`` decodes any map-style dataset of (image, label) pairs: the built-in
loaders use it for image folders, and the trainer for a user's own ``torch.utils.data.Dataset``.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from tinydit.images import from_uint8, to_uint8

__all__ = ["CachedDataset", "random_flip"]


def coin_flips(n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """(n,) bool on the CPU, each True with probability 1/2: the one draw behind every random flip."""
    return torch.rand(n, generator=generator) < 0.5


def random_flip(
    x: torch.Tensor, generator: torch.Generator | None = None, flip: torch.Tensor | None = None
) -> torch.Tensor:
    """Mirror each image of (N, C, H, W) left-right with probability 1/2 (flip draws from ``generator``), or
    where ``flip`` (N,) bool says."""
    if flip is None:
        flip = coin_flips(x.shape[0], generator)
    return torch.where(flip.to(x.device).view(-1, 1, 1, 1), x.flip(-1), x)  # (N, C, H, W)


class CachedDataset(Dataset):
    """A whole data set decoded once into memory: uint8 (N, C, H, W) and int64 labels (N,).

    ``__getitem__`` gives float32 in [-1, 1] like every other dataset here; ``batch`` gathers many
    images at once, which is what the trainer uses (no per-image Python, no worker processes).
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, classes: list[str], flip: bool = False):
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError(f"images must be uint8 (N, C, H, W), got {images.dtype} {tuple(images.shape)}")
        if labels.shape != (images.shape[0],):
            raise ValueError(f"labels must be ({images.shape[0]},), got {tuple(labels.shape)}")
        self.images = images.contiguous()
        self.labels = labels.to(torch.int64)
        self.classes = list(classes)
        self.flip = flip
        self.captions: list[str] | None = None  # one per image; ``load_dataset`` fills them for every data set

    @classmethod
    def from_dataset(cls, dataset: Dataset, classes: list[str], flip: bool = False, desc: str = "decoding"):
        """Decode any dataset of (float [-1, 1] image, label) pairs once (give it an eval transform)."""
        xs, ys = [], []
        for i in tqdm(range(len(dataset)), desc=desc, leave=False, disable=len(dataset) < 2000):
            x, y = dataset[i]  # by index: a map-style dataset need not raise IndexError at its end
            xs.append(to_uint8(x))
            ys.append(int(y))
        return cls(torch.stack(xs), torch.tensor(ys, dtype=torch.int64), classes, flip)

    @property
    def channels(self) -> int:
        return self.images.shape[1]

    @property
    def img_size(self) -> int:
        return self.images.shape[2]

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        x = from_uint8(self.images[idx])  # (C, H, W) in [-1, 1]
        if self.flip and torch.rand(()) < 0.5:
            x = x.flip(-1)
        return x, int(self.labels[idx])

    def draw_flips(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """(n,) bool: which of a batch of n images ``batch`` mirrors, the draw it makes itself (none where the
        set does not flip)."""
        if not self.flip:
            return torch.zeros(n, dtype=torch.bool)
        return coin_flips(n, generator)

    def batch(
        self,
        indices: torch.Tensor,
        generator: torch.Generator | None = None,
        device: str | torch.device = "cpu",
        flips: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Images (N, C, H, W) float32 in [-1, 1] and labels (N,) for ``indices``, flipped at random (where
        ``flips`` (N,) bool says, when given: ``draw_flips``)."""
        x = from_uint8(self.images[indices].to(device, non_blocking=True))  # (N, C, H, W) in [-1, 1]
        if flips is None:
            flips = self.draw_flips(len(x), generator)
        if flips.any():
            x = random_flip(x, flip=flips)
        return x, self.labels[indices].to(device, non_blocking=True)

    def first(self, n: int | None) -> CachedDataset:
        """The first ``n`` images (None, or more than there are: all of them)."""
        return self if n is None or n >= len(self) else self.subset(torch.arange(n))

    def subset(self, indices: torch.Tensor | list[int], flip: bool | None = None) -> CachedDataset:
        idx = torch.as_tensor(indices, dtype=torch.int64)
        out = CachedDataset(self.images[idx], self.labels[idx], self.classes, self.flip if flip is None else flip)
        if self.captions is not None:
            out.captions = [self.captions[i] for i in idx.tolist()]
        return out
