"""Reading checkpoints: plain state dicts, loaded with ``weights_only=True`` and checked (the trainer
writes them, ``tinydit.train.checkpoint``).

One file holds everything needed to sample from a run or to continue it exactly:

    format, format_version, tinydit_version
    model_type ("dit" or "mmdit"; absent in older checkpoints: "dit")
    model_config (dict), train_config (dict), data (name, classes, channels, img_size)
    tokenizer (text models only: its word list and L, ``tinydit.data.text.Tokenizer.to_dict``)
    model, ema, optimizer (state dicts), step, train_seconds, rng (torch CPU / CUDA states)

They are written through ``tinydit.files.atomic_write``, so an interrupted save never leaves a
half-written checkpoint and never loses the previous one.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from tinydit.errors import TinyDiTError
from tinydit.models import pretrained
from tinydit.models.dit import DiT
from tinydit.models.registry import build_model, config_from_dict
from tinydit.version import __version__

__all__ = ["FORMAT", "FORMAT_VERSION", "load_checkpoint", "load_model", "check_weights", "unwrap"]

FORMAT = "tinydit-checkpoint"
FORMAT_VERSION = 1
REQUIRED = ("model_config", "train_config", "data", "step")  # what load_model needs of a training checkpoint


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under torch.compile / DDP wrappers: checkpoints are saved from it."""
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
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
        return pretrained.load_pretrained(path)
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
    return state


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
    state_or_path: dict | str | Path, ema: bool = True, map_location: str | torch.device = "cpu"
) -> tuple[DiT, dict]:
    """The checkpoint's model (a DiT or an MMDiT) with its (EMA by default) weights, in eval mode, and the
    checkpoint dict. A text model's tokenizer is ``tokenizer_of(state)``."""
    state = state_or_path if isinstance(state_or_path, dict) else load_checkpoint(state_or_path, map_location)
    data = state.get("data") if isinstance(state.get("data"), dict) else {}
    missing = [k for k in REQUIRED if k not in state] + [f"data.{k}" for k in ("name", "classes") if k not in data]
    if "model" not in state and "ema" not in state:
        missing.append("model")
    if missing:
        where = "" if isinstance(state_or_path, dict) else f"{state_or_path} "
        raise TinyDiTError(
            f"{where}lacks {', '.join(missing)}: the checkpoint is damaged, or was not written by `tinydit train`"
        )
    kind = state.get("model_type", "dit")
    model = build_model(kind, config_from_dict(kind, state["model_config"]))
    weights = state["ema"] if ema and state.get("ema") is not None else state["model"]
    where = state.get("source") or ("the checkpoint" if isinstance(state_or_path, dict) else str(state_or_path))
    check_weights(model, weights, where)
    model.load_state_dict(weights)
    return model.to(map_location).eval(), state
