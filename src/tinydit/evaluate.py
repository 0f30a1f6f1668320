"""``tinydit eval``: sample quality against a reference split, the same way every time, offline.

Pipeline (``evaluate``):

1. Samples come from a checkpoint (N class-balanced images, generated here with the given steps and
   guidance) or from a file (.npz with ``images`` and optional ``labels``, or a folder of images).
2. Every image set, samples and reference alike, is converted the same way: to uint8 (N, C, S, S) at
   the data set's evaluation size (floats are taken to be in [-1, 1] and quantised first).
3. Offline metrics in the data set's feature network space (``tinydit.features``): FID, KID,
   precision/recall and class consistency, named after the network (``fid_fmnist_cnn``, ...).
4. Optionally the standard Inception FID through torchmetrics / torch-fidelity.

Reference features are cached on disk, keyed by data set, split, feature network and its SHA-256.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from tinydit.data import IMG_EXTS, load_dataset
from tinydit.errors import TinyDiTError
from tinydit.features import extract, feature_net_for, load_feature_net
from tinydit.metrics import MIN_SAMPLES, feature_stats, frechet_distance, kid, precision_recall

__all__ = ["EVAL_SPECS", "EvalSpec", "load_samples", "to_eval_images", "reference_features", "evaluate",
           "inception_fid", "DEFAULT_CACHE"]  # fmt: skip

DEFAULT_CACHE = Path.home() / ".cache" / "tinydit"


@dataclass(frozen=True)
class EvalSpec:
    channels: int
    size: int  # evaluation size S: images are compared as (C, S, S)
    accepted: tuple[tuple[int, int], ...]  # (C, side) pairs accepted as input; others are an error
    reference_size: int | None = None  # how many reference images (None: the whole split)


EVAL_SPECS = {
    # Native 28x28 (what TinyDiT trains on) and 32x32 padded copies (centre-cropped back to 28).
    "fashion-mnist": EvalSpec(channels=1, size=28, accepted=((1, 28), (1, 32))),
    "shapes": EvalSpec(channels=3, size=32, accepted=((3, 32),), reference_size=10000),
}


def _spec(data: str) -> EvalSpec:
    feature_net_for(data)  # a clear error for data sets without an offline feature network
    return EVAL_SPECS[data]


def load_samples(path: str | Path, classes: list[str] | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Images (as stored) and labels (or None) from an .npz or a folder of images.

    In a folder, a file named like ``00012_sneaker.png`` (as ``tinydit sample --out DIR`` writes)
    carries its class name; labels are read only when every file has one of ``classes``.
    """
    path = Path(path)
    if path.suffix == ".npz":
        if not path.is_file():
            raise TinyDiTError(f"samples file {path} does not exist")
        with np.load(path) as npz:
            if "images" not in npz:
                raise TinyDiTError(f"{path} has no 'images' array (found {', '.join(npz.files)}); "
                                   "save the samples as images=(N, C, H, W) uint8")
            labels = npz["labels"] if "labels" in npz else None
            return npz["images"], labels
    if not path.is_dir():
        raise TinyDiTError(f"--samples {path}: pass an .npz file or a folder of images")
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMG_EXTS)
    if not files:
        raise TinyDiTError(f"no images in {path}")
    arrays = [np.asarray(Image.open(p)) for p in files]
    if len({a.shape for a in arrays}) > 1:
        raise TinyDiTError(f"the images in {path} have different sizes; give all samples one size")
    images = np.stack(arrays)  # (N, H, W) or (N, H, W, C)
    labels = None
    if classes:
        lookup = {re.sub(r"[^A-Za-z0-9_-]+", "-", c).strip("-").lower(): i for i, c in enumerate(classes)}
        names = [re.fullmatch(r"\d+_(.+)", p.stem) for p in files]
        if all(m and m.group(1).lower() in lookup for m in names):
            labels = np.array([lookup[m.group(1).lower()] for m in names], dtype=np.int64)
    return images, labels


def to_eval_images(images: np.ndarray | torch.Tensor, data: str) -> torch.Tensor:
    """Any accepted layout and dtype -> uint8 (N, C, S, S) at the data set's evaluation size.

    uint8 means [0, 255]; floating point means the model range [-1, 1] and is quantised to uint8
    first, exactly as a PNG of it would be. (N, H, W) and channels-last (N, H, W, C) are accepted.
    """
    spec = _spec(data)
    x = torch.as_tensor(np.asarray(images) if not isinstance(images, torch.Tensor) else images)
    if x.dim() == 3:
        x = x.unsqueeze(1)  # (N, H, W) -> (N, 1, H, W)
    if x.dim() == 4 and x.shape[1] not in (1, 3) and x.shape[-1] in (1, 3):
        x = x.permute(0, 3, 1, 2)  # (N, H, W, C) -> (N, C, H, W)
    accepted = " or ".join(f"{c}x{s}x{s}" for c, s in spec.accepted)
    if x.dim() != 4 or x.shape[2] != x.shape[3] or (x.shape[1], x.shape[2]) not in spec.accepted:
        raise TinyDiTError(f"samples of shape {tuple(x.shape)} do not fit {data}: accepted sizes are "
                           f"{accepted} (channels x height x width), as uint8 [0, 255] or float [-1, 1]")
    if x.dtype == torch.uint8:
        pass
    elif x.is_floating_point():
        x = ((x.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    else:
        raise TinyDiTError(f"samples have dtype {x.dtype}: use uint8 [0, 255] or float [-1, 1]")
    if x.shape[2] != spec.size:
        crop = (x.shape[2] - spec.size) // 2  # a padded copy: take the centre back out
        x = x[:, :, crop : crop + spec.size, crop : crop + spec.size]
    return x.contiguous()


def reference_images(data: str, split: str, root: str | Path = "data") -> tuple[torch.Tensor, torch.Tensor]:
    if split not in ("train", "test"):
        raise TinyDiTError(f"unknown split {split!r}: use train or test")
    spec = _spec(data)
    ds = load_dataset(data, train=split == "train", root=root, download=True, shapes_size=spec.reference_size)
    return to_eval_images(ds.images, data), ds.labels


def reference_features(
    data: str, split: str = "test", root: str | Path = "data", cache_dir: str | Path | None = DEFAULT_CACHE
) -> tuple[torch.Tensor, dict]:
    """Features (N, F) of a reference split, cached under a key of data set, split, network and hash."""
    net, record = load_feature_net(feature_net_for(data))
    key = f"{data}-{split}-{record['name']}-{record['sha256'][:16]}"
    cache = Path(cache_dir) / "reference" / f"{key}.pt" if cache_dir is not None else None
    if cache is not None and cache.is_file():
        state = torch.load(cache, map_location="cpu", weights_only=True)
        if state.get("key") == key:
            return state["features"], {**record, "cache": str(cache), "cache_hit": True}
    images, _ = reference_images(data, split, root)
    feats, _ = extract(net, images)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(cache.name + ".tmp")
        mu, sigma = feature_stats(feats)
        torch.save({"key": key, "features": feats, "mu": mu, "sigma": sigma}, tmp)
        tmp.replace(cache)
    return feats, {**record, "cache": str(cache) if cache else None, "cache_hit": False}


def inception_fid(real: torch.Tensor, fake: torch.Tensor, weights: str | Path | None = None) -> float:
    """Standard Inception FID (torchmetrics over torch-fidelity's FID Inception) on uint8 images.

    ``weights``: a local copy of the FID Inception weights (pt_inception-2015-12-05); without it the
    weights are downloaded once into torch's hub cache.
    """
    try:
        from torchmetrics.image.fid import FrechetInceptionDistance
    except ImportError as err:
        raise TinyDiTError("Inception FID needs torchmetrics and torch-fidelity: "
                           "pip install 'tinydit[inception]'; the offline metrics need neither") from err
    if weights is not None and not Path(weights).is_file():
        raise TinyDiTError(f"--inception-weights {weights} does not exist")
    try:
        fid = FrechetInceptionDistance(feature=2048, normalize=False,
                                       feature_extractor_weights_path=str(weights) if weights else None)
    except Exception as err:  # URLError / OSError when offline, RuntimeError for a wrong file
        raise TinyDiTError(
            f"the Inception weights could not be {'loaded' if weights else 'downloaded'} "
            f"({type(err).__name__}: {str(err).splitlines()[0][:120]}). Offline, pass a local copy with "
            "--inception-weights PATH, or use the offline metrics (the default)"
        ) from err

    def rgb(x: torch.Tensor) -> torch.Tensor:
        return x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x

    for i in range(0, len(real), 250):
        fid.update(rgb(real[i : i + 250]), real=True)
    for i in range(0, len(fake), 250):
        fid.update(rgb(fake[i : i + 250]), real=False)
    return float(fid.compute())


def evaluate(
    samples: np.ndarray | torch.Tensor,
    labels: np.ndarray | torch.Tensor | None,
    data: str,
    split: str = "test",
    root: str | Path = "data",
    cache_dir: str | Path | None = DEFAULT_CACHE,
    inception: bool = False,
    inception_weights: str | Path | None = None,
    kid_subsets: int = 100,
    kid_subset_size: int = 1000,
) -> dict:
    """All metrics for ``samples`` against the ``split`` of ``data``, as a flat JSON-ready dict."""
    started = time.perf_counter()
    fake = to_eval_images(samples, data)
    if fake.shape[0] < MIN_SAMPLES:
        raise TinyDiTError(f"{fake.shape[0]} samples are too few to evaluate; give at least {MIN_SAMPLES} "
                           "(FID is only comparable at equal N, 10000 is customary)")
    net, record = load_feature_net(feature_net_for(data))
    real_feats, ref_record = reference_features(data, split, root, cache_dir)
    fake_feats, preds = extract(net, fake)
    tag = record["name"]
    # precision / recall compare sets of equal size: a fixed subset of the reference when it is larger
    gen = torch.Generator().manual_seed(0)
    real_pr = real_feats[torch.randperm(len(real_feats), generator=gen)[: len(fake_feats)]]
    precision, recall = precision_recall(real_pr, fake_feats)
    kid_mean, kid_std = kid(real_feats, fake_feats, subsets=kid_subsets, subset_size=kid_subset_size)
    out = {
        f"fid_{tag}": frechet_distance(*feature_stats(real_feats), *feature_stats(fake_feats)),
        f"kid_{tag}_mean": kid_mean,
        f"kid_{tag}_std": kid_std,
        f"precision_{tag}": precision,
        f"recall_{tag}": recall,
    }
    if labels is not None:
        y = torch.as_tensor(np.asarray(labels), dtype=torch.int64)
        if y.shape != (fake.shape[0],):
            raise TinyDiTError(f"{y.shape[0]} labels for {fake.shape[0]} samples; give one label per sample")
        out[f"class_consistency_{tag}"] = (preds == y).double().mean().item()
    if inception or inception_weights:
        real_images, _ = reference_images(data, split, root)
        out["fid_inception"] = inception_fid(real_images, fake, inception_weights)
    out.update(
        n_samples=int(fake.shape[0]),
        n_reference=int(real_feats.shape[0]),
        data=data,
        split=split,
        feature_net={k: ref_record[k] for k in ("name", "sha256", "test_accuracy", "cache", "cache_hit")
                     if k in ref_record},  # fmt: skip
        eval_seconds=time.perf_counter() - started,
    )
    return out


def generate_for_eval(
    checkpoint: str | Path, n: int, steps: int, cfg_scale: float, seed: int, device: torch.device, data: str | None
) -> tuple[torch.Tensor, torch.Tensor, str, list[str], dict]:
    """n class-balanced samples from a checkpoint: images, labels, data set, classes, sampler info."""
    from tinydit.checkpoint import load_model
    from tinydit.sampling import class_cycle, generate

    if n < 1 or steps < 1 or cfg_scale < 0:
        raise TinyDiTError(f"--n ({n}) and --steps ({steps}) must be >= 1 and --cfg ({cfg_scale}) >= 0")
    model, state = load_model(checkpoint, map_location=device)
    trained_on = state["data"]["name"]
    if data is not None and data != trained_on:
        raise TinyDiTError(f"{checkpoint} was trained on {trained_on}, not {data}; drop --data")
    _spec(trained_on)
    classes = state["data"]["classes"]
    labels = class_cycle(n, len(classes))
    started = time.perf_counter()
    res = generate(model, labels, steps=steps, cfg_scale=cfg_scale, seed=seed)
    info = {"nfe_per_image": res.nfe, "generation_seconds": time.perf_counter() - started,
            "sampler": {"name": "euler", "steps": steps, "cfg": cfg_scale, "seed": seed}}  # fmt: skip
    return res.x, labels, trained_on, classes, info


def class_grid(images: torch.Tensor, labels: torch.Tensor, n_classes: int, per_class: int = 10) -> torch.Tensor | None:
    """uint8 samples -> one row per class (float [-1, 1]), or None if some class has too few samples."""
    rows = [images[labels == c][:per_class] for c in range(n_classes)]
    if any(len(r) < per_class for r in rows):
        return None
    return torch.cat(rows).float() / 127.5 - 1.0  # (n_classes * per_class, C, S, S)


def write_report(
    out_dir: Path, metrics: dict, command: str, images=None, labels=None, classes: list[str] | None = None
) -> Path:
    """metrics.json and a Markdown report (the exact command, metric table, a grid of samples per class)."""
    from tinydit.images import save_grid

    out_dir.mkdir(parents=True, exist_ok=True)
    grid_png = None
    if images is not None and labels is not None and classes:
        grid = class_grid(to_eval_images(images, metrics["data"]), torch.as_tensor(np.asarray(labels)), len(classes))
        if grid is not None:
            grid_png = out_dir / "samples_by_class.png"
            save_grid(grid, grid_png, nrow=10)
    (out_dir / "metrics.json").write_text(json.dumps({**metrics, "command": command}, indent=2) + "\n")
    rows = [f"| {k} | {v:.5g} |" if isinstance(v, float) else f"| {k} | {v} |"
            for k, v in metrics.items() if not isinstance(v, dict)]  # fmt: skip
    net = metrics.get("feature_net", {})
    lines = [
        f"# TinyDiT evaluation: {metrics['data']} ({metrics['split']} split)",
        "",
        "```",
        command,
        "```",
        "",
        "| metric | value |",
        "|---|---|",
        *rows,
        "",
        f"Offline metrics use the feature network `{net.get('name')}` (SHA-256 `{net.get('sha256', '')[:16]}...`, "
        f"test accuracy {net.get('test_accuracy', 'n/a')}); they are not Inception FID.",
    ]
    if grid_png is not None:
        lines += ["", f"Samples, one row per class ({', '.join(classes)}):", "", f"![samples]({grid_png.name})"]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
