"""The model types by name (``--model dit|mmdit``): their config class, model class and presets.

A checkpoint records its model type beside the model config (``model_type``; checkpoints written before
MMDiT existed have none and are DiTs), so ``tinydit.models.checkpoint.load_model`` rebuilds the right class.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from tinydit.errors import TinyDiTError
from tinydit.models import dit as model
from tinydit.models import mmdit

__all__ = ["ModelType", "MODEL_TYPES", "model_type", "preset_config", "config_from_dict", "build_model", "type_of"]


@dataclass(frozen=True)
class ModelType:
    name: str
    config_cls: type[model.DiTConfig]
    model_cls: type[model.DiT]
    presets: dict[str, dict]
    default_preset: str
    conds: tuple[str, ...]  # the conditionings it supports, the default first


MODEL_TYPES: dict[str, ModelType] = {
    "dit": ModelType("dit", model.DiTConfig, model.DiT, model.PRESETS, model.DEFAULT_PRESET, ("class", "text")),
    "mmdit": ModelType("mmdit", mmdit.MMDiTConfig, mmdit.MMDiT, mmdit.PRESETS, mmdit.DEFAULT_PRESET, ("text",)),
}


def model_type(name: str) -> ModelType:
    if name not in MODEL_TYPES:
        raise TinyDiTError(f"unknown model {name!r}: use one of {', '.join(MODEL_TYPES)}")
    return MODEL_TYPES[name]


def preset_config(kind: str, preset: str, **fields) -> model.DiTConfig:
    """The config of ``preset`` for model type ``kind``, completed with ``fields`` (the data's sizes, switches)."""
    if kind == "dit":
        return model.get_preset(preset, **fields)
    if preset not in MODEL_TYPES[kind].presets:
        raise TinyDiTError(f"unknown {kind} preset {preset!r}: use one of {', '.join(MODEL_TYPES[kind].presets)}")
    return mmdit.get_preset(preset, **fields)


def config_from_dict(kind: str, d: dict) -> model.DiTConfig:
    return model_type(kind).config_cls.from_dict(d)


def build_model(kind: str, config: model.DiTConfig) -> model.DiT:
    return model_type(kind).model_cls(config)


def type_of(m: nn.Module) -> str:
    """The registry name of a model instance: "mmdit" or "dit"."""
    return "mmdit" if isinstance(m, mmdit.MMDiT) else "dit"
