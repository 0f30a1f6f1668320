"""The training configuration: one typed dataclass, validated on construction.

The resolved config (this plus the model's ``DiTConfig``) is written to ``RUN_DIR/config.json`` and
into every checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from tinydit.errors import TinyDiTError
from tinydit.registry import MODEL_TYPES
from tinydit.runtime import PRECISIONS
from tinydit.text import parse_phrases

# Caption combinations a shapes text run never sees unless told otherwise (``--holdout``): prompt
# adherence on them measures compositional generalisation (``tinydit.adherence``).
SHAPES_HOLDOUT = "red triangle,blue circle"

FEW_STEP = ("none", "shortcut", "distill")  # --few-step: see TrainConfig.few_step

__all__ = ["TrainConfig", "TRAJECTORY_FIELDS", "SHAPES_HOLDOUT", "FEW_STEP"]

# Fields that change what a run computes. A run directory can only be continued with the same values;
# everything else (steps, minutes, logging intervals, device) may change between invocations.
TRAJECTORY_FIELDS = (
    "data", "preset", "batch_size", "lr", "warmup", "weight_decay", "grad_clip", "ema_decay",
    "class_dropout", "seed", "limit", "t_sampling", "t_shift", "norm", "qk_norm", "mlp", "pos", "pred", "few_step",
    "model", "cond", "holdout", "teacher", "teacher_sampler", "teacher_steps", "teacher_cfg", "teacher_cfg_interval",
    "distill_paths",
)  # fmt: skip


@dataclass
class TrainConfig:
    out: str = "runs/shapes"  # run directory: config.json, metrics.jsonl, checkpoint.pt, samples/
    data: str = "shapes"  # shapes | fashion-mnist | cifar10 | path of an image folder
    data_root: str = "data"  # where downloadable data sets are looked for and stored
    limit: int | None = None  # use only the first `limit` training images (quick runs)
    model: str = "dit"  # dit | mmdit (tinydit.mmdit: image and text streams with joint attention)
    preset: str | None = None  # model size, see `tinydit presets`; None: the model's default preset
    cond: str | None = None  # class | text (the captions, tinydit.text); None: class for dit, text for mmdit
    # Text runs: comma-separated caption phrases ("red triangle"); every training image whose caption holds
    # one is removed, so the model never sees that combination. None: SHAPES_HOLDOUT for shapes, else none.
    holdout: str | None = None
    norm: str | None = None  # architecture switches (see tinydit.model); None keeps the preset's choice
    qk_norm: bool | None = None
    mlp: str | None = None
    pos: str | None = None
    pred: str | None = None  # v | x: what the network outputs (see DiTConfig.pred); None keeps the preset's
    steps: int | None = None  # stop after this many optimizer steps ...
    minutes: float | None = None  # ... or after this much training wall time, whichever comes first
    batch_size: int = 128  # images per optimizer step
    lr: float = 1e-3  # AdamW peak learning rate (constant after warm-up, as in DiT)
    warmup: int = 100  # linear learning-rate warm-up, in steps
    # Linear decay of the learning rate to 0 over the last ``cooldown`` steps of a --steps run
    # (warmup-stable-decay). A run can be continued with other --steps/--cooldown until its decay starts.
    cooldown: int = 0
    weight_decay: float = 0.0  # AdamW weight decay (DiT uses none)
    grad_clip: float = 1.0  # clip the global gradient norm to this (0 = off)
    ema_decay: float = 0.999  # EMA of the weights used for sampling; warmed up as min(d, (1+s)/(10+s))
    class_dropout: float = 0.1  # probability of the null label (text: the empty caption), for guidance
    # Training times: uniform | logit-normal (SD3). None: logit-normal for text runs (it raised MMDiT's
    # all-attribute accuracy on shapes from 0.350 to 0.560, docs/text_to_image.md), else uniform.
    t_sampling: str | None = None
    # none | shortcut: also train the model to take large steps (tinydit.shortcut) | distill: train a
    # few-step student on the paths of a trained model, ``teacher`` (tinydit.distill)
    few_step: str = "none"
    teacher: str | None = None  # distill: the teacher's checkpoint.pt
    teacher_sampler: str = "heun"  # distill: how the teacher samples its paths (euler | heun | midpoint) ...
    teacher_steps: int = 8  # ... in this many uniform steps (a multiple of tinydit.distill.KNOTS) ...
    teacher_cfg: float = 3.0  # ... with this guidance scale ...
    teacher_cfg_interval: tuple[float, float] = (0.1, 0.8)  # ... applied for t in this interval (docs/few_step.md)
    distill_paths: int = 40_000  # distill: how many teacher paths the student trains on
    t_shift: float = 1.0  # > 1 moves training times towards noise: t' = s t / (1 + (s - 1) t)
    seed: int = 0  # the one seed behind data order, flips, times, noise and initial weights
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    precision: str = "auto"  # auto | fp32 | bf16 | fp16 (CUDA only); auto = fastest measured on the device
    compile: str = "auto"  # auto | on | off: torch.compile the training and sampling forward passes
    log_every: int = 50  # steps between lines in metrics.jsonl
    val_every: int = 250  # steps between validation losses on the fixed held-out batch
    val_size: int = 512  # held-out images used for the validation loss
    sample_every: int = 500  # steps between sample grids (samples/step_NNNNNN.png)
    ckpt_every: int = 500  # steps between checkpoints (always one at the end, and on Ctrl-C)
    sample_steps: int = 32  # Euler steps for the sample grids
    sample_cfg: float = 2.0  # guidance scale for the sample grids

    def __post_init__(self):
        if self.model not in MODEL_TYPES:
            raise TinyDiTError(f"unknown --model {self.model!r}: use one of {', '.join(MODEL_TYPES)}")
        kind = MODEL_TYPES[self.model]
        if self.preset is None:
            self.preset = kind.default_preset
        if self.preset not in kind.presets:
            raise TinyDiTError(f"unknown preset {self.preset!r} for --model {self.model}: use one of "
                               f"{', '.join(kind.presets)}")  # fmt: skip
        if self.cond is None:
            self.cond = kind.conds[0]
        if self.cond not in kind.conds:
            hint = "; use --model dit for class labels" if self.model == "mmdit" else ""
            raise TinyDiTError(f"--model {self.model} takes --cond {' or '.join(kind.conds)}, got {self.cond!r}{hint}")
        self.holdout = self._resolve_holdout()
        if self.t_sampling is None:
            self.t_sampling = "logit-normal" if self.cond == "text" else "uniform"
        if self.steps is None and self.minutes is None:
            self.steps = 2000
        if self.steps is not None and self.steps < 1:
            raise TinyDiTError(f"--steps must be >= 1, got {self.steps}")
        if self.minutes is not None and self.minutes <= 0:
            raise TinyDiTError(f"--minutes must be > 0, got {self.minutes}")
        for name in ("batch_size", "log_every", "val_every", "val_size", "sample_every", "ckpt_every", "sample_steps"):
            if getattr(self, name) < 1:
                raise TinyDiTError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.limit is not None and self.limit < 1:
            raise TinyDiTError(f"--limit must be >= 1, got {self.limit}")
        if self.lr <= 0:
            raise TinyDiTError(f"--lr must be > 0, got {self.lr}")
        if self.warmup < 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise TinyDiTError("warmup, weight_decay and grad_clip must be >= 0")
        if self.cooldown < 0:
            raise TinyDiTError(f"--cooldown must be >= 0, got {self.cooldown}")
        if self.cooldown and (self.steps is None or self.cooldown > self.steps):
            raise TinyDiTError(f"--cooldown {self.cooldown} is a fall over the last {self.cooldown} of --steps: give "
                               f"--steps of at least {self.cooldown} (got {self.steps or 'none'})")  # fmt: skip
        if not 0 <= self.ema_decay < 1:
            raise TinyDiTError(f"ema_decay must be in [0, 1), got {self.ema_decay}")
        if not 0 <= self.class_dropout < 1:
            raise TinyDiTError(f"class_dropout must be in [0, 1), got {self.class_dropout}")
        if self.t_sampling not in ("uniform", "logit-normal"):
            raise TinyDiTError(f"--t-sampling must be uniform or logit-normal, got {self.t_sampling!r}")
        if self.few_step not in FEW_STEP:
            raise TinyDiTError(f"--few-step must be one of {', '.join(FEW_STEP)}; got {self.few_step!r}")
        self._check_distill()
        if self.t_shift <= 0:
            raise TinyDiTError(f"--t-shift must be > 0, got {self.t_shift}")
        if self.precision not in ("auto", *PRECISIONS):
            raise TinyDiTError(f"--precision must be auto, {', '.join(PRECISIONS)}; got {self.precision!r}")
        if self.compile not in ("auto", "on", "off"):
            raise TinyDiTError(f"--compile must be auto, on or off; got {self.compile!r}")
        if self.sample_cfg < 0:
            raise TinyDiTError(f"sample_cfg (guidance scale) must be >= 0, got {self.sample_cfg}")

    def _check_distill(self) -> None:
        self.teacher_cfg_interval = tuple(float(v) for v in self.teacher_cfg_interval)
        if self.few_step != "distill":
            if self.teacher is not None:
                raise TinyDiTError("--teacher is only used with --few-step distill; add it or drop --teacher")
            return
        from tinydit.distill import KNOTS
        from tinydit.sampling import check_sampler_args

        if self.teacher is None:
            raise TinyDiTError("--few-step distill learns from a trained model: pass its checkpoint.pt with --teacher")
        if self.teacher_sampler not in ("euler", "heun", "midpoint"):
            raise TinyDiTError(f"--teacher-sampler must be euler, heun or midpoint, got {self.teacher_sampler!r}")
        if self.teacher_steps < 1 or self.teacher_steps % KNOTS:
            raise TinyDiTError(f"--teacher-steps must be a positive multiple of {KNOTS} (the teacher's path is "
                               f"kept at t = k/{KNOTS}), got {self.teacher_steps}")  # fmt: skip
        check_sampler_args(self.teacher_steps, self.teacher_cfg, self.teacher_sampler,
                           cfg_interval=self.teacher_cfg_interval)  # fmt: skip
        if self.distill_paths < 1:
            raise TinyDiTError(f"--distill-paths must be >= 1, got {self.distill_paths}")
        if self.cond != "class":
            raise TinyDiTError("--few-step distill works with class-conditional models for now; drop --cond text")
        if self.arch_overrides():
            raise TinyDiTError(f"the student copies the teacher's architecture; drop "
                               f"{', '.join('--' + k.replace('_', '-') for k in self.arch_overrides())}")  # fmt: skip

    def _resolve_holdout(self) -> str | None:
        """The held-out phrases, written out in full ("" for none) for text runs; None for class runs."""
        if self.cond != "text":
            if self.holdout not in (None, "", "none"):
                raise TinyDiTError(f"--holdout {self.holdout!r} removes captioned combinations from a text run; "
                                   "add --cond text (or --model mmdit), or drop --holdout")  # fmt: skip
            return None
        if self.holdout is None:
            from tinydit.data import canonical_name

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
