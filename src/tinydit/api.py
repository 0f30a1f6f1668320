"""TinyDiT from Python: one function per command of the ``tinydit`` CLI, which only parses and calls these.

    train(config, dataset=None)                  -> TrainResult     tinydit train
    sample(checkpoint, n, classes | prompts)     -> Samples         tinydit sample
    evaluate(checkpoint= | samples=, out=)       -> metrics dict    tinydit eval
    sweep(checkpoint, out, samplers, steps, ...) -> rows            tinydit sweep
    presets()                                    -> rows            tinydit presets
    report(run_dir)                              -> report.html     tinydit report
    export(checkpoint, format, out)              -> the file        tinydit export
    load_model(checkpoint)                       -> (model, Checkpoint): v = model(x, t, y)
    from_pretrained(folder | checkpoint)         -> model (a pretrained folder: safetensors, no pickle)

Arguments are checked here, once, before any work; errors name the parameter in backticks.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from tinydit import distributed
from tinydit.checkpoints import checkpoint as checkpoints
from tinydit.checkpoints.pretrained import CONFIG, WEIGHTS, is_hub_id, reference_folder, rewrite_sampling
from tinydit.config import TrainConfig, check_seed
from tinydit.data.samples import check_output, load_samples, write_samples
from tinydit.data.text import tokenizer_of
from tinydit.errors import TinyDiTError
from tinydit.eval.evaluate import DEFAULT_CACHE, eval_spec, to_eval_images
from tinydit.eval.evaluate import evaluate as evaluate_images
from tinydit.eval.protocol import protocol_of
from tinydit.eval.report import headline_scores, write_report
from tinydit.eval.run_report import write_run_report
from tinydit.eval.sampling import generate_for_eval
from tinydit.eval.sweep import best_setting, check_sweep, run_sweep, sweep_rows
from tinydit.export import export as export_model
from tinydit.files import RunDirLock, ensure_writable_dir
from tinydit.flow.distill import warn_if_untrained_settings
from tinydit.flow.generate import generate, resolve_labels, resolve_prompts, sample_conditions
from tinydit.flow.grids import GRID_NAMES
from tinydit.flow.samplers import SAMPLER_NAMES
from tinydit.flow.settings import SamplingSettings
from tinydit.images import save_grid
from tinydit.models.registry import preset_rows
from tinydit.paths import check_not_shipped, check_out, read_paths
from tinydit.runtime import autocast, maybe_compile, resolve_compile, resolve_device, resolve_precision
from tinydit.schema import check_text
from tinydit.train import Trainer, TrainResult
from tinydit.train.resolve import CHOICES as TRAIN_CHOICES
from tinydit.train.resolve import DEFAULT_DATA_PRESETS
from tinydit.train.resolve import RESOLVED_DEFAULTS as TRAIN_DEFAULTS

__all__ = [
    "train",
    "sample",
    "Samples",
    "evaluate",
    "sweep",
    "presets",
    "report",
    "export",
    "load_model",
    "resolve_labels",
    "resolve_prompts",
    "sweep_rows",
    "TRAIN_CHOICES",
    "TRAIN_DEFAULTS",
    "SAMPLER_NAMES",
    "GRID_NAMES",
]


# What each name or path parameter of the commands takes, for the line that refuses a blank one.
GIVEN = {
    "checkpoint": "a checkpoint.pt, a run directory or a pretrained folder",
    "samples": "an .npz or a folder of images",
    "out": "the file or folder to write",
    "data": "a data set (shapes, fashion-mnist, cifar10) or a folder of images",
    "data_root": "the folder where data sets are kept",
    "root": "the folder where data sets are kept",
    "cache_dir": "the folder for cached reference features",
    "inception_weights": "a file of Inception weights",
    "metrics": "an evaluation's metrics.json",
    "ort_web": "the dist folder of onnxruntime-web",
    "run_dir": "a run directory",
}


def _given(**values) -> None:
    """Refuse a blank name or path by its parameter (``tinydit.schema.check_text``): an empty string is not
    "not given", and a blank path would be the current folder. None is a parameter not given."""
    for name, value in values.items():
        if isinstance(value, (str, os.PathLike)):
            check_text(value, name, GIVEN[name])


def train(
    config: TrainConfig,
    dataset: Dataset | None = None,
    val_dataset: Dataset | None = None,
    *,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = True,
) -> TrainResult:
    """Train as ``config`` says (re-running continues ``config.out``). ``dataset``: any map-style Dataset of
    (image (C, H, W) float in [-1, 1], label) to train on instead of ``config.data``; ``val_dataset``
    its validation images (default: every 20th image of ``dataset`` is held out)."""
    if overwrite and resume:
        raise TinyDiTError("`overwrite` starts afresh and `resume` insists on continuing: give one of them")
    trainer = Trainer(
        config, overwrite=overwrite, require_resume=resume, progress=progress, dataset=dataset, val_dataset=val_dataset
    )
    return trainer.fit()


def load_model(
    checkpoint: str | Path | checkpoints.Checkpoint, ema: bool = True, device: str | torch.device = "cpu"
) -> tuple[nn.Module, checkpoints.Checkpoint]:
    """The checkpoint's model (a DiT or an MMDiT; EMA weights by default) in eval mode, and its
    ``tinydit.checkpoints.checkpoint.Checkpoint`` (the run's configs, data record, sampler settings, ...)."""
    _given(checkpoint=checkpoint)
    return checkpoints.load_model(checkpoint, ema=ema, map_location=resolve_device(device))


@dataclass
class Samples:
    x: torch.Tensor  # (N, C, H, W) in [-1, 1]
    labels: torch.Tensor  # (N,) the class of each image, or the index of its prompt in ``names``
    names: list[str]  # the class names, or the prompts
    nfe: int | float  # model evaluations per image
    seconds: float  # wall time of the sampling
    path: Path | None  # where they were written, if ``out`` was given
    settings: SamplingSettings | None = None  # the sampler settings used; ``settings.note`` says why those
    device: torch.device | None = None  # where they were drawn (what `device` auto chose, where it was auto)
    # with ``trajectory``: (steps, K, C, H, W), the first K images after each step (dopri5: each accepted one)
    trajectory: torch.Tensor | None = None
    trajectory_path: Path | None = None  # where its grid was written, if ``out`` was given


def sampling_note(checkpoint: str | Path) -> str:
    """The line saying which settings sampling ``checkpoint`` uses, and why."""
    return checkpoints.load_checkpoint(checkpoint).sampling_settings().with_flags().note


def sample(
    checkpoint: str | Path,
    n: int | None = None,
    classes: list[str] | None = None,
    prompts: list[str] | None = None,
    *,
    sampler: str | None = None,
    steps: int | None = None,
    cfg_scale: float | None = None,
    seed: int = 0,
    out: str | Path | None = None,
    nrow: int | None = None,
    device: str | torch.device = "auto",
    precision: str = "auto",
    compile: str = "auto",
    ema: bool = True,
    progress: bool = False,
    unconditional: bool = False,
    trajectory: bool = False,
    **options,
) -> Samples:
    """Images from a checkpoint. Class models: ``n`` images (default 64) of ``classes`` (names or ids,
    cycled; default all). Text models: ``n`` images (default 8) of each of ``prompts`` (default the run's
    grid prompts), one grid row each. ``options``: the sampler's (grid, shift, cfg_interval, rtol, atol,
    eta). ``out``: FILE.png (a grid), FILE.npz or a folder of PNGs. ``unconditional``: images of no class
    or caption at all (the null label, the empty caption); an empty prompt is refused without it.
    ``trajectory``: also keep the first ``TRAJECTORY_IMAGES`` images after every step, and with ``out``
    write them as a grid beside it (``trajectory_path``, ``trajectory_file(out)``): a row per image, a
    column per step from the noise on the left to the image on the right (at most ``TRAJECTORY_STEPS``
    columns, evenly spaced, the last step always among them).

    Under torchrun every process samples its share of the images and rank 0 writes them (``tinydit.distributed``)."""
    _given(checkpoint=checkpoint, out=out)
    if out is not None:
        check_out(out, "samples", read_paths(checkpoint))
    check_seed(seed)
    if nrow is not None and nrow < 1:
        raise TinyDiTError(f"`nrow` must be >= 1, got {nrow}")
    if unconditional and (classes or prompts):
        raise TinyDiTError("`unconditional` draws images of no class or caption: drop `classes` and `prompts`")
    world = distributed.init(resolve_device(device))
    device = world.device(resolve_device(device))
    precision = resolve_precision(precision, device)
    model, state = checkpoints.load_model(checkpoint, ema=ema, map_location=device)
    settings = state.sampling_settings().with_flags(sampler=sampler, steps=steps, cfg_scale=cfg_scale, **options)
    out = check_output(out) if out is not None and world.main else None  # created once the checkpoint has loaded
    warn_if_untrained_settings(state.objective == "distill", settings)
    forward = maybe_compile(model, resolve_compile(compile, device))
    known = (state.data.classes, tokenizer_of(state), state.data.prompts)
    y, labels, names, nrow = sample_conditions(str(checkpoint), *known, n, classes, prompts, unconditional, nrow)
    states = []  # with ``trajectory``: the first images after every step

    def keep(i: int, t: float, x: torch.Tensor, x0: torch.Tensor) -> None:
        states.append(x[:TRAJECTORY_IMAGES].float().cpu())

    started = time.perf_counter()
    with autocast(device, precision):
        res = generate(forward, y, settings, seed, progress=progress, world=world, on_step=keep if trajectory else None)
    seconds = time.perf_counter() - started
    x = res.x.float()
    path = None
    if out is not None:
        write_samples(x, labels, out, names, nrow=nrow)
        if states:
            path = write_trajectory(torch.stack(states), trajectory_file(out))
    kept = torch.stack(states) if states else None
    return Samples(x, labels, names, res.nfe, seconds, out, settings, device, kept, path)


TRAJECTORY_IMAGES = 8  # images a trajectory keeps: its rows
TRAJECTORY_STEPS = 16  # steps its picture shows at most: its columns


def trajectory_file(out: str | Path) -> Path:
    """Where ``sample(..., out=out, trajectory=True)`` draws the trajectory: beside ``out``, named after it
    (samples.png -> samples_trajectory.png; a folder of PNGs DIR -> DIR_trajectory.png, outside the folder
    that ``evaluate`` reads)."""
    out = Path(out)
    return out.parent / f"{out.stem}_trajectory.png"


def write_trajectory(states: torch.Tensor, path: Path) -> Path:
    """states (S, K, C, H, W), K images after each of S steps -> one grid at ``path``: a row per image, a
    column per step (at most ``TRAJECTORY_STEPS``, evenly spaced, the last always)."""
    steps = len(states)
    shown = torch.linspace(0, steps - 1, min(steps, TRAJECTORY_STEPS)).round().long()  # (S',) step indices
    picked = states[shown].transpose(0, 1)  # (K, S', C, H, W): a row per image
    save_grid(picked.flatten(0, 1), path, nrow=len(shown))  # (K S', C, H, W)
    return path


def evaluate(
    checkpoint: str | Path | None = None,
    samples: str | Path | None = None,
    *,
    out: str | Path,
    data: str | None = None,
    n: int = 10_000,
    sampler: str | None = None,
    steps: int | None = None,
    cfg_scale: float | None = None,
    seed: int = 0,
    split: str = "test",
    data_root: str | Path = "data",
    device: str | torch.device = "auto",
    inception: bool = False,
    inception_weights: str | None = None,
    guidance_1: bool = True,
    cache_dir: str | Path = DEFAULT_CACHE,
    command: str | None = None,
    progress: bool = False,
    **options,
) -> dict:
    """Score ``n`` samples drawn from ``checkpoint``, or the images in ``samples`` (an .npz or a folder,
    with ``data`` naming the reference), with the offline metrics; writes ``out``/metrics.json and
    report.md (``command`` is recorded in both) and returns the metrics.

    A guided evaluation (guidance scale not 1) also draws ``n`` samples from the same noise at guidance 1,
    the model alone, and reports their scores beside its own under ``guidance_1`` (``guidance_1=False``
    skips them): how much of a score the guidance makes.

    Under torchrun the processes share the sampling and rank 0 alone scores and writes; the others
    return an empty dict."""
    if (checkpoint is None) == (samples is None):
        raise TinyDiTError("give one of `checkpoint` (to sample and score) or `samples` (to score existing images)")
    _given(checkpoint=checkpoint, samples=samples, out=out, data=data, data_root=data_root, cache_dir=cache_dir)
    _given(inception_weights=inception_weights)
    data_folder = data if data is not None and Path(data).is_dir() else None
    check_out(out, "evaluation", read_paths(checkpoint, samples, data_folder, inception_weights))
    check_seed(seed)
    if (checkpoint or samples) and not Path(checkpoint or samples).exists():
        raise TinyDiTError(
            f"{checkpoint or samples} does not exist; pass a checkpoint.pt, or samples as an .npz or a folder of images"
        )
    extra: dict = {"nfe_per_image": None, "generation_seconds": None, "precision": None}  # images from a file
    world = distributed.init(resolve_device(device))
    plain = None  # the samples at guidance 1, beside a guided evaluation's
    if checkpoint is not None:
        state = checkpoints.load_checkpoint(checkpoint)
        settings = state.sampling_settings().with_flags(sampler=sampler, steps=steps, cfg_scale=cfg_scale, **options)
        dev = world.device(resolve_device(device))
        images, labels, spec, classes, extra = generate_for_eval(
            state, n, settings, seed, dev, data, progress=progress, world=world
        )
        extra["sampler_note"] = settings.note
        if guidance_1 and settings.cfg_scale != 1:  # every rank samples, as for the guided set
            plain = generate_for_eval(
                state, n, settings.with_flags(cfg_scale=1.0), seed, dev, data, progress=progress, world=world
            )
    if not world.main:  # rank 0 alone scores and writes
        return {}
    if checkpoint is None:
        if not data:
            raise TinyDiTError("`samples` needs `data` (fashion-mnist, shapes, cifar10 or a folder) for the reference")
        spec = eval_spec(data)  # the reference's name made canonical, once
        classes = list(spec.classes)
        images, labels = load_samples(samples, classes)
        if spec.img_size is not None:  # an image folder is compared at the samples' own size
            spec = eval_spec(spec.data, img_size=int(max(images.shape[-2:])))
    images = to_eval_images(images, spec)  # once: uint8 at the evaluation size, for the metrics and the report
    nets = dict(inception=inception, inception_weights=inception_weights)
    metrics = evaluate_images(images, labels, spec, split=split, root=data_root, cache_dir=cache_dir, **nets)
    metrics.update(extra)
    if plain is not None:
        x1, labels1, _, _, extra1 = plain
        scores = evaluate_images(
            to_eval_images(x1, spec), labels1, spec, split=split, root=data_root, cache_dir=cache_dir, **nets
        )
        metrics["guidance_1"] = {**headline_scores({**scores, **extra1}), "nfe_per_image": extra1["nfe_per_image"]}
    metrics["protocol"] = protocol_of(metrics)  # what the numbers compare with: the same protocol only
    out = ensure_writable_dir(out)  # created only now: a bad input leaves no empty folder behind
    write_report(out, metrics, command or "", images, labels, classes)
    return metrics


def sweep(
    checkpoint: str | Path,
    out: str | Path,
    samplers=("euler", "heun"),
    steps=(4, 8, 16, 32),
    cfg_scales=(1.0, 2.0),
    tols=(1e-2, 1e-3),
    *,
    device: str | torch.device = "auto",
    apply: bool = False,
    max_nfe: float = 20,
    **kwargs,
) -> list[dict]:
    """Quality against model evaluations for every sampler x steps x guidance combination
    (``tinydit.eval.sweep``); writes sweep.csv, sweep.md, sweep.json and sweep.png into ``out``. With
    ``apply``, the best setting within ``max_nfe`` evaluations per image becomes the checkpoint's record."""
    _given(checkpoint=checkpoint, out=out, root=kwargs.get("root"), cache_dir=kwargs.get("cache_dir"))
    check_seed(kwargs.get("seed", 0))
    if not (math.isfinite(max_nfe) and max_nfe >= 1):
        raise TinyDiTError(f"`max_nfe` must be a number >= 1, got {max_nfe}")
    check_out(out, "sweep", read_paths(checkpoint))
    # Where `apply` will record, checked and locked before the first sample (a run that started training now
    # would write its own record back over it), once every setting is known good: a refused sweep takes no lock.
    lists = dict(samplers=list(samplers), steps=list(steps), cfg_scales=list(cfg_scales), tols=list(tols))
    check_sweep(**lists, **{k: kwargs[k] for k in ("n", "batch_size", "grid", "shift", "cfg_interval") if k in kwargs})
    target = sampling_target(checkpoint) if apply else None
    lock = RunDirLock(target if target.is_dir() else target.parent).acquire() if apply else None
    try:
        rows = run_sweep(checkpoint, out, **lists, device=resolve_device(device), **kwargs)
        if apply:
            best = best_setting(rows, max_nfe, kwargs.get("n", 1000), kwargs.get("seed", 0))
            _write_sampling(target, best)
    finally:
        if lock is not None:
            lock.release()
    return rows


def sampling_target(checkpoint: str | Path) -> Path:
    """What recording sampler settings into ``checkpoint`` rewrites, in the checkpoint's own format: a
    checkpoint.pt (a run directory's), or a pretrained folder (its config.json and model card; never its
    weights). Refuses, naming the reason, a shipped model, a Hub id (its files are a download cache's),
    and a file or folder that cannot be written."""
    path = Path(checkpoint)
    if path.is_file() and path.name in (CONFIG, WEIGHTS):
        path = path.parent
    if path.is_dir():
        if (path / "checkpoint.pt").is_file():
            path = path / "checkpoint.pt"
        elif not (path / WEIGHTS).is_file():
            raise TinyDiTError(f"`checkpoint` {checkpoint} is neither a run directory nor a pretrained folder")
    elif not path.is_file():
        hub = "; a Hub model is read from a download cache, which is not to be edited: copy it into a folder first"
        raise TinyDiTError(
            f"`checkpoint` {checkpoint} does not exist here, and `apply` records into a checkpoint on this machine"
            + (hub if is_hub_id(str(checkpoint)) else "")
        )
    check_not_shipped(path, "checkpoint", "copy the folder and apply to the copy")
    folder = path if path.is_dir() else path.parent
    if not all(os.access(p, os.W_OK) for p in (path, folder)):
        raise TinyDiTError(f"`checkpoint` {checkpoint} is not writable, so `apply` cannot record into it")
    return path


def record_sampling(checkpoint: str | Path, settings: SamplingSettings) -> None:
    """Write ``settings`` as the checkpoint's sampler settings, in its own format (``sampling_target``),
    atomically; everything else stays as it was. A run that is training is refused (its next save would
    write its own record back)."""
    target = sampling_target(checkpoint)
    lock = RunDirLock(target if target.is_dir() else target.parent).acquire()
    try:
        _write_sampling(target, settings)
    finally:
        lock.release()


def _write_sampling(target: Path, settings: SamplingSettings) -> None:
    if target.is_dir():
        rewrite_sampling(target, settings.to_json())
    else:
        state = checkpoints.load_checkpoint(target)
        dataclasses.replace(state, sampling=settings.to_json()).save(target)


def export(
    checkpoint: str | Path,
    format: str,
    out: str | Path,
    ema: bool = True,
    ort_web: str | Path | None = None,
    dtype: str = "float32",
    metrics: str | Path | None = None,
    about: str | None = None,
    overwrite: bool = False,
) -> Path:
    """The checkpoint's velocity model as a pretrained safetensors folder, ONNX, a torch.export program, or a
    web page (``tinydit.export``); an earlier export at ``out`` is replaced only with ``overwrite``."""
    _given(checkpoint=checkpoint, out=out, ort_web=ort_web, metrics=metrics)
    options = dict(ema=ema, ort_web=ort_web, dtype=dtype, metrics=metrics, about=about, overwrite=overwrite)
    return export_model(checkpoint, format, out, **options)


def pretrained(name: str) -> Path:
    """The folder of a reference model shipped in the package (``tinydit sample --pretrained NAME``)."""
    return reference_folder(name)


def from_pretrained(path: str | Path, ema: bool = True, device: str | torch.device = "cpu") -> nn.Module:
    """The model of a pretrained folder (``tinydit export --format safetensors``), of its Hub id (owner/name,
    with ``huggingface_hub`` and a network), of a training checkpoint or of a run directory, in eval mode.
    Folders are read without unpickling (safetensors and JSON)."""
    return load_model(path, ema=ema, device=device)[0]


def presets() -> list[dict]:
    """Every model preset with its size (``tinydit.models.registry.preset_rows``); ``default_on``: the data
    sets whose runs of that model default to it (their records, ``tinydit.data.registry``)."""
    return [
        {
            **row,
            "default_on": sorted(
                d for (m, d, _), p in DEFAULT_DATA_PRESETS.items() if (m, p) == (row["model"], row["preset"])
            ),
        }
        for row in preset_rows()
    ]


def report(run_dir: str | Path) -> Path:
    """Write ``run_dir``/report.html (``tinydit.eval.run_report``): one self-contained page of the run."""
    _given(run_dir=run_dir)
    return write_run_report(run_dir)
