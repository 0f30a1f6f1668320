"""The training run's configuration: ``TrainConfig``, a typed dataclass whose fields are grouped by concern
(data, model, objective, optimisation, budget, device, output, evaluation: the groups of `tinydit train
--help`), checked on construction by a method per concern, and nothing else.

A leaf of the package (it imports only ``errors``, ``runtime`` and ``tokens``): the names a field may take
belong to their owners (the presets to ``tinydit.models.presets``, the samplers to
``tinydit.flow.samplers``, the data sets to ``tinydit.data.registry``), and a run's ``None`` defaults are
filled once, from those owners and the data set, by ``tinydit.train.resolve.resolve``, which returns a new
config: this one is never rewritten. The resolved config (and the model's ``DiTConfig``) is written to
``RUN_DIR/config.json`` and into every checkpoint. The ``tinydit train`` flags are made from its fields and
the comment beside each (``tinydit.cli``): a new option is one new field.

Errors name the parameter in backticks (`steps`); the CLI prints the flag in its place (--steps).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from tinydit.errors import TinyDiTError
from tinydit.runtime import COMPILE, PRECISIONS
from tinydit.schema import build, check_text
from tinydit.tokens import parse_phrases

__all__ = [
    "TrainConfig",
    "CHOICES",
    "TRAJECTORY_FIELDS",
    "PRECISION_CHOICES",
    "MAX_COOLDOWN_FRAC",
    "check_seed",
]

PRECISION_CHOICES = ("auto", *PRECISIONS)  # auto: the fastest measured on the device (tinydit.runtime)
EVAL_BUDGETS = ("outside", "inside")  # see TrainConfig.eval_budget
MAX_COOLDOWN_FRAC = 0.8


def check_seed(seed: int) -> None:
    """A seed torch's generators take: an integer of at most 63 bits."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not -(2**63) <= seed < 2**63:
        raise TinyDiTError(f"`seed` must be an integer between -2**63 and 2**63 - 1, got {seed!r}")


# Fields that change what a run computes. A run directory can only be continued with the same values;
# everything else (steps, minutes, logging intervals, device) may change between invocations.
TRAJECTORY_FIELDS = (
    "data",
    "classes",
    "preset",
    "batch_size",
    "lr",
    "warmup",
    "cooldown_frac",
    "weight_decay",
    "grad_clip",
    "ema_decay",
    "class_dropout",
    "repa",
    "seed",
    "limit",
    "t_sampling",
    "t_shift",
    "norm",
    "qk_norm",
    "mlp",
    "pos",
    "pred",
    "objective",
    "meanflow_cfg",
    "model",
    "cond",
    "holdout",
    "flip",
    "img_size",
    "teacher",
    "teacher_sampler",
    "teacher_steps",
    "teacher_cfg",
    "teacher_cfg_interval",
    "distill_paths",
)


# The values of the fields whose closed sets the config owns; the others (model, cond, t_sampling, objective,
# teacher_sampler and the architecture switches) are their owners' names, checked by the resolve step.
CHOICES: dict[str, tuple[str, ...]] = {
    "precision": PRECISION_CHOICES,
    "compile": COMPILE,
    "eval_budget": EVAL_BUDGETS,
}


@dataclass
class TrainConfig:
    # Each field's comment is its flag's help, and each "-- title: what --" line below opens the group of
    # `tinydit train --help` that the flags after it stand in. A `None` default says in its comment what it
    # stands for ("None: ..."), or is filled by the resolve step, which says it (resolve.RESOLVED_DEFAULTS).

    # -- data: what the model learns from --

    data: str = "shapes"  # shapes | fashion-mnist | cifar10 | the path of an image folder
    data_root: str = "data"  # where downloadable data sets are looked for and stored
    limit: int | None = None  # train on the first LIMIT training images only (quick runs); None: all of them
    # train on these classes only: names or ids, comma-separated (automobile,truck); None: all of them
    classes: str | None = None
    # text runs: comma-separated caption phrases ("red triangle"); every training image whose caption holds
    # one is removed, so the model never sees that combination and prompt adherence can test it
    holdout: str | None = None
    # mirror training images left-right at random; None: as the data set does, off for Fashion-MNIST (its
    # shoes all face one way) and on for shapes, CIFAR-10, image folders and Dataset objects
    flip: bool | None = None
    # an image folder's side in pixels, a multiple of the model's patch size (48, 64); None: 32 for a folder,
    # and a built-in data set's own size, the only one it takes
    img_size: int | None = None

    # -- model: the network and its architecture switches --

    model: str = "dit"  # dit | mmdit (image and text streams with joint attention)
    preset: str | None = None  # the model size: a name of `tinydit presets`
    cond: str | None = None  # what the model is conditioned on: class | text (the shapes captions)
    norm: str | None = None  # layernorm | rmsnorm; None: the preset's
    qk_norm: bool | None = None  # RMS-normalise queries and keys per head; None: the preset's
    mlp: str | None = None  # gelu | swiglu (gated SiLU at the same parameter count); None: the preset's
    # sincos (absolute, added to the tokens) | rope (2-D rotary, inside attention); None: the preset's
    pos: str | None = None
    pred: str | None = None  # what the network outputs: v (the velocity) | x (the clean image); None: the preset's

    # -- objective: what the network learns, and from which times --

    t_sampling: str | None = None  # how training times are drawn: uniform | logit-normal (SD3's)
    t_shift: float | None = None  # > 1 moves the training times towards noise: t' = s t / (1 + (s - 1) t)
    class_dropout: float = 0.1  # probability of the null label (text: the empty caption), which guidance needs
    # the weight of REPA's representation alignment: the tokens after the second block are pulled towards a
    # shipped encoder's features of the clean image (shapes, fashion-mnist); 0: off
    repa: float | None = None
    # what the network learns (tinydit.flow.objectives): flow (flow matching) | shortcut: also learn to take
    # large steps | meanflow: learn the average velocity over intervals, to sample in one step | distill: a
    # few-step student learns the paths of a trained model, `teacher`
    objective: str = "flow"
    # meanflow: the guidance scale folded into the training target, so that one evaluation samples guided
    # (1: unguided)
    meanflow_cfg: float | None = None
    teacher: str | None = None  # distill: the checkpoint.pt of the trained model it learns from; None: none
    teacher_sampler: str = "heun"  # distill: the sampler that draws the teacher's paths: euler | heun | midpoint
    teacher_steps: int = 8  # distill: the teacher's uniform steps per path (a multiple of tinydit.flow.distill.KNOTS)
    teacher_cfg: float = 3.0  # distill: the teacher's guidance scale
    teacher_cfg_interval: tuple[float, float] = (0.1, 0.8)  # distill: the teacher guides only for t in [LO, HI]
    distill_paths: int = 40_000  # distill: how many teacher paths the student trains on

    # -- optimisation: the optimizer, its learning rate and the random draws --

    batch_size: int | None = None  # images per optimizer step (the global batch, shared by all processes)
    lr: float | None = None  # AdamW's peak learning rate (constant after the warm-up, as in DiT)
    warmup: int = 100  # linear learning-rate warm-up, in steps
    weight_decay: float = 0.0  # AdamW weight decay (DiT uses none)
    grad_clip: float = 1.0  # clip the global gradient norm to this (0: off)
    # the decay of the EMA of the weights that sampling uses, warmed up as min(decay, (1 + s) / (10 + s))
    ema_decay: float = 0.999
    seed: int = 0  # the one seed behind data order, flips, times, noise and initial weights

    # -- budget: when the run ends, and how its learning rate falls before it --

    steps: int | None = None  # stop after this many optimizer steps (with `minutes`: whichever comes first)
    minutes: float | None = None  # stop after this many minutes of training; None: no time limit
    # with `steps`: the learning rate falls linearly to 0 over the last `cooldown` steps (warmup-stable-decay);
    # other `steps` or `cooldown` continue a run until its fall begins
    cooldown: int = 0
    # with `minutes`: the learning rate falls linearly to 0 over this last share of the time; the steps are
    # planned as the fall begins, from the run's steps per second, and kept in the checkpoint, so that a
    # continuation follows the same schedule; a finished run given more `minutes` goes back to the peak rate
    # and falls again over this share of the added time
    cooldown_frac: float | None = None

    # -- device: where the run computes, in which precision, compiled or not --

    device: str = "auto"  # auto (CUDA, else Apple's MPS, else the CPU) | cpu | cuda | cuda:N | mps
    # auto | fp32 | bf16 | fp16 (CUDA only); auto: bf16 on CUDA where supported, and on a CPU where a short probe
    # at start finds bf16 matmuls clearly faster; else fp32
    precision: str = "auto"
    # auto | on | off: torch.compile the training forward pass (on CUDA also sampling's); auto: on CUDA, and on
    # a CPU with a C++ compiler for a `minutes` run where this machine's earlier runs of its kind held more steps
    # compiled (with none recorded, a long enough one compiles, to measure)
    compile: str = "auto"

    # -- output: the run directory, what the run writes there, and how often --

    out: str = "runs/shapes"  # the run directory: config.json, metrics.jsonl, checkpoint.pt, samples/
    log_every: int = 50  # steps between lines in metrics.jsonl
    val_every: int = 250  # steps between validation losses on the fixed held-out batch
    val_size: int = 512  # held-out images used for the validation loss
    sample_every: int = 500  # steps between sample grids (samples/step_NNNNNN.png)
    ckpt_every: int = 500  # steps between checkpoints (always one at the end, and on Ctrl-C)
    # sample grids: the sampler's steps, as `tinydit sample --steps` sets them; None: the recorded steps
    sample_steps: int | None = None
    sample_cfg: float | None = None  # sample grids: the guidance scale; None: the recorded one, as `tinydit sample`
    tensorboard: bool = False  # also write the metrics and sample grids for TensorBoard into RUN_DIR/tensorboard
    report: bool = True  # write RUN_DIR/report.html at the end of the run (`tinydit report RUN_DIR` writes it later)

    # -- evaluation: offline metrics during training, and the best checkpoint --

    # steps between evaluations, and one at the end (0: none): `eval_n` class-balanced EMA samples, drawn with
    # the recorded sampler settings, scored with the offline metrics into metrics.jsonl
    eval_every: int = 0
    eval_n: int = 500  # samples per evaluation: more is less noisy and slower
    eval_budget: str = "outside"  # outside | inside: whether evaluation time counts toward `minutes`
    # the metric best.pt is kept by; auto: shape_strict on shapes class runs, adherence_all_all on shapes text
    # runs, else the FID of the data set's feature network
    best_metric: str = "auto"

    def __post_init__(self):
        """Every field as given, alone or against another given field, by concern; ``None`` stays ``None``
        (the defaults that depend on the data set and the model are filled by ``tinydit.train.resolve``)."""
        for f in fields(self):  # every number finite: NaN passes every comparison below, and inf never ends
            values = getattr(self, f.name)
            for v in values if isinstance(values, (tuple, list)) else (values,):
                if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v):
                    raise TinyDiTError(f"`{f.name}` must be a finite number, got {v}")
        self._check_data()
        self._check_objective()
        self._check_schedule()
        self._check_budget()
        self._check_output()
        self._check_choices("precision", "compile")  # runtime; the device is checked where it is found

    def _check_choices(self, *names: str) -> None:
        for name in names:
            if getattr(self, name) not in CHOICES[name]:
                raise TinyDiTError(f"`{name}` must be one of {', '.join(CHOICES[name])}; got {getattr(self, name)!r}")

    @staticmethod
    def _check_at_least_one(**values: int | None) -> None:
        for name, value in values.items():
            if value is not None and value < 1:
                raise TinyDiTError(f"`{name}` must be >= 1, got {value}")

    def _check_data(self) -> None:
        check_text(self.data, "data", "a data set (shapes, fashion-mnist, cifar10) or a folder of images")
        check_text(self.data_root, "data_root", "the folder where data sets are kept")
        self._check_at_least_one(limit=self.limit, img_size=self.img_size)
        if self.classes is not None and not [c for c in self.classes.split(",") if c.strip()]:
            raise TinyDiTError(f"`classes` {self.classes!r} names no class: give names or ids, comma-separated")

    def _check_objective(self) -> None:
        """The times, guidance dropout, alignment and the objectives' own fields (the names, and the fields
        against the objective: resolve)."""
        if self.t_shift is not None and self.t_shift <= 0:
            raise TinyDiTError(f"`t_shift` must be > 0, got {self.t_shift}")
        if not 0 <= self.class_dropout < 1:
            raise TinyDiTError(f"`class_dropout` must be in [0, 1), got {self.class_dropout}")
        if self.repa is not None and self.repa < 0:
            raise TinyDiTError(f"`repa` must be >= 0 (0: off), got {self.repa}")
        if self.meanflow_cfg is not None and self.meanflow_cfg < 1:
            raise TinyDiTError(
                f"`meanflow_cfg` is the guidance folded into a mean-flow run's target, >= 1 (1: none); "
                f"got {self.meanflow_cfg}"
            )
        self._check_distill()

    def _check_distill(self) -> None:
        """A student's teacher, as given (whether the objective takes one is the objective's check: resolve)."""
        self.teacher_cfg_interval = tuple(float(v) for v in self.teacher_cfg_interval)  # a JSON list in config.json
        if self.teacher is not None:
            check_text(self.teacher, "teacher", "the teacher's checkpoint.pt")
        self._check_at_least_one(distill_paths=self.distill_paths)

    def _check_schedule(self) -> None:
        check_seed(self.seed)
        self._check_at_least_one(batch_size=self.batch_size)
        if self.lr is not None and self.lr <= 0:
            raise TinyDiTError(f"`lr` must be > 0, got {self.lr}")
        if self.warmup < 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise TinyDiTError("`warmup`, `weight_decay` and `grad_clip` must be >= 0")
        if not 0 <= self.ema_decay < 1:
            raise TinyDiTError(f"`ema_decay` must be in [0, 1), got {self.ema_decay}")

    def _check_budget(self) -> None:
        """steps, minutes and the two kinds of cool-down."""
        if self.steps is not None and self.steps < 1:
            raise TinyDiTError(f"`steps` must be >= 1, got {self.steps}")
        if self.minutes is not None and self.minutes <= 0:
            raise TinyDiTError(f"`minutes` must be > 0, got {self.minutes}")
        if self.cooldown < 0:
            raise TinyDiTError(f"`cooldown` must be >= 0, got {self.cooldown}")
        # A time budget without `steps` has no steps to fall over; neither given, the resolve step's 2000 are checked.
        no_steps = self.steps is None and self.minutes is not None
        if self.cooldown and (no_steps or self.cooldown > (self.steps or math.inf)):
            raise TinyDiTError(
                f"`cooldown` {self.cooldown} is a fall over the last {self.cooldown} of `steps`: give "
                f"`steps` of at least {self.cooldown} (got {self.steps or 'none'})"
            )
        if self.cooldown_frac is None:
            return
        if not 0 <= self.cooldown_frac <= MAX_COOLDOWN_FRAC:
            raise TinyDiTError(
                f"`cooldown_frac` must be in [0, {MAX_COOLDOWN_FRAC}] (a share of the time budget), "
                f"got {self.cooldown_frac}"
            )
        if self.cooldown_frac and self.minutes is None:
            raise TinyDiTError(
                "`cooldown_frac` is a share of a time budget: give `minutes` (or use `cooldown` with `steps`)"
            )
        if self.cooldown_frac and self.cooldown:
            raise TinyDiTError(
                "give one cool-down: `cooldown` (steps, for a `steps` run) or `cooldown_frac` (a share of `minutes`)"
            )

    def _check_output(self) -> None:
        check_text(self.out, "out", "the run directory")  # a blank one is the current folder
        self._check_at_least_one(
            log_every=self.log_every,
            val_every=self.val_every,
            val_size=self.val_size,
            sample_every=self.sample_every,
            ckpt_every=self.ckpt_every,
            sample_steps=self.sample_steps,
        )
        if self.sample_cfg is not None and self.sample_cfg < 0:
            raise TinyDiTError(f"`sample_cfg` (guidance scale) must be >= 0, got {self.sample_cfg}")
        if self.eval_every < 0 or self.eval_n < 10:
            raise TinyDiTError(f"`eval_every` must be >= 0 and `eval_n` >= 10, got {self.eval_every} and {self.eval_n}")
        self._check_choices("eval_budget")

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
    def from_dict(cls, d: dict, key: str = "train_config") -> TrainConfig:
        """A stored (resolved) config, such as a checkpoint's (``tinydit.checkpoints.checkpoint.Checkpoint.train``,
        which upgrades what older releases stored), its types and values checked, errors naming ``key`` and
        the field; a field this release no longer has is left out, but a renamed one is refused rather than lost."""
        if "few_step" in d:
            raise TinyDiTError(
                f"{key}.few_step is `objective` as older releases named it: read it with Checkpoint.load"
            )
        return build(cls, d, key, unknown="drop")
