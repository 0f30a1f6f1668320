"""What a run trains on: the training and validation images, their conditions, and the grid prompts.

A run reads a built-in data set or an image folder by name (``TrainConfig.data``), or any map-style
``torch.utils.data.Dataset`` of (image, label) pairs given from Python: images float (C, H, W) in
[-1, 1] with H = W, labels ints. Either way the images are decoded once into a ``CachedDataset``.

Text runs (``cond="text"``, always for MMDiT): the images whose caption holds a held-out phrase are
removed; the tokenizer is built once from the remaining training captions (or read back from the
checkpoint of a continued run); every caption is encoded once into one LongTensor (N, L), and a batch's
``y`` is its rows.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
from torch.utils.data import Dataset

from tinydit.checkpoints.checkpoint import Checkpoint, DataRecord
from tinydit.config import TrainConfig
from tinydit.data.cache import CachedDataset
from tinydit.data.registry import open_dataset, record_of
from tinydit.data.text import Tokenizer, class_captions, holds_phrase
from tinydit.errors import TinyDiTError
from tinydit.train.optim import step_generator

__all__ = ["RunData", "BatchOrder", "prepare_data", "cache_dataset"]

VAL_EVERY = 20  # a Dataset given without a validation set: every 20th image is held out for the validation loss


@dataclass
class RunData:
    name: str  # recorded in checkpoints: a built-in name, a folder's absolute path, or "dataset:<class>"
    train_set: CachedDataset
    val_set: CachedDataset
    tokenizer: Tokenizer | None = None  # text runs only
    train_tokens: torch.Tensor | None = None  # text runs: every training caption's ids, (N, L) int64
    val_tokens: torch.Tensor | None = None
    prompts: list[str] = field(default_factory=list)  # text runs: one row of the sample grids each
    n_held_out: int = 0  # training images removed for their held-out captions

    def model_fields(self) -> dict:
        """What the model config takes from the data: image size, channels, classes, tokenizer sizes."""
        out = dict(
            img_size=self.train_set.img_size, in_channels=self.train_set.channels, n_classes=len(self.train_set.classes)
        )
        if self.tokenizer is not None:
            out.update(vocab_size=self.tokenizer.vocab_size, text_len=self.tokenizer.max_len)
        return out

    def record(self) -> DataRecord:
        """What a checkpoint records of the data: its name, classes and image shape (text runs: the grid prompts)."""
        ds = self.train_set
        prompts = tuple(self.prompts) if self.tokenizer is not None else None
        return DataRecord(self.name, tuple(ds.classes), ds.channels, ds.img_size, prompts)

    def batch(
        self, train: bool, idx: torch.Tensor, generator=None, device="cpu", flips: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Images (N, C, H, W) and their conditions: labels (N,), or caption ids (N, L) in text runs.
        ``flips`` (N,) bool: which images are mirrored (``CachedDataset.draw_flips``), else drawn here."""
        ds, tokens = (self.train_set, self.train_tokens) if train else (self.val_set, self.val_tokens)
        x, y = ds.batch(idx, generator=generator, device=device, flips=flips)
        if tokens is not None:
            y = tokens[idx].to(device, non_blocking=True)
        return x, y


class BatchOrder:
    """Which of ``n`` training images step s trains on: epoch e's order is a permutation seeded with
    (seed, e), so any step's batch is known without replaying the steps before it."""

    def __init__(self, n: int, batch_size: int, seed: int):
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.steps_per_epoch = n // batch_size
        self._epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def indices(self, step: int) -> torch.Tensor:
        """(batch_size,) int64 image indices of ``step``'s global batch."""
        epoch, i = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._perm = torch.randperm(self.n, generator=step_generator(self.seed, 7919, epoch))
            self._epoch = epoch
        return self._perm[i * self.batch_size : (i + 1) * self.batch_size]


def cache_dataset(dataset: Dataset, flip: bool, desc: str) -> CachedDataset:
    """Any map-style dataset of (float image in [-1, 1], int label) decoded once into a ``CachedDataset``;
    class names from its ``classes`` attribute, else "0", "1", ...; captions "a photo of a {class}"."""
    if isinstance(dataset, CachedDataset):
        return dataset
    if len(dataset) < 1:
        raise TinyDiTError(f"the {type(dataset).__name__} given to train on is empty")
    x0, _ = dataset[0]
    if not (torch.is_tensor(x0) and x0.dim() == 3 and x0.shape[1] == x0.shape[2] and x0.is_floating_point()):
        raise TinyDiTError(
            f"`dataset` must yield (image, label) with the image a float tensor (C, H, W), H = W, in "
            f"[-1, 1]; its first image is {getattr(x0, 'shape', type(x0).__name__)}"
        )
    ds = CachedDataset.from_dataset(dataset, classes=[], flip=flip, desc=desc)
    classes = list(getattr(dataset, "classes", None) or [str(i) for i in range(int(ds.labels.max()) + 1)])
    if int(ds.labels.min()) < 0 or int(ds.labels.max()) >= len(classes):
        raise TinyDiTError(
            f"`dataset` labels must lie in 0..{len(classes) - 1} (its `classes`), got "
            f"{int(ds.labels.min())}..{int(ds.labels.max())}"
        )
    ds.classes = classes
    ds.captions = class_captions(ds.labels.tolist(), classes)
    return ds


def _datasets(cfg: TrainConfig, dataset: Dataset | None, val_dataset: Dataset | None):
    """The training and validation sets, whole but for what `limit` and `val_size` will cut anyway (a class
    filter first needs them whole), which a generated set then does not make."""
    if dataset is None:
        train, val = (None, None) if cfg.classes else (cfg.limit, cfg.val_size)
        options = dict(root=cfg.data_root, img_size=cfg.img_size)
        return (
            open_dataset(cfg.data, train=True, limit=train, flip=cfg.flip, **options),
            open_dataset(cfg.data, train=False, limit=val, **options),
        )
    train = cache_dataset(dataset, flip=cfg.flip, desc="decoding the training set")  # resolved: a bool
    if val_dataset is not None:
        val = cache_dataset(val_dataset, flip=False, desc="decoding the validation set")
    else:
        held = torch.arange(len(train)) % VAL_EVERY == VAL_EVERY - 1
        if not held.any():
            warnings.warn(
                f"{len(train)} images are too few to hold any out: the validation loss is measured on training images",
                stacklevel=3,
            )
            held = torch.ones(len(train), dtype=torch.bool)
        val = train.subset(torch.nonzero(held).flatten(), flip=False)
        train = train.subset(torch.nonzero(~held).flatten()) if not held.all() else train
    return train, val


def only_classes(ds: CachedDataset, spec: str) -> CachedDataset:
    """The images of the classes ``spec`` names (names or ids, comma-separated), relabelled 0, 1, ... in
    the order given: the series' post 4 class filter, from a config."""
    lookup = {name.lower(): i for i, name in enumerate(ds.classes)}
    wanted = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        i = int(item) if item.isdigit() and int(item) < len(ds.classes) else lookup.get(item.lower())
        if i is None:
            raise TinyDiTError(
                f"unknown class {item!r} in `classes`: the data has {', '.join(ds.classes)} "
                f"(or ids 0-{len(ds.classes) - 1})"
            )
        if i not in wanted:
            wanted.append(i)
    keep = torch.nonzero(torch.isin(ds.labels, torch.tensor(wanted))).flatten()
    out = ds.subset(keep)
    remap = torch.full((len(ds.classes),), -1, dtype=torch.int64)
    remap[torch.tensor(wanted)] = torch.arange(len(wanted))
    out.labels, out.classes = remap[out.labels], [ds.classes[i] for i in wanted]
    return out


def prepare_data(
    cfg: TrainConfig,
    state: Checkpoint | None = None,
    dataset: Dataset | None = None,
    val_dataset: Dataset | None = None,
) -> RunData:
    """The run's data: ``cfg.data`` by name (``cfg`` resolved, ``tinydit.train.resolve``), or ``dataset`` (and
    ``val_dataset``) given from Python."""
    name = cfg.data  # resolved: a built-in name, a folder's absolute path, or "dataset:<class>"
    train_set, val_set = _datasets(cfg, dataset, val_dataset)
    if cfg.classes is not None:  # filtered first, so that `limit` and `val_size` count the classes kept
        train_set, val_set = only_classes(train_set, cfg.classes), only_classes(val_set, cfg.classes)
    train_set, val_set = train_set.first(cfg.limit), val_set.first(cfg.val_size)  # `limit` applied here, once
    data = RunData(name, train_set, val_set)
    if cfg.cond != "text":
        return data
    data.train_set, data.n_held_out = _hold_out(train_set, cfg.held_out_phrases(), cfg.holdout)
    stored = state.tokenizer if state is not None else None
    data.tokenizer = (
        Tokenizer.from_dict(stored) if stored is not None else Tokenizer.from_captions(data.train_set.captions)
    )
    data.train_tokens = data.tokenizer.encode(data.train_set.captions)
    data.val_tokens = data.tokenizer.encode(val_set.captions, warn=False)  # unseen words: <unk>
    # The sample grids' rows: the data set's own (shapes: held-out combinations included), else the first 8
    # distinct training captions.
    data.prompts = list(record_of(name).grid_prompts or dict.fromkeys(data.train_set.captions))[:8]
    return data


def _hold_out(ds: CachedDataset, phrases: tuple[str, ...], spec: str | None) -> tuple[CachedDataset, int]:
    """The training set without the images whose caption holds a held-out phrase, and how many went."""
    if not phrases:
        return ds, 0
    held = [holds_phrase(c, phrases) for c in ds.captions]
    for phrase in phrases:
        if not any(holds_phrase(c, (phrase,)) for c, h in zip(ds.captions, held, strict=True) if h):
            warnings.warn(
                f"`holdout` phrase {phrase!r} matches no training caption, so it holds nothing out", stacklevel=4
            )
    keep = [i for i, h in enumerate(held) if not h]
    if not keep:
        raise TinyDiTError(f"`holdout` {spec!r} removes every training image; hold out less")
    n_held_out = len(ds) - len(keep)
    return (ds.subset(keep) if n_held_out else ds), n_held_out
