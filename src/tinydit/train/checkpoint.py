"""Writing checkpoints, and checking that a continuation is the same run as the one on disk.

A checkpoint (read back by ``tinydit.models.checkpoint``) holds everything needed to sample from a run
or to continue it exactly; it is written through the one atomic writer, so an interrupted save keeps
the previous checkpoint whole.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
from pathlib import Path

import torch

from tinydit.config import TRAJECTORY_FIELDS, TrainConfig
from tinydit.errors import TinyDiTError
from tinydit.files import torch_save
from tinydit.flow.meanflow import TIME_SCALE as MEANFLOW_TIME_SCALE
from tinydit.models.checkpoint import FORMAT, FORMAT_VERSION
from tinydit.models.registry import config_from_dict, preset_config
from tinydit.version import __version__

__all__ = [
    "save_checkpoint",
    "check_same_run",
    "check_same_schedule",
    "model_config_for",
    "restore",
    "GracefulInterrupt",
]


def save_checkpoint(path: str | Path, state: dict) -> None:
    """Write ``state`` (plus the format fields) to ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT, "format_version": FORMAT_VERSION, "tinydit_version": __version__, **state}
    torch_save(path, payload)


def check_same_run(cfg: TrainConfig, state: dict, out: Path, preset: str | None = None) -> None:
    """Refuse to continue the run in ``state`` with settings that change what it computes, or a checkpoint
    that lacks what a continuation needs. ``preset``: the run's, where it is not ``cfg``'s (a student's is
    its teacher's)."""
    missing = [k for k in ("model", "ema", "optimizer", "train_seconds", "rng") if k not in state]
    if missing:
        raise TinyDiTError(
            f"{out / 'checkpoint.pt'} lacks {', '.join(missing)}, so the run cannot be continued; "
            "start afresh with `overwrite` or choose another `out`"
        )
    old = TrainConfig.from_dict(state["train_config"])
    old_data, new_data = state["data"]["name"], cfg.data  # both canonical: ``cfg`` is resolved
    new = {name: getattr(cfg, name) for name in TRAJECTORY_FIELDS} | {"preset": preset or cfg.preset}
    changed = [
        f"{name}: {getattr(old, name)!r} -> {new[name]!r}"
        for name in TRAJECTORY_FIELDS
        if name != "data"
        and getattr(old, name) != new[name]
        # The cool-down's share of a time budget matters only once its plan is made (the decay begins then).
        and not (name == "cooldown_frac" and state.get("plan") is None)
    ]
    if old_data != new_data:
        changed.insert(0, f"data: {old_data!r} -> {new_data!r}")
    if changed:
        raise TinyDiTError(
            f"{out} holds a run with other settings ({'; '.join(changed)}); "
            "re-run with the same settings to continue it, or choose another `out` (or `overwrite`)"
        )
    check_same_schedule(old, cfg, int(state["step"]), out)


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


def model_config_for(cfg: TrainConfig, fields: dict, state: dict | None, teacher: dict | None):
    """The run's model config: the preset with the data's ``fields`` and the run's switches; a student's
    is its teacher's with the step-size input. A continued run keeps the architecture it started with,
    even if its preset has changed since (presets follow the ablations); only the data must still fit."""
    if teacher is not None:
        return dataclasses.replace(config_from_dict(cfg.model, teacher["model_config"]), shortcut=True)
    config = preset_config(
        cfg.model,
        cfg.preset,
        **fields,
        **cfg.arch_overrides(),
        shortcut=cfg.few_step in ("shortcut", "meanflow"),
        **({"time_scale": MEANFLOW_TIME_SCALE} if cfg.few_step == "meanflow" else {}),
        cond=cfg.cond,
    )
    if state is not None:
        stored = config_from_dict(cfg.model, state["model_config"])
        if all(getattr(stored, f) == getattr(config, f) for f in fields):
            return stored
    return config


def restore(
    state: dict, path: Path, kind: str, config, classes: list[str], model, ema, opt, scaler
) -> tuple[int, float]:
    """Load a checkpoint into the run's model, EMA, optimizer and gradient scaler; returns (step, seconds)."""
    if config_from_dict(kind, state["model_config"]) != config:
        raise TinyDiTError(f"{path} holds another model ({state['model_config']}); choose another `out`")
    if state["data"]["classes"] != classes:
        raise TinyDiTError(
            f"the classes of the data changed since {path} was written ({state['data']['classes']} "
            f"-> {classes}); choose another `out`"
        )
    model.load_state_dict(state["model"])
    ema.load_state_dict(state["ema"])
    opt.load_state_dict(state["optimizer"])
    if "grad_scaler" in state and scaler.is_enabled():
        scaler.load_state_dict(state["grad_scaler"])
    torch.set_rng_state(state["rng"]["torch"])
    if torch.cuda.is_available() and state["rng"].get("cuda"):
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return int(state["step"]), float(state["train_seconds"])


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
