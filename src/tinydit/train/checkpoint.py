"""Continuing a run from its checkpoint: checking that it is the same run, and loading its state.

The checkpoint itself (its fields, reading, upgrading and writing) is ``tinydit.checkpoints.checkpoint.Checkpoint``.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
from pathlib import Path

import torch

from tinydit.checkpoints.checkpoint import Checkpoint
from tinydit.config import TRAJECTORY_FIELDS, TrainConfig
from tinydit.errors import TinyDiTError
from tinydit.models.registry import preset_config
from tinydit.runtime import resolve_compile

__all__ = [
    "began_compiled",
    "check_same_run",
    "check_same_schedule",
    "model_config_for",
    "restore",
    "GracefulInterrupt",
]


def check_same_run(cfg: TrainConfig, ckpt: Checkpoint, out: Path, preset: str | None = None) -> None:
    """Refuse to continue the run in ``ckpt`` with settings that change what it computes, or a checkpoint
    that lacks what a continuation needs. ``preset``: the run's, where it is not ``cfg``'s (a student's is
    its teacher's)."""
    missing = ckpt.missing_to_continue
    if missing:
        raise TinyDiTError(
            f"{out / 'checkpoint.pt'} lacks {', '.join(missing)}, so the run cannot be continued; "
            "start afresh with `overwrite` or choose another `out`"
        )
    old = ckpt.train()
    old_data, new_data = ckpt.data.name, cfg.data  # both canonical: ``cfg`` is resolved
    new = {name: getattr(cfg, name) for name in TRAJECTORY_FIELDS} | {"preset": preset or cfg.preset}
    changed = [
        f"{name}: {getattr(old, name)!r} -> {new[name]!r}"
        for name in TRAJECTORY_FIELDS
        if name != "data"
        and getattr(old, name) != new[name]
        # The cool-down's share of a time budget matters only once its plan is made (the decay begins then).
        and not (name == "cooldown_frac" and ckpt.plan is None)
    ]
    if old_data != new_data:
        changed.insert(0, f"data: {old_data!r} -> {new_data!r}")
    if changed:
        raise TinyDiTError(
            f"{out} holds a run with other settings ({'; '.join(changed)}); "
            "re-run with the same settings to continue it, or choose another `out` (or `overwrite`)"
        )
    check_same_schedule(old, cfg, ckpt.step, out)


def check_same_schedule(old: TrainConfig, new: TrainConfig, step: int, out: Path) -> None:
    """``steps`` and ``cooldown`` may change between invocations only while no step done so far is
    affected (without a cool-down on either side, both starts are inf and nothing is)."""
    changed = (old.steps, old.cooldown) != (new.steps, new.cooldown)
    if changed and step > min(old.cooldown_start(), new.cooldown_start()):
        raise TinyDiTError(
            f"{out} is at step {step}, past the start of a learning-rate cool-down "
            f"(`steps` {old.steps} `cooldown` {old.cooldown} before, `steps` {new.steps} `cooldown` "
            f"{new.cooldown} now), so its schedule is fixed: finish it with `steps` {old.steps} `cooldown` "
            f"{old.cooldown}, or train another run (`out`, `overwrite`)"
        )


def model_config_for(
    cfg: TrainConfig, fields: dict, ckpt: Checkpoint | None, teacher: Checkpoint | None, objective_fields: dict
):
    """The run's model config: the preset with the data's ``fields``, the run's switches and its objective's
    inputs (``objective_fields``, ``Objective.model_fields``); a student's is its teacher's with its
    objective's inputs. A continued run keeps the architecture it started with, even if its preset has
    changed since (presets follow the ablations); only the data must still fit."""
    if teacher is not None:
        return dataclasses.replace(teacher.config, **objective_fields)
    config = preset_config(cfg.model, cfg.preset, **fields, **cfg.arch_overrides(), **objective_fields, cond=cfg.cond)
    if ckpt is not None and all(getattr(ckpt.config, f) == getattr(config, f) for f in fields):
        return ckpt.config
    return config


def began_compiled(ckpt: Checkpoint | None, device: torch.device, precision: str, minutes: float | None) -> bool | None:
    """Whether the run in ``ckpt`` compiled, where it trained on this kind of device in this precision: under
    `compile` auto a continuation keeps that, as it keeps its token-linear kernel (the two round differently),
    whatever the machine record says now. None for a new run, or one that trained on another device or in
    another precision. A checkpoint written before this was kept compiled as `auto` then chose: by the
    `minutes` alone (``resolve_compile``)."""
    saved = ckpt.kernels if ckpt is not None else None
    if saved is None or (saved["device"], saved["precision"]) != (device.type, precision):
        return None
    return saved["compiled"] if "compiled" in saved else resolve_compile("auto", device, minutes)


def restore(ckpt: Checkpoint, kind: str, config, classes: list[str], model, ema, opt, scaler) -> tuple[int, float]:
    """Load a checkpoint into the run's model, EMA, optimizer and gradient scaler; returns (step, seconds)."""
    if ckpt.model_type != kind or ckpt.config != config:
        raise TinyDiTError(f"{ckpt.source} holds another model ({ckpt.config.to_dict()}); choose another `out`")
    if list(ckpt.data.classes) != list(classes):
        raise TinyDiTError(
            f"the classes of the data changed since {ckpt.source} was written ({list(ckpt.data.classes)} "
            f"-> {list(classes)}); choose another `out`"
        )
    model.load_state_dict(ckpt.model)
    ema.load_state_dict(ckpt.ema)
    opt.load_state_dict(ckpt.optimizer)
    if ckpt.grad_scaler is not None and scaler.is_enabled():
        scaler.load_state_dict(ckpt.grad_scaler)
    torch.set_rng_state(ckpt.rng["torch"])
    if torch.cuda.is_available() and ckpt.rng.get("cuda"):
        torch.cuda.set_rng_state_all(ckpt.rng["cuda"])
    return ckpt.step, float(ckpt.train_seconds)


class GracefulInterrupt:
    """The first Ctrl-C (SIGINT) or SIGTERM (a scheduler's preemption, torchrun passing on a stop) asks
    the loop to stop at the next step boundary, so the checkpoint holds a whole step; a second one
    interrupts at once, leaving the last checkpoint as it was."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self) -> GracefulInterrupt:
        self.requested = False
        self._previous: dict = {}
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        what = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        print(
            f"\n{what}: stopping after this step to save a checkpoint (Ctrl-C again to abort without saving)",
            file=sys.stderr,
        )

    def __exit__(self, *exc) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, signal.SIG_DFL if previous is None else previous)  # None: set outside Python
