"""``tinydit eval``: sample quality against a reference split, the same way every time, offline.

Pipeline (``evaluate``):

1. Samples come from a checkpoint (N class-balanced images, generated here with the given steps and
   guidance, ``tinydit.eval.sampling``; a text model gets prompts) or from a file (.npz with ``images``
   and optional ``labels``, or a folder of images).
2. Every image set, samples and reference alike, is converted the same way: to uint8 (N, C, S, S) at
   the data set's evaluation size (floats are taken to be in [-1, 1] and quantised first).
3. Offline metrics in the data set's feature network space (``tinydit.eval.features``): FID, KID,
   precision/recall and class consistency, named after the network (``fid_fmnist_cnn``, ...).
4. Optionally the standard Inception FID (``tinydit.eval.inception``); for data sets without an offline
   feature network (CIFAR-10, image folders) it is the only metric.
5. For a text model trained on ``shapes``: prompt adherence (``tinydit.eval.adherence``), the accuracy of the
   shape, colour and background read back from each sample against its prompt, for prompts the model
   saw and for held-out combinations (``adherence_<attribute>_<seen|held_out|all>``).

Reference features are cached on disk, keyed by data set (and its size and renderer version),
split, feature network and the SHA-256 of its weights.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tinydit.data.datasets import decode_folder, folder_signature
from tinydit.data.registry import DATASETS, folder_record, known_name, open_dataset
from tinydit.errors import TinyDiTError
from tinydit.eval.features import extract, load_feature_net
from tinydit.eval.inception import InceptionFeatures
from tinydit.eval.metrics import MIN_SAMPLES, feature_stats, frechet_distance, kid, precision_recall
from tinydit.files import torch_save
from tinydit.images import to_uint8
from tinydit.machine import cache_root

__all__ = [
    "EvalSpec",
    "eval_spec",
    "spec_for",
    "to_eval_images",
    "reference_images",
    "reference_features",
    "evaluate",
    "blur",
    "add_noise",
    "DEFAULT_CACHE",
]

DEFAULT_CACHE = cache_root()  # beside the compile cache and the machine record: XDG_CACHE_HOME is honoured


@dataclass(frozen=True)
class EvalSpec:
    data: str  # the data set's canonical name (tinydit.data.registry), or an image folder's absolute path
    key: str  # identifies the reference images in cache keys
    channels: int
    size: int  # evaluation size S: images are compared as (C, S, S)
    accepted: tuple[tuple[int, int], ...]  # (C, side) pairs accepted as input; anything else is an error
    feature_net: str | None  # the offline feature network, if the data set has one
    reference_size: int | None = None  # reference images to use (None: the whole split)
    classes: tuple[str, ...] = ()  # the data set's class names, in label order
    img_size: int | None = None  # an image folder's side as trained (its reference is decoded at it)
    independent_net: str | None = None  # a second offline network, independent of the first and of alignment


def eval_spec(data: str | EvalSpec, img_size: int | None = None) -> EvalSpec:
    """How samples of ``data`` (a built-in name or an image folder, in any spelling) are evaluated; the
    name is made canonical here, once, and every function below takes the spec in its place. ``img_size``:
    an image folder's side (None: the size folders train at by default)."""
    return data if isinstance(data, EvalSpec) else spec_for(known_name(data, "reference"), img_size)


def spec_for(name: str, img_size: int | None = None) -> EvalSpec:
    """``eval_spec`` of a canonical name (``canonical_name``), as a checkpoint and a resolved run hold it: what
    its data set's record says (an image folder's is built from the folder, at ``img_size``)."""
    record = DATASETS.get(name)
    if record is None:
        if not Path(name).is_dir():
            raise TinyDiTError(f"unknown reference {name!r}: use {', '.join(DATASETS)} or an image folder")
        record = folder_record(name, img_size)
    accepted = record.accepted
    return EvalSpec(
        name,
        record.eval_key or name,
        record.channels,
        accepted[0][1],
        accepted,
        record.feature_net,
        record.reference_size,
        record.classes,
        None if name in DATASETS else record.img_size,
        record.independent_net,
    )


def to_eval_images(images: np.ndarray | torch.Tensor, data: str | EvalSpec) -> torch.Tensor:
    """Any accepted layout and dtype -> uint8 (N, C, S, S) at the data set's evaluation size.

    uint8 means [0, 255]; floating point means the model range [-1, 1] and is quantised to uint8
    first, exactly as a PNG of it would be. (N, H, W) and channels-last (N, H, W, C) are accepted.
    """
    spec = eval_spec(data)
    x = images if isinstance(images, torch.Tensor) else torch.as_tensor(np.asarray(images))
    if x.dim() == 3:
        x = x.unsqueeze(1)  # (N, H, W) -> (N, 1, H, W)
    if x.dim() == 4 and x.shape[1] not in (1, 3) and x.shape[-1] in (1, 3):
        x = x.permute(0, 3, 1, 2)  # (N, H, W, C) -> (N, C, H, W)
    accepted = " or ".join(f"{c}x{s}x{s}" for c, s in spec.accepted)
    if x.dim() != 4 or x.shape[2] != x.shape[3] or (x.shape[1], x.shape[2]) not in spec.accepted:
        raise TinyDiTError(
            f"samples of shape {tuple(x.shape)} do not fit this reference: accepted sizes are "
            f"{accepted} (channels x height x width), as uint8 [0, 255] or float [-1, 1]"
        )
    if x.is_floating_point():
        if not torch.isfinite(x).all():
            bad = int((~torch.isfinite(x)).flatten(1).any(1).sum())
            raise TinyDiTError(
                f"{bad} of the {x.shape[0]} samples hold NaN or infinite values; a sampler that "
                "diverged gives no images to score"
            )
        x = to_uint8(x)
    elif x.dtype != torch.uint8:
        raise TinyDiTError(f"samples have dtype {x.dtype}: use uint8 [0, 255] or float [-1, 1]")
    if x.shape[2] != spec.size:
        crop = (x.shape[2] - spec.size) // 2  # a padded copy: take the centre back out
        x = x[:, :, crop : crop + spec.size, crop : crop + spec.size]
    return x.contiguous()


def reference_images(data: str | EvalSpec, split: str, root: str | Path = "data") -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 (N, C, S, S) reference images and labels (N,) of a split."""
    if split not in ("train", "test"):
        raise TinyDiTError(f"unknown split {split!r}: use train or test")
    spec = eval_spec(data)
    if spec.img_size is not None:  # a folder is its own reference, all of it, whatever the split
        root_dir = Path(spec.data)
        ds, _ = decode_folder(root_dir, folder_signature(root_dir), spec.img_size)
    else:
        ds = open_dataset(spec.data, train=split == "train", root=root, shapes_size=spec.reference_size)
    return to_eval_images(ds.images, spec), ds.labels


def reference_features(
    data: str | EvalSpec,
    split: str,
    extractor,
    cache_dir: str | Path | None = DEFAULT_CACHE,
    root: str | Path = "data",
) -> tuple[torch.Tensor, dict]:
    """Reference features, cached on disk under data set, split, feature network name and hash.

    ``extractor`` is a callable (uint8 images -> features) with ``name`` and ``sha256`` attributes.
    """
    spec = eval_spec(data)
    key = f"{spec.key}-{split}-{extractor.name}-{extractor.sha256[:16]}"
    cache = Path(cache_dir) / "reference" / f"{key}.pt" if cache_dir is not None else None
    if cache is not None and cache.is_file():
        try:
            state = torch.load(cache, map_location="cpu", weights_only=True)
            if state.get("key") == key:
                return state["features"], {"cache": str(cache), "cache_hit": True}
        except Exception:  # a damaged cache file is a miss, rewritten below
            pass
    images, _ = reference_images(spec, split, root)
    feats = extractor(images)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        mu, sigma = feature_stats(feats)
        torch_save(cache, {"key": key, "features": feats, "mu": mu, "sigma": sigma})
    return feats, {"cache": str(cache) if cache else None, "cache_hit": False}


class _OfflineExtractor:
    """A shipped feature network as a callable with a name and a hash, remembering its predictions."""

    def __init__(self, name: str):
        self.net, self.record = load_feature_net(name)
        self.name, self.sha256 = name, self.record["sha256"]

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        feats, self.predictions = extract(self.net, images)
        return feats


def evaluate(
    samples: np.ndarray | torch.Tensor,
    labels: np.ndarray | torch.Tensor | None,
    data: str | EvalSpec,
    split: str = "test",
    root: str | Path = "data",
    cache_dir: str | Path | None = DEFAULT_CACHE,
    inception: bool = False,
    inception_weights: str | Path | None = None,
    kid_subsets: int = 100,
    kid_subset_size: int = 1000,
    independent: bool = True,
) -> dict:
    """All metrics for ``samples`` against the ``split`` of ``data``, as a flat JSON-ready dict: in the data
    set's feature network and, with ``independent`` (default), in its independent one where it has one
    (``DatasetRecord.independent_net``)."""
    started = time.perf_counter()
    spec = eval_spec(data, img_size=int(max(samples.shape[-2:])))  # an image folder at the samples' size
    fake = to_eval_images(samples, spec)
    if fake.shape[0] < MIN_SAMPLES:
        raise TinyDiTError(
            f"{fake.shape[0]} samples are too few to evaluate; give at least {MIN_SAMPLES} "
            "(FID is only comparable at equal N, 10000 is customary)"
        )
    y = None if labels is None else _checked_labels(labels, len(fake), spec, root)  # (N,)
    if spec.feature_net is None and not (inception or inception_weights):
        raise TinyDiTError(
            f"no offline feature network for {spec.data}: offline metrics exist for "
            f"{' and '.join(sorted(r.name for r in DATASETS.values() if r.feature_net))}; use `inception` (or "
            "`inception_weights` PATH) for Inception FID"
        )
    out: dict = {}
    nets: dict = {}
    kid_sizes = (kid_subsets, kid_subset_size)
    for net in (spec.feature_net, spec.independent_net if independent else None):  # the first: the headline
        if net is not None:
            metrics, nets[net] = _offline_metrics(fake, y, split, spec, net, cache_dir, root, kid_sizes)
            out.update(metrics)
    if inception or inception_weights:
        ex = InceptionFeatures(inception_weights)
        real, ref = reference_features(spec, split, ex, cache_dir, root)
        out["fid_inception"] = frechet_distance(*feature_stats(real), *feature_stats(ex(fake)))
        out["n_reference"] = int(real.shape[0])
        nets["inception"] = {"sha256": ex.sha256, **ref}
    out.update(
        n_samples=int(fake.shape[0]),
        data=spec.data,
        split=split,
        feature_nets=nets,
        eval_seconds=time.perf_counter() - started,
    )
    return out


def _offline_metrics(
    fake, y, split: str, spec: EvalSpec, net: str, cache_dir, root, kid_sizes: tuple[int, int]
) -> tuple[dict, dict]:
    """FID, KID, precision/recall and class consistency in the feature space of the shipped network ``net``,
    and the network's record (its hash, accuracy and the reference it was computed on)."""
    ex = _OfflineExtractor(net)
    real, ref = reference_features(spec, split, ex, cache_dir, root)
    fake_feats = ex(fake)
    tag = ex.name
    gen = torch.Generator().manual_seed(0)  # precision/recall compare equal-sized sets
    real_pr = real[torch.randperm(len(real), generator=gen)[: len(fake_feats)]]
    precision, recall = precision_recall(real_pr, fake_feats)
    kid_mean, kid_std = kid(real, fake_feats, subsets=kid_sizes[0], subset_size=kid_sizes[1])
    out = {
        f"fid_{tag}": frechet_distance(*feature_stats(real), *feature_stats(fake_feats)),
        f"kid_{tag}_mean": kid_mean,
        f"kid_{tag}_std": kid_std,
        f"precision_{tag}": precision,
        f"recall_{tag}": recall,
    }
    if y is not None:
        out[f"class_consistency_{tag}"] = (ex.predictions == y).double().mean().item()
    out["n_reference"] = int(real.shape[0])
    return out, {"sha256": ex.sha256, "test_accuracy": ex.record.get("test_accuracy"), **ref}


def _checked_labels(labels, n: int, spec: EvalSpec, root) -> torch.Tensor:
    """``labels`` as int64 (N,), one integer class id of ``spec.data`` per sample."""
    labels = np.asarray(labels)
    if not np.issubdtype(labels.dtype, np.integer):
        raise TinyDiTError(f"labels have dtype {labels.dtype}: give integer class ids")
    y = torch.as_tensor(labels, dtype=torch.int64).reshape(-1)  # (N,)
    if y.shape[0] != n:
        raise TinyDiTError(f"{y.shape[0]} labels for {n} samples; give one label per sample")
    n_classes = len(spec.classes) if spec.feature_net else None
    if n_classes is not None and (int(y.min()) < 0 or int(y.max()) >= n_classes):
        raise TinyDiTError(
            f"labels range over {int(y.min())}..{int(y.max())}, but {spec.data} has classes "
            f"0..{n_classes - 1}; give each sample's class id"
        )
    return y


def default_best_metric(data: str, text: bool) -> tuple[str, bool]:
    """The metric best.pt is chosen by when none is named, and whether lower is better: prompt adherence
    for shapes text runs, the strict judge's pass rate for shapes class runs, else the offline FID. ``data``:
    a run's canonical name."""
    if data in DATASETS and DATASETS[data].judged:
        return ("adherence_all_all", False) if text else ("shape_strict", False)
    net = spec_for(data).feature_net
    if net is None:
        raise TinyDiTError(f"{data} has no offline feature network")
    return f"fid_{net}", True


def lower_is_better(metric: str) -> bool:
    return metric.startswith(("fid", "kid"))


def blur(images: torch.Tensor, passes: int) -> torch.Tensor:
    """uint8 (N, C, S, S) blurred by ``passes`` 3x3 box filters: a calibration degradation."""
    import torch.nn.functional as F

    x = images.float()
    kernel = torch.ones(x.shape[1], 1, 3, 3) / 9  # (C, 1, 3, 3): one filter per channel
    for _ in range(passes):
        x = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), kernel, groups=x.shape[1])
    return x.round().clamp(0, 255).to(torch.uint8)


def add_noise(images: torch.Tensor, std: float, seed: int = 0) -> torch.Tensor:
    """uint8 images plus Gaussian pixel noise of ``std`` (in 0-255 units): a calibration degradation."""
    gen = torch.Generator().manual_seed(seed)
    return (images.float() + std * torch.randn(images.shape, generator=gen)).round().clamp(0, 255).to(torch.uint8)
