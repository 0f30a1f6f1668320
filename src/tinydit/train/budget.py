"""When a run stops and how its learning rate runs: the ``Budget`` (steps or minutes, the warm-up, the
cool-down and its plan, whether compiling pays, and the pace this process trains at) and the ``Clock`` of
the seconds trained.

A `steps` run knows its schedule from the start. A `minutes` run with a cool-down (``cooldown_frac``)
cannot: its step count depends on the machine's rate. It plans once, as late as the decay allows (when
the steps the time left holds at the measured rate are the cool-down's share of the run), and keeps that
plan in its checkpoint, so a continuation follows the same schedule.

The pace of a CPU `minutes` run (the seconds to its first step, its steps per second after it) is kept in
the machine record under the kind of run it is (``speed_key``), whether it compiled and from which cache, so
that `compile` auto weighs the two ways by what they measured on this machine (``tinydit.runtime``).

A finished `minutes` run given more minutes is extended: from the step it stopped at (the plan's
``from_step``), the learning rate is back at its peak, with no new warm-up, and a new cool-down is
planned over the last share of the added time, as a run of its own. It is not what one run of the
whole time would have trained. The extension's plan is kept in the checkpoint like any other, so a
stopped extension continues exactly.
"""

from __future__ import annotations

import time

import torch

from tinydit.config import TrainConfig
from tinydit.errors import TinyDiTError
from tinydit.flow.objectives import DEFAULT_OBJECTIVE
from tinydit.runtime import CompileChoice, choose_compile
from tinydit.train import optim

__all__ = ["Budget", "Clock", "PLAN_AT", "PLAN_MARGIN", "speed_key"]

# A time-budget run measures its rate once this share of its budget has passed in the process (compiling,
# caching and the first grid come before; the rate is steady by then); its cool-down must start after that.
PLAN_AT = 0.1
# A time-budget run plans to end at this share of the time left when its cool-down begins: the budget is
# a promise, and the rate can still fall (a sample grid, the validation batch, a busy machine). If it
# falls further than that, the clock still ends the run, mid-cool-down.
PLAN_MARGIN = 0.9


def speed_key(cfg: TrainConfig, preset: str, precision: str, processes: int) -> str:
    """The kind of run resolved ``cfg`` is, as far as the cost of its steps goes (the model and its switches,
    the data, the objective, the precision, the batch and the processes; ``preset`` is the run's, a student's
    its teacher's): runs of one kind compile the same graphs and train at one pace on a machine. The machine
    record keeps their pace under it, in words."""
    switches = [f"{name} {value}" for name, value in sorted(cfg.arch_overrides().items())]
    objective = [cfg.objective] if cfg.objective != DEFAULT_OBJECTIVE else []
    return ", ".join(
        [
            f"{cfg.model} {preset}",
            f"{cfg.data} {cfg.cond}",
            *switches,
            *objective,
            *(["repa"] if cfg.repa else []),  # the encoder's pass; its weight costs nothing
            precision,
            f"batch {cfg.batch_size}",
            *([f"{processes} processes"] if processes > 1 else []),
        ]
    )


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
    ``plan``), ``step`` the step it continues from and ``seconds`` the training time it has had.

    A plan is {"minutes", "from_step"} until its steps are planned, then also {"steps", "cooldown",
    "planned_at", "steps_per_second"}; ``from_step`` (0 where absent) is where an extension began."""

    def __init__(
        self, cfg: TrainConfig, step: int = 0, plan: dict | None = None, where: str = "the run", seconds: float = 0.0
    ):
        self.cfg = cfg
        self.total_seconds = cfg.minutes * 60 if cfg.minutes is not None else None  # the time budget, once
        self.extended: dict | None = None  # the finished plan this invocation extends, if it does
        if plan is not None and plan["minutes"] != cfg.minutes:
            plan = self._replan(plan, step, seconds, where)
        self.plan = plan
        self._start: tuple[int, float] = (step, 0.0)
        self._rate_from: tuple[int, float] | None = None
        self._before = seconds  # trained by earlier invocations: this process's pace is measured from there
        self._first: tuple[int, float] | None = None  # (step, seconds) as this process's first step ended
        self._last: tuple[int, float] | None = None  # ... and as its latest did

    def _replan(self, plan: dict, step: int, seconds: float, where: str) -> dict | None:
        """What becomes of ``plan`` under another time budget: planned again where nothing depended on it,
        an extension where the run it planned has finished and time is left, else refused: inside its
        cool-down, the schedule is fixed, as a `steps` run's is."""
        cfg = self.cfg
        if "steps" not in plan:  # an extension whose steps are not planned yet: it begins where it began
            return {**plan, "minutes": cfg.minutes}
        finished = step >= plan["steps"] or seconds >= plan["minutes"] * 60
        if finished:
            if self.total_seconds is not None and seconds < self.total_seconds:  # time added: an extension
                self.extended = plan
                return {"minutes": cfg.minutes, "from_step": step}
            return plan  # no time added: it stays done
        if step > plan["steps"] - plan["cooldown"]:
            raise TinyDiTError(
                f"{where} is at step {step}, inside the learning-rate cool-down planned for "
                f"`minutes` {plan['minutes']} (steps {plan['steps']}), so its schedule is fixed: "
                f"finish it with `minutes` {plan['minutes']} (a larger `minutes` then extends it), or train "
                "another run (`out`, `overwrite`)"
            )
        return None  # planned again: no step done so far depended on it

    def extension_note(self) -> str | None:
        """The line that says this invocation extends a finished `minutes` run, and how; None where it does not."""
        if self.extended is None:
            return None
        old, new, step = self.extended["minutes"], self.cfg.minutes, self.plan["from_step"]
        return (
            f"extending a finished {old:g}-minute run to {new:g} minutes from step {step}: the learning rate "
            f"is back at its peak and falls again over the last {self.cfg.cooldown_frac:g} of the added time, "
            f"so the run will not equal one run of {new:g} minutes"
        )

    def compile_choice(self, device: torch.device, kind: str, began: bool | None = None) -> CompileChoice:
        """Whether this run compiles its model, and why: under `auto`, a CPU time budget compiles where this
        machine's earlier runs of ``kind`` (``speed_key``) held more steps compiled; a continuation keeps
        what the run ``began`` with."""
        return choose_compile(self.cfg.compile, device, self.cfg.minutes, kind, began)

    def tick(self, step: int, seconds: float) -> None:
        """Rank 0's reading of the clock as each step ends: its pace (``pace``)."""
        if self._first is None:
            self._first = (step, seconds)
        self._last = (step, seconds)

    def pace(self) -> tuple[float, float] | None:
        """This process's (seconds until its first step ended, steps per second after it); None before a step
        after the first. The start-up holds all that the first step waited for (compiling, the first grid),
        so a budget of T seconds holds about rate * (T - start-up) steps, eager or compiled."""
        if self._first is None or self._last[0] == self._first[0]:
            return None
        (step0, seconds0), (step1, seconds1) = self._first, self._last
        return seconds0 - self._before, (step1 - step0) / max(seconds1 - seconds0, 1e-9)

    def start(self, step: int, seconds: float) -> None:
        """This process begins training at ``step`` with ``seconds`` already trained: the rate is measured from here."""
        self._start, self._rate_from = (step, seconds), None

    def lr_at(self, step: int) -> float:
        return optim.lr_at(self.cfg, step, self.plan)

    def steps_done(self, step: int) -> bool:
        if self.plan is not None and step >= self.plan.get("steps", float("inf")):
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
        if (self.plan is not None and "steps" in self.plan) or not self.cfg.cooldown_frac:
            return None
        begun = self.plan or {"minutes": self.cfg.minutes}  # an extension's: where it began
        left, rate = self._steps_left(step, seconds)
        if step == self._start[0] or left > self.cfg.cooldown_frac * (step - begun.get("from_step", 0) + left):
            return None
        left = max(left, 1)
        return {
            **begun,
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
            **(due or {**(self.plan or {"minutes": self.cfg.minutes}), "steps_per_second": None}),
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
