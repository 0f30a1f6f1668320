"""The checkpoint: one typed record of a run, read, upgraded and written here only.

A file (``checkpoint.pt``, ``best.pt``; written by the trainer, ``tinydit.train``) holds everything
needed to sample from a run or to continue it exactly, as a plain dict of tensors and JSON values that
``torch.load(weights_only=True)`` reads:

    format, format_version, tinydit_version
    model_type ("dit" or "mmdit"), model_config (dict), train_config (dict), data (name, classes, ...)
    tokenizer (text models only: ``tinydit.data.text.Tokenizer.to_dict``), sampling (its recorded settings)
    model, ema, optimizer, grad_scaler, repa_projector (state dicts), step, train_seconds, rng
    plan (a time budget's schedule), best (the evaluation best.pt holds), kernels (what it trained with)

``Checkpoint.load`` reads one (or a pretrained folder, ``tinydit.models.pretrained``, which holds the
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

from tinydit.config import TrainConfig
from tinydit.errors import TinyDiTError
from tinydit.files import torch_save
from tinydit.models import pretrained
from tinydit.models.dit import DiT
from tinydit.models.dit_config import DiTConfig
from tinydit.models.registry import build_model, config_from_dict
from tinydit.version import __version__

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "Checkpoint",
    "DataRecord",
    "load_checkpoint",
    "load_model",
    "check_weights",
    "unwrap",
]

FORMAT = "tinydit-checkpoint"
FORMAT_VERSION = 1
# What continuing a run needs besides what sampling needs (a pretrained folder has none of it).
TRAINING_STATE = ("model", "ema", "optimizer", "train_seconds", "rng")


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under torch.compile / DDP wrappers: checkpoints are saved from it."""
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


@dataclass(frozen=True)
class DataRecord:
    """What a checkpoint records of its data: the canonical name (``tinydit.data.names``), the class
    names in label order, the image shape and, for a text run, its sample grids' prompts."""

    name: str
    classes: tuple[str, ...]
    channels: int | None = None  # None: written before the shape was recorded
    img_size: int | None = None
    prompts: tuple[str, ...] | None = None

    @classmethod
    def from_dict(cls, d: dict) -> DataRecord:
        prompts = d.get("prompts")
        return cls(
            d["name"],
            tuple(d["classes"]),
            d.get("channels"),
            d.get("img_size"),
            tuple(prompts) if prompts is not None else None,
        )

    def to_dict(self) -> dict:
        out = {"name": self.name, "classes": list(self.classes)}
        out |= {k: getattr(self, k) for k in ("channels", "img_size") if getattr(self, k) is not None}
        return out | ({"prompts": list(self.prompts)} if self.prompts is not None else {})


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """A run as its checkpoint holds it. ``config`` is the model's typed config; ``train_config`` the run's
    resolved ``TrainConfig`` as stored (read it through ``train``, ``preset``, ``few_step``, ``holdout``);
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

        ``path`` may also be a pretrained folder (``tinydit.models.pretrained``: model.safetensors and
        config.json), its config.json or weights file, a Hub id of one, or a run directory (its checkpoint.pt)."""
        path = Path(path)
        if path.is_dir() and not (path / pretrained.WEIGHTS).exists() and (path / "checkpoint.pt").is_file():
            path = path / "checkpoint.pt"  # a run directory
        elif (
            path.is_dir()
            or path.name in (pretrained.CONFIG, pretrained.WEIGHTS)
            or (not path.exists() and path.suffix != ".pt" and pretrained.is_hub_id(str(path)))
        ):
            state = pretrained.load_pretrained(path)
            return cls.from_dict(state, state["source"])
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
    def from_dict(cls, state: dict, where: str = "the checkpoint") -> Checkpoint:
        """A checkpoint from the dict a file holds, upgraded: the one place that knows what older releases
        wrote. Before MMDiT existed no ``model_type`` was written (every model was a DiT); a run stored
        before the alignment (``repa``) existed trained without it, and one stored before ``flip`` existed
        trained with random flips, Fashion-MNIST included; before the image shape was recorded
        ``data`` held the name and classes only, and before the sampler settings were, ``sampling`` is
        None (``tinydit.flow.settings.SamplingSettings.from_checkpoint`` gives what the run would record
        now). What cannot be read names ``where``."""
        state = {k: v for k, v in state.items() if k not in ("format", "format_version")}
        data = state.get("data") if isinstance(state.get("data"), dict) else {}
        missing = [k for k in ("model_config", "train_config", "data", "step") if k not in state]
        missing += [f"data.{k}" for k in ("name", "classes") if k not in data]
        if state.get("model") is None and state.get("ema") is None:
            missing.append("model")
        if missing:
            raise TinyDiTError(
                f"{where} lacks {', '.join(missing)}: the checkpoint is damaged, or was not written by `tinydit train`"
            )
        kind = state.pop("model_type", None) or "dit"
        config = config_from_dict(kind, state.pop("model_config"))
        known = {f.name for f in dataclasses.fields(cls)} - {"extra", "config", "model_type"}
        fields = {k: state.pop(k) for k in list(state) if k in known}
        fields["data"] = DataRecord.from_dict(fields["data"])
        fields["step"] = int(fields["step"] or 0)
        if fields["train_config"] and "repa" not in fields["train_config"]:
            fields["train_config"] = {**fields["train_config"], "repa": 0.0}
        if fields["train_config"] and "flip" not in fields["train_config"]:  # every set flipped before `flip`
            fields["train_config"] = {**fields["train_config"], "flip": True}
        fields.setdefault("source", where)
        return cls(model_type=kind, config=config, extra=state, **fields)

    # -- what its records say -------------------------------------------------------------------------------

    @property
    def preset(self) -> str | None:
        """The model preset the run was built from (a distilled student's: its teacher's)."""
        return self.train_config.get("preset")

    @property
    def few_step(self) -> str:
        """The run's objective beyond flow matching: none, shortcut, meanflow or distill."""
        return self.train_config.get("few_step") or "none"

    @property
    def holdout(self) -> str | None:
        """A text run's held-out phrases as given (``TrainConfig.holdout``), None if none were."""
        return self.train_config.get("holdout")

    def train(self) -> TrainConfig:
        """The run's resolved config, as it was trained (a continuation compares against it)."""
        return TrainConfig.from_dict(self.train_config)

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


def check_weights(model: nn.Module, weights: dict, where: str) -> None:
    """Raise a ``TinyDiTError`` naming ``where`` and the tensors unless ``weights`` fit ``model`` exactly."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in weights]
    extra = [k for k in weights if k not in expected]
    wrong = [
        f"{k} {tuple(weights[k].shape)} (the config makes {tuple(v.shape)})"
        for k, v in expected.items()
        if k in weights and weights[k].shape != v.shape
    ]
    problems = [
        f"{what} {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
        for what, names in (("missing", missing), ("unexpected", extra), ("wrong shape", wrong))
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
