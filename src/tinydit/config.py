"""The configurations, and the names each option accepts: typed dataclasses, validated on construction.

A leaf of the package: it imports nothing that builds a model or reads data, so every layer can use it.

* ``TrainConfig``: one training run. The resolved config (this and the model's ``DiTConfig``) is
  written to ``RUN_DIR/config.json`` and into every checkpoint. The ``tinydit train`` flags are made
  from its fields and the comment beside each (``tinydit.cli``): a new option is one new field.
* the preset tables of the model types (``MODEL_PRESETS``; the model classes are in ``tinydit.models``)
* ``check_sampler_args``: the sampler settings every sampling entry point accepts
* ``recommended_sampling``: the sampler settings a new checkpoint records, measured ones read from
  ``sampling_records.json`` beside this module

Errors name the parameter in backticks (`steps`); the CLI prints the flag in its place (--steps).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from tinydit.errors import TinyDiTError
from tinydit.runtime import COMPILE, PRECISIONS
from tinydit.tokens import parse_phrases

__all__ = ["TrainConfig", "CHOICES", "TRAJECTORY_FIELDS", "SHAPES_HOLDOUT", "FEW_STEP", "MODEL_CONDS", "MODEL_PRESETS",
           "DEFAULT_PRESETS", "DEFAULT_DATA_PRESETS", "DEFAULT_BATCH_SIZES", "DEFAULT_LRS", "SAMPLER_NAMES",
           "GRID_NAMES", "T_SAMPLINGS", "KNOTS", "BUILTIN_DATASETS",
           "canonical_name", "check_sampler_args", "check_seed"]  # fmt: skip

# Caption combinations a shapes text run never sees unless told otherwise (`holdout`): prompt adherence
# on them measures compositional generalisation (tinydit.eval.adherence).
SHAPES_HOLDOUT = "red triangle,blue circle"

PRECISION_CHOICES = ("auto", *PRECISIONS)  # auto: the fastest measured on the device (tinydit.runtime)
FEW_STEP = ("none", "shortcut", "distill")  # see TrainConfig.few_step
EVAL_BUDGETS = ("outside", "inside")  # see TrainConfig.eval_budget
T_SAMPLINGS = ("uniform", "logit-normal")  # how training times are drawn (tinydit.flow.path.sample_t)
# A time-budget run measures its rate once this share of its budget has passed in the process (compiling,
# caching and the first grid come before; the rate is steady by then); its cool-down must start after that.
PLAN_AT = 0.1
# Class runs on RGB data train on logit-normal times shifted by this towards noise, logit(t) ~ N(log 2.2, 1),
# close to JiT's N(0.8, 0.8) for x-prediction (Li & He 2025): the class decides the layout at the noisy
# end of the path, where its small signal needs the training steps.
NOISEWARD_SHIFT = 2.2
MAX_COOLDOWN_FRAC = 0.8
# `minutes` runs let the learning rate fall over this last share of the budget unless told otherwise: a
# run that stops at its peak rate ends on noisy weights.
BUDGET_COOLDOWN_FRAC = 0.2
# The default batch per data set, else 128: shapes gains more from more, smaller steps than from a larger batch.
DEFAULT_BATCH_SIZES = {"shapes": 64}
# The default peak learning rate per data set, else 1e-3; shapes at batch 64 takes 2e-3, its edge of stability.
DEFAULT_LRS = {"shapes": 2e-3}
KNOTS = 8  # distillation: the teacher's path is kept at t = 0, 1/8, ..., 1 (tinydit.flow.distill)

# The architecture switches of DiTConfig (tinydit.models.dit) and the values each takes.
NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")
POSITIONS = ("sincos", "rope")
PREDICTIONS = ("v", "x")
CONDS = ("class", "text")  # class: y is a label (N,) | text: y is caption token ids (N, L)

# The model types, the conditionings each takes (the default first) and their presets. The classes behind
# the names are registered in tinydit.models.registry (a test checks that the two agree).
MODEL_CONDS: dict[str, tuple[str, ...]] = {"dit": CONDS, "mmdit": ("text",)}

# Presets fix the trunk (width, depth, heads, patch). Names carry the real parameter count, measured
# for 32x32 RGB with 10 classes (tests/test_model.py checks each name against count_params).
DIT_PRESETS: dict[str, dict] = {
    # pred="auto": the network predicts the clean image (x, JiT) on RGB data and the velocity (v) on
    # grayscale. A 3-channel patch holds more noise than a narrow token can carry, which x-prediction
    # avoids; 1-channel patches have no such bottleneck, and there x did worse. Old checkpoints (no field)
    # load as v.
    "dit-0.2m": dict(dim=64, depth=2, n_heads=2, patch_size=4, pred="auto"),  # smoke tests: seconds per run
    # dit-1.9m two blocks shallower: in a few CPU minutes the shapes' layout gains more from the extra
    # steps than from the depth (two blocks fewer again drew worse shapes).
    "dit-1.3m": dict(dim=128, depth=4, n_heads=4, patch_size=4, mlp="swiglu", pred="auto"),
    # dit-1.3m with pixel-level convolutions around the trunk (a 3x3 stem before the patches, a 3x3 head
    # after them, so neighbouring patches agree on an edge), U-ViT's long skips and QK-norm: the shapes
    # quick start's (DEFAULT_DATA_PRESETS).
    "dit-1.4m": dict(dim=128, depth=4, n_heads=4, patch_size=4, mlp="swiglu", qk_norm=True, stem="conv", head="conv",
                     skips=True, pred="auto"),
    # The CPU preset: minutes per run. SwiGLU is its one switch that won the equal-time ablation on
    # Fashion-MNIST; RMSNorm, QK-norm and RoPE each scored worse there and stay off.
    "dit-1.9m": dict(dim=128, depth=6, n_heads=4, patch_size=4, mlp="swiglu", pred="auto"),
    "dit-9.8m": dict(dim=256, depth=8, n_heads=4, patch_size=4, pred="auto"),  # a longer CPU run, or a GPU
    "dit-32m": dict(dim=384, depth=12, n_heads=6, patch_size=2, pred="auto"),  # GPU: 256 tokens per 32x32 image
}

# Names carry the real parameter count, measured for 32x32 RGB shapes with its caption tokenizer (16 ids,
# L = 8; tests/test_mmdit.py checks each). A joint block holds the weights of two DiT blocks, so
# mmdit-2.3m (2 joint + 2 single-stream blocks) has exactly the parameters of dit-1.9m with the same
# text encoder (2,318,384 each): the pair benchmarks/text_to_image.py compares. mmdit-2.1m is SD3's
# all-joint trunk, one block shorter.
MMDIT_PRESETS: dict[str, dict] = {
    "mmdit-0.2m": dict(dim=64, depth=1, n_heads=2, patch_size=4, text_depth=1, pred="auto"),  # smoke tests
    "mmdit-2.1m": dict(dim=128, depth=3, n_heads=4, patch_size=4, mlp="swiglu", text_depth=2, pred="auto"),
    "mmdit-2.3m": dict(
        dim=128, depth=2, single_blocks=2, n_heads=4, patch_size=4, mlp="swiglu", text_depth=2, pred="auto"
    ),
}

MODEL_PRESETS: dict[str, dict[str, dict]] = {"dit": DIT_PRESETS, "mmdit": MMDIT_PRESETS}
DEFAULT_PRESETS: dict[str, str] = {"dit": "dit-1.9m", "mmdit": "mmdit-2.3m"}
# The default preset of a (model, data set, conditioning), else DEFAULT_PRESETS. Shapes class runs take the
# small model with pixel convolutions: their layout gains more from steps than from depth, and the
# convolutions let neighbouring patches agree on an edge.
DEFAULT_DATA_PRESETS: dict[tuple[str, str, str], str] = {("dit", "shapes", "class"): "dit-1.4m"}

# The built-in data sets and the spellings accepted for them; anything else is an image folder's path.
BUILTIN_DATASETS = ("shapes", "fashion-mnist", "cifar10")
_DATA_ALIASES = {"fashion-mnist": "fashion-mnist", "fashionmnist": "fashion-mnist", "fmnist": "fashion-mnist",
                 "cifar10": "cifar10", "cifar-10": "cifar10", "shapes": "shapes"}  # fmt: skip


def check_seed(seed: int) -> None:
    """A seed torch's generators take: an integer of at most 63 bits."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not -(2**63) <= seed < 2**63:
        raise TinyDiTError(f"`seed` must be an integer between -2**63 and 2**63 - 1, got {seed!r}")


def canonical_name(name: str) -> str:
    """A built-in data set's canonical name, or the absolute path of an image folder."""
    key = name.lower().replace("_", "-")
    return _DATA_ALIASES.get(key) or str(Path(name).expanduser().resolve())


# The samplers (tinydit.flow.samplers.SAMPLERS holds the functions) and the time grids (tinydit.flow.grids).
SAMPLER_NAMES = ("euler", "heun", "midpoint", "dopri5", "ancestral", "heun-first")
GRID_NAMES = ("uniform", "shifted")
FIXED_STEP_SAMPLERS = ("euler", "heun", "midpoint")  # those that can record a path (distillation's teacher)


def check_sampler_args(
    steps: int,
    cfg_scale: float,
    sampler: str = "euler",
    grid: str = "uniform",
    shift: float | None = None,
    cfg_interval: tuple[float, float] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    eta: float | None = None,
) -> None:
    """Raise TinyDiTError for any setting a sampler cannot run with (before any work is done)."""
    if sampler not in SAMPLER_NAMES:
        raise TinyDiTError(f"unknown sampler {sampler!r}: use one of {', '.join(SAMPLER_NAMES)}")
    if steps < 1:
        raise TinyDiTError(f"`steps` must be >= 1, got {steps}")
    if not (math.isfinite(cfg_scale) and cfg_scale >= 0):  # also refuses NaN and inf
        raise TinyDiTError(f"`cfg_scale` (the guidance scale) must be >= 0, 1 = off, and finite; got {cfg_scale}")
    if grid not in GRID_NAMES:
        raise TinyDiTError(f"unknown time grid {grid!r}: use one of {', '.join(GRID_NAMES)}")
    if shift is not None and grid != "shifted":
        raise TinyDiTError(f"`shift` applies to the shifted grid only; add `grid` shifted (got `grid` {grid})")
    if shift is not None and not (math.isfinite(shift) and shift > 0):
        raise TinyDiTError(f"`shift` must be a positive number (1 = uniform, SD3 uses 3), got {shift}")
    if cfg_interval is not None:
        lo, hi = (float(v) for v in cfg_interval)
        if not 0 <= lo <= hi <= 1:
            raise TinyDiTError(f"`cfg_interval` LO HI needs 0 <= LO <= HI <= 1 (times, 1 = noise), got {lo} {hi}")
    for name, tol in (("rtol", rtol), ("atol", atol)):
        if tol is not None and sampler != "dopri5":
            raise TinyDiTError(f"`{name}` applies to the adaptive sampler only; add `sampler` dopri5")
        if tol is not None and not (math.isfinite(tol) and tol > 0):
            raise TinyDiTError(f"`{name}` must be a positive number such as 1e-3, got {tol}")
    if eta is not None and sampler != "ancestral":
        raise TinyDiTError("`eta` applies to the stochastic sampler only; add `sampler` ancestral")
    if eta is not None and not 0 <= eta <= 1:
        raise TinyDiTError(f"`eta` must be in [0, 1] (0: deterministic, as Euler; 1: DDPM's noise), got {eta}")


# Fields that change what a run computes. A run directory can only be continued with the same values;
# everything else (steps, minutes, logging intervals, device) may change between invocations.
TRAJECTORY_FIELDS = (
    "data", "classes", "preset", "batch_size", "lr", "warmup", "cooldown_frac", "weight_decay", "grad_clip",
    "ema_decay", "class_dropout", "seed", "limit", "t_sampling", "t_shift", "norm", "qk_norm", "mlp", "pos", "pred",
    "few_step", "model", "cond", "holdout", "teacher", "teacher_sampler", "teacher_steps", "teacher_cfg",
    "teacher_cfg_interval", "distill_paths",
)  # fmt: skip


# The values each TrainConfig field with a closed set of values takes: checked here, listed by the CLI's --help.
CHOICES: dict[str, tuple[str, ...]] = {
    "model": tuple(MODEL_CONDS), "cond": CONDS, "t_sampling": T_SAMPLINGS, "few_step": FEW_STEP,
    "teacher_sampler": FIXED_STEP_SAMPLERS, "precision": PRECISION_CHOICES, "compile": COMPILE, "norm": NORMS,
    "mlp": MLPS, "pos": POSITIONS, "pred": PREDICTIONS, "eval_budget": EVAL_BUDGETS,
}  # fmt: skip


@dataclass
class TrainConfig:
    out: str = "runs/shapes"  # run directory: config.json, metrics.jsonl, checkpoint.pt, samples/
    data: str = "shapes"  # shapes | fashion-mnist | cifar10 | path of an image folder
    data_root: str = "data"  # where downloadable data sets are looked for and stored
    limit: int | None = None  # use only the first `limit` training images (quick runs)
    classes: str | None = None  # train on these classes only: names or ids, comma-separated (automobile,truck)
    model: str = "dit"  # dit | mmdit (tinydit.models.mmdit: image and text streams with joint attention)
    preset: str | None = None  # model size, see `tinydit presets`; None: DEFAULT_DATA_PRESETS, else the model's
    cond: str | None = None  # class | text (the captions, tinydit.data.text); None: class for dit, text for mmdit
    # Text runs: comma-separated caption phrases ("red triangle"); every training image whose caption holds
    # one is removed, so the model never sees that combination. None: SHAPES_HOLDOUT for shapes, else none.
    holdout: str | None = None
    norm: str | None = None  # layernorm | rmsnorm; None here and in the four below keeps the preset's choice
    qk_norm: bool | None = None  # RMS-normalise queries and keys per head
    mlp: str | None = None  # gelu | swiglu (gated SiLU at the same parameter count)
    pos: str | None = None  # sincos (absolute, added to the tokens) | rope (2-D rotary, inside attention)
    pred: str | None = None  # v | x: what the network outputs (see DiTConfig.pred); None keeps the preset's
    steps: int | None = None  # stop after this many optimizer steps ...
    minutes: float | None = None  # ... or after this much training wall time, whichever comes first
    # Images per optimizer step (the global batch). None: DEFAULT_BATCH_SIZES for the data, else 128.
    batch_size: int | None = None
    # AdamW peak learning rate (constant after warm-up, as in DiT). None: DEFAULT_LRS for the data, else 1e-3.
    lr: float | None = None
    warmup: int = 100  # linear learning-rate warm-up, in steps
    # Linear decay of the learning rate to 0 over the last ``cooldown`` steps of a `steps` run
    # (warmup-stable-decay). A run can be continued with other `steps`/`cooldown` until its decay starts.
    cooldown: int = 0
    # `minutes` runs: the learning rate falls linearly to 0 over this last share of the time budget. The
    # step count is planned when the fall must begin, from the rate measured since PLAN_AT of the budget,
    # and kept in the checkpoint, so a continuation follows the same schedule to the step. None:
    # BUDGET_COOLDOWN_FRAC (0.2) for a `minutes` run without `cooldown`, else 0 (off).
    cooldown_frac: float | None = None
    weight_decay: float = 0.0  # AdamW weight decay (DiT uses none)
    grad_clip: float = 1.0  # clip the global gradient norm to this (0 = off)
    ema_decay: float = 0.999  # EMA of the weights used for sampling; warmed up as min(d, (1+s)/(10+s))
    class_dropout: float = 0.1  # probability of the null label (text: the empty caption), for guidance
    # Training times: uniform | logit-normal (SD3). None: logit-normal for text runs (it raised MMDiT's
    # all-attribute accuracy on shapes) and for class runs on RGB data, whose presets predict x (then also
    # shifted towards noise, see `t_shift`); uniform on Fashion-MNIST.
    t_sampling: str | None = None
    # none | shortcut: also train the model to take large steps (tinydit.flow.shortcut) | distill: train a
    # few-step student on the paths of a trained model, ``teacher`` (tinydit.flow.distill)
    few_step: str = "none"
    teacher: str | None = None  # distill: the teacher's checkpoint.pt
    teacher_sampler: str = "heun"  # distill: how the teacher samples its paths (euler | heun | midpoint) ...
    teacher_steps: int = 8  # ... in this many uniform steps (a multiple of tinydit.flow.distill.KNOTS) ...
    teacher_cfg: float = 3.0  # ... with this guidance scale ...
    teacher_cfg_interval: tuple[float, float] = (0.1, 0.8)  # ... for t in this interval, which taught students best
    distill_paths: int = 40_000  # distill: how many teacher paths the student trains on
    # > 1 moves training times towards noise: t' = s t / (1 + (s - 1) t). None: NOISEWARD_SHIFT for class
    # runs on RGB data (x-prediction trains where the layout is decided, as JiT does), else 1.
    t_shift: float | None = None
    seed: int = 0  # the one seed behind data order, flips, times, noise and initial weights
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    precision: str = "auto"  # auto | fp32 | bf16 | fp16 (CUDA only); auto = fastest measured on the device
    # auto | on | off: torch.compile the training and sampling forward passes. auto: on CUDA, and on a CPU for
    # a `minutes` run of at least 10 minutes (tinydit.runtime.COMPILE_CPU_MINUTES) with a C++ compiler
    compile: str = "auto"
    log_every: int = 50  # steps between lines in metrics.jsonl
    val_every: int = 250  # steps between validation losses on the fixed held-out batch
    val_size: int = 512  # held-out images used for the validation loss
    sample_every: int = 500  # steps between sample grids (samples/step_NNNNNN.png)
    ckpt_every: int = 500  # steps between checkpoints (always one at the end, and on Ctrl-C)
    sample_steps: int | None = None  # sample grids: Euler steps; None (with `sample_cfg`): the recorded sampler
    sample_cfg: float | None = None  # sample grids: guidance scale; None: the recorded one (what `tinydit sample` uses)
    # Evaluation during training: every `eval_every` steps (0: never) and at the end, `eval_n` class-balanced
    # EMA samples (the recorded sampler settings) scored with the offline metrics (tinydit.eval), into
    # metrics.jsonl; the best by `best_metric` is kept as best.pt.
    eval_every: int = 0
    eval_n: int = 500  # samples per evaluation: more is less noisy and slower
    eval_budget: str = "outside"  # outside | inside: whether evaluation time counts toward `minutes`
    best_metric: str = "auto"  # auto: fid_<feature net> (shapes text runs: adherence_all_all); fid/kid: lower is better
    tensorboard: bool = False  # also write the metrics and sample grids for TensorBoard into RUN_DIR/tensorboard
    report: bool = True  # write RUN_DIR/report.html at the end of the run (tinydit report RUN_DIR)

    def __post_init__(self):
        for f in fields(self):  # every number finite: NaN passes every comparison below, and inf never ends
            values = getattr(self, f.name)
            for v in values if isinstance(values, (tuple, list)) else (values,):
                if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v):
                    raise TinyDiTError(f"`{f.name}` must be a finite number, got {v}")
        check_seed(self.seed)
        if self.model not in MODEL_CONDS:
            raise TinyDiTError(f"unknown `model` {self.model!r}: use one of {', '.join(MODEL_CONDS)}")
        presets, conds = MODEL_PRESETS[self.model], MODEL_CONDS[self.model]
        data = canonical_name(self.data)  # the key of the per-data defaults below
        if self.cond is None:
            self.cond = conds[0]
        if self.cond not in conds:
            hint = "; use `model` dit for class labels" if self.model == "mmdit" else ""
            raise TinyDiTError(f"`model` {self.model} takes `cond` {' or '.join(conds)}, got {self.cond!r}{hint}")
        if self.preset is None:
            key = (self.model, data, self.cond)
            self.preset = DEFAULT_DATA_PRESETS.get(key, DEFAULT_PRESETS[self.model])
        if self.preset not in presets:
            raise TinyDiTError(f"unknown preset {self.preset!r} for `model` {self.model}: use one of "
                               f"{', '.join(presets)}")  # fmt: skip
        self.holdout = self._resolve_holdout()
        rgb_class = self.cond == "class" and data != "fashion-mnist"
        if self.t_sampling is None:
            self.t_sampling = "logit-normal" if self.cond == "text" or rgb_class else "uniform"
        if self.t_shift is None:
            self.t_shift = NOISEWARD_SHIFT if rgb_class else 1.0
        if self.batch_size is None:
            self.batch_size = DEFAULT_BATCH_SIZES.get(data, 128)
        if self.lr is None:
            self.lr = DEFAULT_LRS.get(data, 1e-3)
        if self.steps is None and self.minutes is None:
            self.steps = 2000
        if self.steps is not None and self.steps < 1:
            raise TinyDiTError(f"`steps` must be >= 1, got {self.steps}")
        if self.minutes is not None and self.minutes <= 0:
            raise TinyDiTError(f"`minutes` must be > 0, got {self.minutes}")
        for name in ("batch_size", "log_every", "val_every", "val_size", "sample_every", "ckpt_every", "sample_steps"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise TinyDiTError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.classes is not None and not [c for c in self.classes.split(",") if c.strip()]:
            raise TinyDiTError(f"`classes` {self.classes!r} names no class: give names or ids, comma-separated")
        if self.limit is not None and self.limit < 1:
            raise TinyDiTError(f"`limit` must be >= 1, got {self.limit}")
        if self.lr <= 0:
            raise TinyDiTError(f"`lr` must be > 0, got {self.lr}")
        if self.warmup < 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise TinyDiTError("warmup, weight_decay and grad_clip must be >= 0")
        if self.cooldown < 0:
            raise TinyDiTError(f"`cooldown` must be >= 0, got {self.cooldown}")
        if self.cooldown and (self.steps is None or self.cooldown > self.steps):
            raise TinyDiTError(f"`cooldown` {self.cooldown} is a fall over the last {self.cooldown} of `steps`: give "
                               f"`steps` of at least {self.cooldown} (got {self.steps or 'none'})")  # fmt: skip
        if self.cooldown_frac is None:
            self.cooldown_frac = BUDGET_COOLDOWN_FRAC if self.minutes is not None and not self.cooldown else 0.0
        if not 0 <= self.cooldown_frac <= MAX_COOLDOWN_FRAC:
            raise TinyDiTError(f"`cooldown_frac` must be in [0, {MAX_COOLDOWN_FRAC}] (a share of the time budget), "
                               f"got {self.cooldown_frac}")  # fmt: skip
        if self.cooldown_frac and self.minutes is None:
            raise TinyDiTError("`cooldown_frac` is a share of a time budget: give `minutes` (or use `cooldown` with "
                               "`steps`)")  # fmt: skip
        if self.cooldown_frac and self.cooldown:
            raise TinyDiTError("give one cool-down: `cooldown` (steps, for a `steps` run) or `cooldown_frac` (a share "
                               "of `minutes`)")  # fmt: skip
        if not 0 <= self.ema_decay < 1:
            raise TinyDiTError(f"ema_decay must be in [0, 1), got {self.ema_decay}")
        if not 0 <= self.class_dropout < 1:
            raise TinyDiTError(f"class_dropout must be in [0, 1), got {self.class_dropout}")
        self._check_distill()
        if self.t_shift <= 0:
            raise TinyDiTError(f"`t_shift` must be > 0, got {self.t_shift}")
        for name in ("t_sampling", "few_step", "precision", "compile", "eval_budget"):
            if getattr(self, name) not in CHOICES[name]:
                raise TinyDiTError(f"`{name}` must be one of {', '.join(CHOICES[name])}; got {getattr(self, name)!r}")
        if self.eval_every < 0 or self.eval_n < 10:
            raise TinyDiTError(f"`eval_every` must be >= 0 and `eval_n` >= 10, got {self.eval_every} and {self.eval_n}")
        if self.sample_cfg is not None and self.sample_cfg < 0:
            raise TinyDiTError(f"sample_cfg (guidance scale) must be >= 0, got {self.sample_cfg}")

    def _check_distill(self) -> None:
        self.teacher_cfg_interval = tuple(float(v) for v in self.teacher_cfg_interval)
        if self.few_step != "distill":
            if self.teacher is not None:
                raise TinyDiTError("`teacher` is only used with `few_step` distill; add it or drop `teacher`")
            return
        if self.teacher is None:
            raise TinyDiTError("`few_step` distill learns from a trained model: pass its checkpoint.pt with `teacher`")
        if self.teacher_sampler not in FIXED_STEP_SAMPLERS:
            raise TinyDiTError(f"`teacher_sampler` must be {', '.join(FIXED_STEP_SAMPLERS)}, "
                               f"got {self.teacher_sampler!r}")  # fmt: skip
        if self.teacher_steps < 1 or self.teacher_steps % KNOTS:
            raise TinyDiTError(f"`teacher_steps` must be a positive multiple of {KNOTS} (the teacher's path is "
                               f"kept at t = k/{KNOTS}), got {self.teacher_steps}")  # fmt: skip
        check_sampler_args(self.teacher_steps, self.teacher_cfg, self.teacher_sampler,
                           cfg_interval=self.teacher_cfg_interval)  # fmt: skip
        if self.distill_paths < 1:
            raise TinyDiTError(f"`distill_paths` must be >= 1, got {self.distill_paths}")
        if self.cond != "class":
            raise TinyDiTError("`few_step` distill works with class-conditional models for now; drop `cond` text")
        if self.arch_overrides():
            raise TinyDiTError(f"the student copies the teacher's architecture; drop "
                               f"{', '.join('`' + k + '`' for k in self.arch_overrides())}")  # fmt: skip

    def _resolve_holdout(self) -> str | None:
        """The held-out phrases, written out in full ("" for none) for text runs; None for class runs."""
        if self.cond != "text":
            if self.holdout not in (None, "", "none"):
                raise TinyDiTError(f"`holdout` {self.holdout!r} removes captioned combinations from a text run; "
                                   "add `cond` text (or `model` mmdit), or drop `holdout`")  # fmt: skip
            return None
        if self.holdout is None:
            return SHAPES_HOLDOUT if canonical_name(self.data) == "shapes" else ""
        return ",".join(parse_phrases(self.holdout))

    def cooldown_start(self) -> float:
        """The step where the learning rate starts to fall (inf without a cool-down)."""
        return self.steps - self.cooldown if self.cooldown else math.inf

    def held_out_phrases(self) -> tuple[str, ...]:
        return parse_phrases(self.holdout or "")

    def to_dict(self) -> dict:
        return asdict(self)

    def arch_overrides(self) -> dict:
        """The architecture switches set on the command line, to apply on top of the preset."""
        switches = {name: getattr(self, name) for name in ("norm", "qk_norm", "mlp", "pos", "pred")}
        return {name: value for name, value in switches.items() if value is not None}

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})
