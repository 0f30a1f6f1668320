"""The checkpoint: one typed record of a run, read, upgraded and written here only.

A file (``checkpoint.pt``, ``best.pt``; written by the trainer, ``tinydit.train``) holds everything
needed to sample from a run or to continue it exactly, as a plain dict of tensors and JSON values that
``torch.load(weights_only=True)`` reads:

    format, format_version, tinydit_version
    model_type ("dit" or "mmdit"), model_config (dict), train_config (dict), data (name, classes, ...)
    tokenizer (text models only: ``tinydit.data.text.Tokenizer.to_dict``), sampling (its recorded settings)
    model, ema, optimizer, grad_scaler, repa_projector (state dicts), step, train_seconds, rng
    plan (a time budget's schedule), best (the evaluation best.pt holds), kernels (what it trained with)

``Checkpoint.load`` reads one (or a pretrained folder, ``tinydit.checkpoints.pretrained``, which holds the
sampling part) and ``Checkpoint.from_dict`` is the one place that upgrades what older releases wrote;
every other module reads its fields. Files are written through ``tinydit.files.torch_save``, atomically,
so an interrupted save never leaves a half-written checkpoint and never loses the previous one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from tinydit.checkpoints import pretrained
from tinydit.config import TrainConfig
from tinydit.errors import TinyDiTError
from tinydit.files import torch_save
from tinydit.flow.settings import SamplingSettings, recommended_sampling
from tinydit.models.dit import DiT
from tinydit.models.dit_config import DiTConfig
from tinydit.models.registry import build_model, config_from_dict, model_type
from tinydit.schema import as_key, build, check_fields, check_value, reading
from tinydit.tokens import SPECIALS
from tinydit.version import __version__

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "Checkpoint",
    "DataRecord",
    "load_checkpoint",
    "load_model",
    "check_weights",
    "fit_weights",
]

FORMAT = "tinydit-checkpoint"
FORMAT_VERSION = 1
# What continuing a run needs besides what sampling needs (a pretrained folder has none of it).
TRAINING_STATE = ("model", "ema", "optimizer", "train_seconds", "rng")


@dataclass(frozen=True)
class DataRecord:
    """What a checkpoint records of its data: the canonical name (``tinydit.data.registry``), the class
    names in label order, the image shape and, for a text run, its sample grids' prompts."""

    name: str
    classes: tuple[str, ...]
    channels: int | None = None  # None: written before the shape was recorded
    img_size: int | None = None
    prompts: tuple[str, ...] | None = None

    def __post_init__(self):
        if not self.name.strip():
            raise TinyDiTError(f"`name` {self.name!r} names no data set")
        if not self.classes or any(not c.strip() for c in self.classes) or len(set(self.classes)) < len(self.classes):
            raise TinyDiTError(f"`classes` must be one or more distinct names, got {list(self.classes)}")
        for name in ("channels", "img_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise TinyDiTError(f"`{name}` must be >= 1, got {getattr(self, name)}")

    @classmethod
    def from_dict(cls, d: dict, key: str = "data") -> DataRecord:
        """A stored record (a checkpoint's ``key``), its types and values checked; errors name ``key`` and the field."""
        return build(cls, d, key)

    def to_dict(self) -> dict:
        out = {"name": self.name, "classes": list(self.classes)}
        out |= {k: getattr(self, k) for k in ("channels", "img_size") if getattr(self, k) is not None}
        return out | ({"prompts": list(self.prompts)} if self.prompts is not None else {})


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """A run as its checkpoint holds it. ``config`` is the model's typed config; ``train_config`` the run's
    resolved ``TrainConfig`` as stored (read it through ``train``, ``preset``, ``objective``, ``holdout``);
    the state dicts are as PyTorch wrote them. ``source`` names the file or folder it was read from."""

    model_type: str
    config: DiTConfig
    train_config: dict
    data: DataRecord
    step: int
    model: dict | None = None  # weights; a pretrained folder's are its EMA weights in both
    ema: dict | None = None
    tokenizer: dict | None = None
    sampling: dict | None = None  # ``tinydit.flow.settings.SamplingSettings.to_json``
    optimizer: dict | None = None
    grad_scaler: dict | None = None
    repa_projector: dict | None = None
    train_seconds: float | None = None
    rng: dict | None = None
    plan: dict | None = None
    best: dict | None = None  # {metric, value, step} of the run's best.pt
    kernels: dict | None = None
    tinydit_version: str | None = None
    source: str = "the checkpoint"  # the file or folder it was read from, as errors name it
    extra: dict = field(default_factory=dict)  # keys this release does not know, written back as read

    # -- reading --------------------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path, map_location: str | torch.device = "cpu") -> Checkpoint:
        """Read and validate a TinyDiT checkpoint; a clear ``TinyDiTError`` for anything else.

        ``path`` may also be a pretrained folder (``tinydit.checkpoints.pretrained``: model.safetensors and
        config.json), its config.json or weights file, a Hub id of one, or a run directory (its checkpoint.pt)."""
        path = Path(path)
        try:
            return cls._load(path, map_location)
        except OSError as err:  # a name the file system refuses (too long, a loop of links): one line, not a traceback
            raise TinyDiTError(f"cannot read checkpoint {path}: {err.strerror or err}") from err

    @classmethod
    def _load(cls, path: Path, map_location) -> Checkpoint:
        if path.is_dir() and (path / "checkpoint.pt").is_file():
            path = path / "checkpoint.pt"  # a run directory (its own checkpoint, whatever else was put there)
        elif (
            path.is_dir()
            or path.name in (pretrained.CONFIG, pretrained.WEIGHTS)
            or (not path.exists() and path.suffix != ".pt" and pretrained.is_hub_id(str(path)))
        ):
            state = pretrained.load_pretrained(path)
            weights = state.pop("source")
            return cls.from_dict(state, str(Path(weights).with_name(pretrained.CONFIG)), weights_in=weights)
        if not path.is_file():
            raise TinyDiTError(f"checkpoint {path} does not exist; pass the checkpoint.pt of a training run")
        try:
            state = torch.load(path, map_location=map_location, weights_only=True)
        except Exception as err:
            raise TinyDiTError(
                f"{path} is not a readable TinyDiT checkpoint ({type(err).__name__}); "
                "pass a checkpoint.pt written by `tinydit train`"
            ) from err
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise TinyDiTError(f"{path} is not a TinyDiT checkpoint; pass a checkpoint.pt written by `tinydit train`")
        version = state.get("format_version")
        if version != FORMAT_VERSION:
            raise TinyDiTError(
                f"{path} has checkpoint format version {version}, this tinydit {__version__} reads version "
                f"{FORMAT_VERSION}; use the tinydit release that wrote it"
            )
        return cls.from_dict(state, str(path))

    @classmethod
    def from_dict(cls, state: dict, where: str = "the checkpoint", weights_in: str | None = None) -> Checkpoint:
        """A checkpoint from the dict a file holds, upgraded and checked: the one place that knows what older
        releases wrote, and the one that checks what any release wrote. Before MMDiT existed no
        ``model_type`` was written (every model was a DiT); a run stored before the alignment (``repa``)
        existed trained without it, and one stored before ``flip`` existed trained with random flips,
        Fashion-MNIST included; the objective was `few_step`, its flow matching "none", before it was
        `objective`; a shortcut model written before ``finest_step`` (``DiTConfig``) trained flow matching at
        d = 0, and is told every d as given; before the image shape was recorded ``data`` held the name and classes
        only, and before the sampler settings were, ``sampling`` is None
        (``Checkpoint.sampling_settings`` gives what the run would record now, and
        checks a recorded one).

        Every record is checked for its types and ranges (``tinydit.schema``) and against the others (the class
        names against the model's classes, the image shape and the tokenizer against the model config), and
        every tensor of the weights against the model the config builds. What cannot be read is one
        ``TinyDiTError`` naming ``where`` (the file the records are in), the key and the value; the weights'
        are named by ``weights_in``, a pretrained folder's model.safetensors (default: ``where``)."""
        fix = (
            "fix it, or export the folder again"
            if weights_in
            else "the checkpoint is damaged, or was not written by `tinydit train`"
        )
        with reading(where, fix):
            ckpt = cls._records(state, weights_in or where)
        for name in ("model", "ema"):
            if getattr(ckpt, name) is not None:
                fit_weights(ckpt.model_type, ckpt.config, getattr(ckpt, name), ckpt.source)
        return ckpt

    @classmethod
    def _records(cls, state: dict, source: str) -> Checkpoint:
        """The checkpoint's records from ``state``, upgraded and checked alone and against each other."""
        state = {k: v for k, v in state.items() if k not in ("format", "format_version")}
        data = state.get("data") if isinstance(state.get("data"), dict) else {}
        missing = [k for k in ("model_config", "train_config", "data", "step") if k not in state]
        missing += [f"data.{k}" for k in ("name", "classes") if k not in data]
        if state.get("model") is None and state.get("ema") is None:
            missing.append("model")
        if missing:
            raise TinyDiTError(f"lacks {', '.join(missing)}")
        kind = check_value(state.pop("model_type", None), str | None, "model_type")
        kind = "dit" if kind is None else kind  # written before MMDiT existed
        with as_key("model_type"):
            model_type(kind)
        config = config_from_dict(kind, state.pop("model_config"))
        known = {f.name for f in dataclasses.fields(cls)} - {"extra", "config", "model_type", "source"}
        fields = {k: state.pop(k) for k in list(state) if k in known}
        fields |= check_fields(cls, fields, "", names=known - {"data"})
        fields["data"] = DataRecord.from_dict(fields["data"])
        for name in ("step", "train_seconds"):
            if (fields.get(name) or 0) < 0:
                raise TinyDiTError(f"{name} must be >= 0, got {fields[name]}")
        if fields["train_config"] and "repa" not in fields["train_config"]:
            fields["train_config"] = {**fields["train_config"], "repa": 0.0}
        if fields["train_config"] and "flip" not in fields["train_config"]:  # every set flipped before `flip`
            fields["train_config"] = {**fields["train_config"], "flip": True}
        if fields["train_config"] and "few_step" in fields["train_config"]:  # `objective` before it had its name
            train = dict(fields["train_config"])
            old = train.pop("few_step")
            fields["train_config"] = {**train, "objective": "flow" if old in (None, "none") else old}
        TrainConfig.from_dict(fields["train_config"])  # checked here, once; kept as the dict it was stored as
        _check_agree(config, fields["data"], fields.get("tokenizer"))
        return cls(model_type=kind, config=config, extra=state, source=source, **fields)

    # -- what its records say -------------------------------------------------------------------------------

    def sampling_settings(self) -> SamplingSettings:
        """The settings this checkpoint records, or, for one written before they were recorded, those its data
        set and preset would record now. A recorded one that cannot be used is refused naming the file and
        the key (``_records`` checks that it is a record; what it may hold is ``SamplingSettings``'s)."""
        if self.sampling is not None:
            with reading(self.records_file, "fix it, or record settings again with `tinydit sweep --apply`"):
                with as_key("sampling"):
                    return SamplingSettings.from_json(self.sampling)
        return recommended_sampling(self.data.name, self.preset or "", self.config.cond, self.objective)

    @property
    def preset(self) -> str | None:
        """The model preset the run was built from (a distilled student's: its teacher's)."""
        return self.train_config.get("preset")

    @property
    def objective(self) -> str:
        """The run's objective (``tinydit.flow.objectives``): flow, shortcut, meanflow or distill."""
        return self.train_config.get("objective") or "flow"

    @property
    def holdout(self) -> str | None:
        """A text run's held-out phrases as given (``TrainConfig.holdout``), None if none were."""
        return self.train_config.get("holdout")

    def train(self) -> TrainConfig:
        """The run's resolved config, as it was trained (a continuation compares against it)."""
        return TrainConfig.from_dict(self.train_config)

    @property
    def records_file(self) -> str:
        """The file its records were read from: a pretrained folder's config.json, else ``source`` itself."""
        path = Path(self.source)
        return str(path.with_name(pretrained.CONFIG)) if path.name == pretrained.WEIGHTS else self.source

    @property
    def missing_to_continue(self) -> list[str]:
        """What continuing the run would need and the file lacks (empty: it can be continued)."""
        return [k for k in TRAINING_STATE if getattr(self, k) is None]

    @property
    def optimizer_fused(self) -> bool:
        """Whether its optimizer state is that of the fused AdamW; a run from before it continues unfused."""
        return bool(self.optimizer is not None and self.optimizer["param_groups"][0].get("fused"))

    def weights(self, ema: bool = True) -> dict:
        """The EMA weights (where ``ema`` and the file has them), else the trained ones."""
        return self.ema if ema and self.ema is not None else self.model

    # -- writing --------------------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """The dict a file holds (the format fields are added by ``save``)."""
        out = {"model_type": self.model_type, "model_config": self.config.to_dict()}
        for f in dataclasses.fields(self):
            if f.name in ("model_type", "config", "extra", "source", "tinydit_version"):
                continue
            value = getattr(self, f.name)
            if value is not None:  # unset is absent: every reader takes an absent key as None
                out[f.name] = value.to_dict() if f.name == "data" else value
        return out | self.extra

    def save(self, path: str | Path) -> None:
        """Write the checkpoint to ``path`` atomically, stamped with the format and this release."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"format": FORMAT, "format_version": FORMAT_VERSION, "tinydit_version": __version__}
        torch_save(path, payload | self.to_dict())


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> Checkpoint:
    """``Checkpoint.load``: a checkpoint.pt, a run directory, a pretrained folder or a Hub id."""
    return Checkpoint.load(path, map_location)


def _check_agree(config: DiTConfig, data: DataRecord, tokenizer: dict | None) -> None:
    """The records against each other: what the data record says of the images, the classes and the captions
    must be what the model config built the weights for."""
    for name, model_name in (("channels", "in_channels"), ("img_size", "img_size")):
        if getattr(data, name) is not None and getattr(data, name) != getattr(config, model_name):
            raise TinyDiTError(
                f"data.{name} {getattr(data, name)} disagrees with model_config.{model_name} "
                f"{getattr(config, model_name)}, which the weights were built for"
            )
    # A class model's label i is the name classes[i], and the label n_classes its null label: one name too
    # many or too few draws the wrong class under a name, or the null label as a class.
    if config.cond == "class" and len(data.classes) != config.n_classes:
        raise TinyDiTError(
            f"data.classes names {len(data.classes)} classes ({', '.join(data.classes)}) for a model of "
            f"model_config.n_classes {config.n_classes}: one name per class label of the weights"
        )
    if (config.cond == "text") != (tokenizer is not None):
        raise TinyDiTError(
            "a text model (model_config.cond text) needs its tokenizer"
            if tokenizer is None
            else f"tokenizer is given for a model of model_config.cond {config.cond}, which reads no captions"
        )
    if tokenizer is not None:
        if set(tokenizer) != {"vocab", "max_len"}:
            raise TinyDiTError(f"tokenizer must hold vocab and max_len, got {', '.join(map(str, tokenizer))}")
        vocab = check_value(tokenizer["vocab"], tuple[str, ...], "tokenizer.vocab")
        max_len = check_value(tokenizer["max_len"], int, "tokenizer.max_len")
        if len(vocab) + len(SPECIALS) != config.vocab_size or max_len != config.text_len:
            raise TinyDiTError(
                f"tokenizer (ids for {len(vocab)} words and {len(SPECIALS)} specials, {max_len} per caption) "
                f"disagrees with model_config.vocab_size {config.vocab_size} and text_len {config.text_len}"
            )


def fit_weights(kind: str, config: DiTConfig, weights: dict, where: str) -> None:
    """``check_weights`` against the model ``config`` builds, built without memory (on the meta device), so that a
    config edited to a huge width costs nothing to refuse; and every tensor finite."""
    blocks = config.depth + getattr(config, "single_blocks", 0) + (config.text_depth if config.cond == "text" else 0)
    if blocks > len(weights):  # every block holds tensors: no need to build a million of them to see they are not there
        raise TinyDiTError(
            f"the weights in {where} do not fit its model config ({len(weights)} tensors for {blocks} blocks): "
            "the file is damaged or was edited; export or train it again"
        )
    try:
        with torch.device("meta"):
            model = build_model(kind, config)
    except (RuntimeError, OverflowError) as err:  # even shapes alone overflow: a width of billions, say
        raise TinyDiTError(
            f"the weights in {where} do not fit its model config, whose tensors are too large to exist "
            f"({str(err).splitlines()[0]}): the file is damaged or was edited; export or train it again"
        ) from err
    check_weights(model, weights, where)
    bad = [k for k, v in weights.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        shown = ", ".join(bad[:3]) + (" ..." if len(bad) > 3 else "")
        raise TinyDiTError(
            f"the weights in {where} hold NaN or infinite values ({shown}): the file is damaged; "
            "export or train it again"
        )


def check_weights(model: nn.Module, weights: dict, where: str) -> None:
    """Raise a ``TinyDiTError`` naming ``where`` and the tensors unless ``weights`` fit ``model`` exactly: the same
    names, shapes, and floating-point values where the model has them (bf16 and fp16 are taken, and widened)."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in weights]
    extra = [str(k) for k in weights if k not in expected]
    not_tensors = [k for k in expected if k in weights and not isinstance(weights[k], torch.Tensor)]
    wrong = [
        f"{k} {tuple(weights[k].shape)} (the config makes {tuple(v.shape)})"
        for k, v in expected.items()
        if k in weights and k not in not_tensors and weights[k].shape != v.shape
    ]
    dtypes = [
        f"{k} {str(weights[k].dtype).removeprefix('torch.')}"
        for k, v in expected.items()
        if k in weights and k not in not_tensors and v.is_floating_point() != weights[k].is_floating_point()
    ]
    problems = [
        f"{what} {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
        for what, names in (
            ("missing", missing),
            ("unexpected", extra),
            ("not a tensor", not_tensors),
            ("wrong shape", wrong),
            ("wrong type", dtypes),
        )
        if names
    ]
    if problems:
        raise TinyDiTError(
            f"the weights in {where} do not fit its model config ({'; '.join(problems)}): the file is "
            "damaged or was edited; export or train it again"
        )


def load_model(
    checkpoint: Checkpoint | str | Path, ema: bool = True, map_location: str | torch.device = "cpu"
) -> tuple[DiT, Checkpoint]:
    """The checkpoint's model (a DiT or an MMDiT) with its (EMA by default) weights, in eval mode, and the
    ``Checkpoint``. A text model's tokenizer is ``tinydit.data.text.tokenizer_of(checkpoint)``."""
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else Checkpoint.load(checkpoint, map_location)
    model = build_model(ckpt.model_type, ckpt.config)
    weights = ckpt.weights(ema)
    check_weights(model, weights, ckpt.source)
    model.load_state_dict(weights)
    return model.to(map_location).eval(), ckpt
