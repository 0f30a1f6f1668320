"""When a run stops and how its learning rate runs: the ``Budget`` (steps or minutes, the warm-up, the
cool-down and its plan, whether compiling pays) and the ``Clock`` of the seconds trained.

A `steps` run knows its schedule from the start. A `minutes` run with a cool-down (``cooldown_frac``)
cannot: its step count depends on the machine's rate. It plans once, as late as the decay allows (when
the steps the time left holds at the measured rate are the cool-down's share of the run), and keeps that
plan in its checkpoint, so a continuation follows the same schedule.
"""

from __future__ import annotations

import time

import torch

from tinydit.config import TrainConfig
from tinydit.errors import TinyDiTError
from tinydit.runtime import resolve_compile
from tinydit.train import optim

__all__ = ["Budget", "Clock", "PLAN_AT", "PLAN_MARGIN"]

# A time-budget run measures its rate once this share of its budget has passed in the process (compiling,
# caching and the first grid come before; the rate is steady by then); its cool-down must start after that.
PLAN_AT = 0.1
# A time-budget run plans to end at this share of the time left when its cool-down begins: the budget is
# a promise, and the rate can still fall (a sample grid, the validation batch, a busy machine). If it
# falls further than that, the clock still ends the run, mid-cool-down.
PLAN_MARGIN = 0.9


class Clock:
    """Seconds trained: those of earlier invocations plus this process's, less the pauses that do not count
    (an evaluation outside the budget)."""

    def __init__(self, before: float = 0.0):
        self.before, self.started = before, self.now()

    def __call__(self) -> float:
        return self.before + self.now() - self.started

    @staticmethod
    def now() -> float:
        """The one reading of the machine's time the training loop makes (tests replace it)."""
        return time.perf_counter()

    def pause(self, seconds: float) -> None:
        self.started += seconds


class Budget:
    """The stop rule and the learning-rate schedule of ``cfg``; ``plan`` is a continued run's (its checkpoint's
    ``plan``), ``step`` the step it continues from."""

    def __init__(self, cfg: TrainConfig, step: int = 0, plan: dict | None = None, where: str = "the run"):
        self.cfg = cfg
        self.total_seconds = cfg.minutes * 60 if cfg.minutes is not None else None  # the time budget, once
        if plan is not None and plan["minutes"] != cfg.minutes:
            # A new time budget is planned again, unless the old plan's cool-down has begun: then the
            # schedule is fixed, as a `steps` run's is.
            if step > plan["steps"] - plan["cooldown"]:
                raise TinyDiTError(
                    f"{where} is at step {step}, inside the learning-rate cool-down planned for "
                    f"`minutes` {plan['minutes']} (steps {plan['steps']}), so its schedule is fixed: "
                    f"finish it with `minutes` {plan['minutes']}, or train another run (`out`, "
                    "`overwrite`)"
                )
            plan = None
        self.plan = plan
        self._start: tuple[int, float] = (step, 0.0)
        self._rate_from: tuple[int, float] | None = None

    def compiles(self, device: torch.device) -> bool:
        """Whether this run compiles its model: a time budget long enough to win the compile time back."""
        return resolve_compile(self.cfg.compile, device, self.cfg.minutes)

    def start(self, step: int, seconds: float) -> None:
        """This process begins training at ``step`` with ``seconds`` already trained: the rate is measured from here."""
        self._start, self._rate_from = (step, seconds), None

    def lr_at(self, step: int) -> float:
        return optim.lr_at(self.cfg, step, self.plan)

    def steps_done(self, step: int) -> bool:
        if self.plan is not None and step >= self.plan["steps"]:
            return True
        return self.cfg.steps is not None and step >= self.cfg.steps

    def done(self, step: int, seconds: float) -> bool:
        return self.steps_done(step) or (self.total_seconds is not None and seconds >= self.total_seconds)

    def seconds_left(self, seconds: float) -> float | None:
        return self.total_seconds - seconds if self.total_seconds is not None else None

    def due_plan(self, step: int, seconds: float) -> dict | None:
        """Rank 0's plan of a `minutes` run with a cool-down, made when the steps left are the cool-down's
        share of the run (the decay begins at the next step), else None: the step count the time left
        reaches at the measured rate, the last ``cooldown`` of them falling.

        Planning as late as the decay allows uses the best measured rate; the steps before it do not
        depend on the plan (the rate is constant), so a continuation before it simply plans again."""
        if self.plan is not None or not self.cfg.cooldown_frac:
            return None
        left, rate = self._steps_left(step, seconds)
        if step == self._start[0] or left > self.cfg.cooldown_frac * (step + left):
            return None
        left = max(left, 1)
        return {
            "minutes": self.cfg.minutes,
            "steps": step + left,
            "cooldown": left,
            "planned_at": step,
            "steps_per_second": round(rate, 3),
        }

    def agree(self, due: dict | None, world, step: int) -> dict:
        """Every rank takes rank 0's plan (``due`` is None on the other ranks)."""
        mine = torch.tensor([due["steps"], due["cooldown"]] if due is not None else [0, 0])
        total, cooldown = (int(v) for v in world.sum(mine).tolist())
        self.plan = {
            **(due or {"minutes": self.cfg.minutes, "steps_per_second": None}),
            "steps": total,
            "cooldown": cooldown,
            "planned_at": step,
        }
        return self.plan

    def _steps_left(self, step: int, seconds: float) -> tuple[int, float]:
        """(steps the time left holds at the rate measured since the start-up, that rate in steps/s).

        The rate is measured from the first step after PLAN_AT of the budget has passed in this process
        (compilation, caching and the first grid come before), or over the whole process until then."""
        cfg = self.cfg
        if self._rate_from is None and seconds - self._start[1] >= PLAN_AT * self.total_seconds:
            self._rate_from = (step, seconds)
        step0, seconds0 = self._rate_from or self._start
        if step == step0:  # the measurement has only just begun: the whole process's rate until then
            step0, seconds0 = self._start
        rate = (step - step0) / max(seconds - seconds0, 1e-9)
        left = int((self.total_seconds - seconds) * rate * PLAN_MARGIN)
        return (min(left, cfg.steps - step) if cfg.steps is not None else left), rate
