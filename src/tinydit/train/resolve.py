"""A run's configuration resolved once: every ``None`` default of a ``TrainConfig`` filled from the data
set and the model type, and its names checked against the table of their owner (the model types and
presets in ``tinydit.models.presets``, a teacher's sampler in ``tinydit.flow.samplers``, the training
times in ``tinydit.flow.path``; the data set's name and its defaults by its record in
``tinydit.data.registry``). The architecture
switches are checked where the model's config is built (``tinydit.models.dit_config``).

``resolve(cfg)`` returns a new config and never changes ``cfg``; resolving a resolved config returns an
equal one, so a run continued from its stored config resolves to what it ran with. The resolved config is
the run's description that every later part reads: its ``data`` is the name the checkpoint records (a
built-in data set's canonical name, an image folder's absolute path, or "dataset:<class>" for a Dataset
given from Python), named here once.
"""

from __future__ import annotations

from dataclasses import replace

from torch.utils.data import Dataset

from tinydit.config import CHOICES as CONFIG_CHOICES
from tinydit.config import TrainConfig
from tinydit.data.registry import (
    DATASET_PREFIX,
    DATASETS,
    SHAPES_HOLDOUT,
    canonical_name,
    dataset_name,
    known_name,
    record_of,
)
from tinydit.errors import TinyDiTError
from tinydit.flow.meanflow import MEANFLOW_CFG
from tinydit.flow.objectives import OBJECTIVES, check_objective
from tinydit.flow.path import T_SAMPLINGS
from tinydit.flow.samplers import FIXED_STEP_SAMPLERS
from tinydit.models.presets import DEFAULT_PRESETS, MLPS, MODEL_CONDS, MODEL_PRESETS, NORMS, POSITIONS, PREDICTIONS
from tinydit.tokens import parse_phrases
from tinydit.train.repa import REPA_DEPTH, check_repa

__all__ = [
    "resolve",
    "CHOICES",
    "SHAPES_HOLDOUT",
    "NOISEWARD_SHIFT",
    "BUDGET_COOLDOWN_FRAC",
    "DEFAULT_STEPS",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_BATCH_SIZES",
    "DEFAULT_LR",
    "DEFAULT_LRS",
    "DEFAULT_REPA",
    "DEFAULT_DATA_PRESETS",
    "default_preset",
    "ALIGNED_BY_DEFAULT",
    "RESOLVED_DEFAULTS",
]

# Class runs on RGB data train on logit-normal times shifted by this towards noise, logit(t) ~ N(log 2.2, 1),
# close to JiT's N(0.8, 0.8) for x-prediction (Li & He 2025): the class decides the layout at the noisy
# end of the path, where its small signal needs the training steps. A data set's record may say otherwise
# (`DatasetRecord.t_shift`: 1 for grayscale Fashion-MNIST, whose class runs train on uniform times).
NOISEWARD_SHIFT = 2.2
# `minutes` runs let the learning rate fall over this last share of the budget unless told otherwise: a
# run that stops at its peak rate ends on noisy weights.
BUDGET_COOLDOWN_FRAC = 0.2
DEFAULT_STEPS = 2000  # a run given neither `steps` nor `minutes`
# The default batch and peak learning rate, where the data set's record gives none.
DEFAULT_BATCH_SIZE, DEFAULT_LR = 128, 1e-3
# The per-data-set values of the records, as tables ("64 on shapes") for the help and the guide.
DEFAULT_BATCH_SIZES = {r.name: r.batch_size for r in DATASETS.values() if r.batch_size is not None}
DEFAULT_LRS = {r.name: r.lr for r in DATASETS.values() if r.lr is not None}
DEFAULT_REPA = {r.name: r.repa for r in DATASETS.values() if r.repa}
DEFAULT_DATA_PRESETS = {(m, r.name, c): p for r in DATASETS.values() for m, c, p in r.presets}
# The runs that take DEFAULT_REPA when `repa` is not given: class DiTs, and the text-to-image MMDiT, whose
# captions name the kind of shape the same encoder's features lay out. The pooled-text DiT was not measured
# with it.
ALIGNED_BY_DEFAULT = {("dit", "class"), ("mmdit", "text")}
# ... of the objectives that take it (``Objective.aligned``): flow matching, and mean flows, whose one-step
# samples it made better on shapes at 5 and 15 minutes (docs/notes/few_step.md).


def default_preset(model: str, data: str, cond: str) -> str:
    """The preset a run of ``model`` on the canonical data set ``data`` with ``cond`` takes when none is named."""
    return record_of(data).preset(model, cond) or DEFAULT_PRESETS[model]


def _per_data(table: dict, other) -> str:
    """A per-data-set default in words: "64 on shapes, else 128"."""
    return ", ".join([*(f"{value:g} on {data}" for data, value in table.items()), f"else {other:g}"])


# What `resolve` fills each `None` default with, in words, for `tinydit train --help`: made from the values
# above, so the help says what a run does.
RESOLVED_DEFAULTS = {
    "holdout": "".join(f'"{r.holdout}" on {r.name} text runs, ' for r in DATASETS.values() if r.holdout) + "else none",
    "preset": "chosen per data set and model, as `tinydit presets` marks",
    "cond": ", ".join(f"{conds[0]} for {model}" for model, conds in MODEL_CONDS.items()),
    "t_sampling": "logit-normal for text runs and for class runs on RGB data, else uniform",
    "t_shift": f"{NOISEWARD_SHIFT:g} for class runs on RGB data, else 1: no shift",
    "repa": ", ".join(f"{weight:g} on {data}" for data, weight in DEFAULT_REPA.items())
    + " for class DiTs and text MMDiTs that train with flow matching or meanflow, else 0",
    "meanflow_cfg": f"{MEANFLOW_CFG:g} with `objective` meanflow",
    "batch_size": _per_data(DEFAULT_BATCH_SIZES, DEFAULT_BATCH_SIZE),
    "lr": _per_data(DEFAULT_LRS, DEFAULT_LR),
    "steps": f"{DEFAULT_STEPS} without `minutes`, else no step limit",
    "cooldown_frac": f"{BUDGET_COOLDOWN_FRAC:g} for a `minutes` run without `cooldown`, else 0: no fall",
}

# The values each TrainConfig field with a closed set takes, from its owner, for the CLI's --help (the
# architecture switches are checked where the model's config is built, tinydit.models.dit_config).
CHOICES: dict[str, tuple[str, ...]] = {
    "model": tuple(MODEL_CONDS),
    "t_sampling": T_SAMPLINGS,
    "teacher_sampler": FIXED_STEP_SAMPLERS,
    "norm": NORMS,
    "mlp": MLPS,
    "pos": POSITIONS,
    "pred": PREDICTIONS,
    "objective": tuple(OBJECTIVES),
    **CONFIG_CHOICES,
}


def resolve(cfg: TrainConfig, dataset: Dataset | None = None) -> TrainConfig:
    """``cfg`` with its defaults filled for its data set and model type, its names checked: a new config.

    ``dataset``: a Dataset object trained on instead of ``cfg.data``; the run's data is then named
    "dataset:<class>", while the per-data defaults stay those of ``cfg.data`` as given."""
    if cfg.model not in MODEL_CONDS:
        raise TinyDiTError(f"unknown `model` {cfg.model!r}: use one of {', '.join(MODEL_CONDS)}")
    if cfg.t_sampling is not None and cfg.t_sampling not in T_SAMPLINGS:
        raise TinyDiTError(f"`t_sampling` must be one of {', '.join(T_SAMPLINGS)}; got {cfg.t_sampling!r}")
    # the key of the per-data defaults below (a resolved Dataset run's name: its defaults are filled in)
    if cfg.data.startswith(DATASET_PREFIX):
        data = cfg.data
    else:  # a Dataset object trains instead: `data` only keys the defaults, so its name need not exist
        data = canonical_name(cfg.data) if dataset is not None else known_name(cfg.data)
    trained_on = data if dataset is None else dataset_name(dataset)  # what the run records
    conds = MODEL_CONDS[cfg.model]
    cond = conds[0] if cfg.cond is None else cfg.cond
    if cond not in conds:
        hint = "; use `model` dit for class labels" if cfg.model == "mmdit" else ""
        raise TinyDiTError(f"`model` {cfg.model} takes `cond` {' or '.join(conds)}, got {cond!r}{hint}")
    preset = default_preset(cfg.model, data, cond) if cfg.preset is None else cfg.preset
    if preset not in MODEL_PRESETS[cfg.model]:
        raise TinyDiTError(
            f"unknown preset {preset!r} for `model` {cfg.model}: use one of {', '.join(MODEL_PRESETS[cfg.model])}"
        )
    record = record_of(data)  # a Dataset object's run takes the defaults of `data` as given
    shift = NOISEWARD_SHIFT if record.t_shift is None else record.t_shift
    rgb_class = cond == "class" and shift != 1
    _check_img_size(cfg.img_size, trained_on, MODEL_PRESETS[cfg.model][preset]["patch_size"])
    steps = DEFAULT_STEPS if cfg.steps is None and cfg.minutes is None else cfg.steps
    cooldown_frac = cfg.cooldown_frac
    if cooldown_frac is None:
        cooldown_frac = BUDGET_COOLDOWN_FRAC if cfg.minutes is not None and not cfg.cooldown else 0.0
    objective = check_objective(replace(cfg, cond=cond))
    repa = cfg.repa  # the alignment's encoder must know the data the run really trains on
    depth = MODEL_PRESETS[cfg.model][preset]["depth"]  # the smoke-test presets are too shallow to align
    if repa is None:
        aligned = (cfg.model, cond) in ALIGNED_BY_DEFAULT and objective.aligned and depth >= REPA_DEPTH
        repa = record_of(trained_on).repa if aligned else 0.0
    check_repa(repa, trained_on, objective, depth)
    return replace(
        cfg,
        data=trained_on,
        cond=cond,
        preset=preset,
        holdout=_holdout(cfg.holdout, cond, record.holdout),
        steps=steps,
        cooldown_frac=cooldown_frac,
        # text runs: SD3's logit-normal times, which learned the captions better on shapes (the text-to-image notes)
        t_sampling=cfg.t_sampling or ("logit-normal" if cond == "text" or rgb_class else "uniform"),
        t_shift=cfg.t_shift or (shift if rgb_class else 1.0),
        batch_size=cfg.batch_size or record.batch_size or DEFAULT_BATCH_SIZE,
        lr=cfg.lr or record.lr or DEFAULT_LR,
        repa=repa,
        flip=record_of(trained_on).mirrors if cfg.flip is None else cfg.flip,
        **objective.resolved(cfg),
    )


def _check_img_size(img_size: int | None, data: str, patch_size: int) -> None:
    """An image folder trains at any multiple of the model's patch size; a built-in set at its own size."""
    if img_size is None:
        return
    if data in DATASETS:
        own = DATASETS[data].img_size
        if img_size != own:
            raise TinyDiTError(
                f"`img_size` {img_size}: {data} is {own}x{own}; drop `img_size` (it sizes image folders)"
            )
        return
    if img_size < patch_size or img_size % patch_size:
        raise TinyDiTError(
            f"`img_size` {img_size} must be a multiple of the model's patch size {patch_size} "
            f"({', '.join(str(k * patch_size) for k in (8, 12, 16))}, ...)"
        )


def _holdout(holdout: str | None, cond: str, default: str) -> str | None:
    """The held-out phrases, written out in full ("" for none) for text runs; None for class runs."""
    if cond != "text":
        if holdout not in (None, "", "none"):
            raise TinyDiTError(
                f"`holdout` {holdout!r} removes captioned combinations from a text run; "
                "add `cond` text (or `model` mmdit), or drop `holdout`"
            )
        return None
    if holdout is None:
        return default
    return ",".join(parse_phrases(holdout))
