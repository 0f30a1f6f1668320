"""Learning-rate schedules for time budgets (`--minutes M --cooldown-frac F`): when the time left holds
the last F of the run's steps at its measured rate, the run plans its step count, cools the rate down
linearly over those last steps, and continues
exactly from a checkpoint. A fake clock stands in for the machine: every reading advances it 0.01 s,
so the plan is the same in every process that runs the same code path."""

import json
import shutil
import signal

import pytest
import torch
from conftest import fast_config

import tinydit.train.trainer as trainer_module
from tinydit.checkpoints.checkpoint import load_checkpoint
from tinydit.errors import TinyDiTError
from tinydit.train import Trainer
from tinydit.train.budget import PLAN_AT
from tinydit.train.resolve import BUDGET_COOLDOWN_FRAC, resolve

KW = dict(steps=None, minutes=0.025, cooldown_frac=0.3, batch_size=8, limit=20, warmup=2, log_every=5, val_every=10**6)


def _lrs(run) -> dict[int, float]:
    return {r["step"]: r["lr"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "lr" in r}


def test_a_time_budget_run_plans_its_steps_and_cools_down_to_its_last_step(tmp_path, clock):
    trainer = Trainer(fast_config(tmp_path, **KW), progress=False)
    result = trainer.fit()
    plan = load_checkpoint(tmp_path / "checkpoint.pt").plan
    assert plan["minutes"] == KW["minutes"] and result.step == plan["steps"]  # it ended where it planned to
    assert abs(plan["cooldown"] - KW["cooldown_frac"] * plan["steps"]) <= 2  # the last F of the steps ...
    assert plan["planned_at"] == plan["steps"] - plan["cooldown"]  # ... planned as their decay begins
    assert plan["planned_at"] > 0.5 * plan["steps"]
    assert result.train_seconds >= PLAN_AT * KW["minutes"] * 60
    lrs = [trainer.budget.lr_at(s) for s in range(plan["steps"])]
    start = plan["steps"] - plan["cooldown"]
    peak = trainer.cfg.lr
    assert lrs[start - 1] == pytest.approx(peak)  # constant until the cool-down ...
    assert all(a > b for a, b in zip(lrs[start:-1], lrs[start + 1 :], strict=True))  # ... then falling every step ...
    assert lrs[-1] == pytest.approx(peak / plan["cooldown"])  # ... to lr / C at the last step
    assert _lrs(tmp_path)[plan["steps"]] == pytest.approx(lrs[-1])


def test_a_stopped_time_budget_run_continues_exactly(tmp_path, clock):
    straight = Trainer(fast_config(tmp_path / "a", **KW), progress=False)
    straight.fit()
    plan = load_checkpoint(tmp_path / "a" / "checkpoint.pt").plan
    stop_at = plan["steps"] - plan["cooldown"] // 2  # inside the cool-down
    clock[0] = 0.0
    original = Trainer.train_step

    def interrupted(self):
        if self.run.step == stop_at - 1:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C: a checkpoint after this step
        return original(self)

    trainer_module.Trainer.train_step = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            Trainer(fast_config(tmp_path / "b", **KW), progress=False).fit()
    finally:
        trainer_module.Trainer.train_step = original
    stopped = load_checkpoint(tmp_path / "b" / "checkpoint.pt")
    assert stopped.step == stop_at and stopped.plan == plan
    # Once the cool-down has begun the schedule is fixed: another budget is refused, naming the way out
    with pytest.raises(TinyDiTError, match="inside the learning-rate cool-down planned for `minutes` 0.025"):
        Trainer(fast_config(tmp_path / "b", **{**KW, "minutes": 0.05}), progress=False)
    resumed = Trainer(fast_config(tmp_path / "b", **KW), progress=False)
    resumed.fit()
    assert resumed.run.step == plan["steps"]
    a, b = straight.run.model.state_dict(), resumed.run.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_cooldown_frac_is_checked():
    with pytest.raises(TinyDiTError, match="give `minutes`"):
        fast_config("x", steps=10, cooldown_frac=0.2)
    with pytest.raises(TinyDiTError, match=r"`cooldown_frac` must be in \[0, 0.8\]"):
        fast_config("x", steps=None, minutes=1.0, cooldown_frac=0.9)
    with pytest.raises(TinyDiTError, match="give one cool-down"):
        fast_config("x", steps=100, minutes=1.0, cooldown=10, cooldown_frac=0.2)


def test_a_time_budget_cools_down_by_default_and_an_earlier_run_continues_under_it(tmp_path, clock):
    assert resolve(fast_config("x", steps=None, minutes=1.0)).cooldown_frac == BUDGET_COOLDOWN_FRAC
    assert resolve(fast_config("x", steps=10)).cooldown_frac == 0.0  # a `steps` run: `cooldown` says
    assert resolve(fast_config("x", steps=100, minutes=1.0, cooldown=10)).cooldown_frac == 0.0
    # A run made without a cool-down (as before the default) and stopped before any plan continues under it:
    # nothing it computed depended on the share
    off = {**KW, "cooldown_frac": 0.0, "minutes": 0.005}
    Trainer(fast_config(tmp_path, **off), progress=False).fit()
    assert load_checkpoint(tmp_path / "checkpoint.pt").plan is None
    resumed = Trainer(fast_config(tmp_path, **{**KW, "cooldown_frac": None}), progress=False)
    resumed.fit()
    plan = load_checkpoint(tmp_path / "checkpoint.pt").plan
    assert plan["minutes"] == KW["minutes"] and resumed.run.step == plan["steps"]
    assert abs(plan["cooldown"] - BUDGET_COOLDOWN_FRAC * plan["steps"]) <= 2


def _interrupted_at(step: int):
    """Trainer.train_step, with Ctrl-C during the step that ends at ``step`` (a checkpoint after it)."""
    original = Trainer.train_step

    def interrupted(self):
        if self.run.step == step - 1:
            signal.raise_signal(signal.SIGINT)
        return original(self)

    return interrupted


def test_a_finished_time_budget_run_given_more_minutes_is_extended_and_the_extension_continues_exactly(
    tmp_path, clock, capsys, monkeypatch
):
    Trainer(fast_config(tmp_path / "a", **KW), progress=False).fit()
    first = load_checkpoint(tmp_path / "a" / "checkpoint.pt")
    assert first.step == first.plan["steps"]  # finished: its cool-down ran to its last step
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    more = {**KW, "minutes": 2 * KW["minutes"]}
    capsys.readouterr()
    clock[0] = 0.0
    straight = Trainer(fast_config(tmp_path / "a", **more), progress=False)
    straight.fit()
    assert (
        f"extending a finished 0.025-minute run to 0.05 minutes from step {first.step}: the learning rate is back "
        "at its peak and falls again over the last 0.3 of the added time, so the run will not equal one run of "
        "0.05 minutes"
    ) in capsys.readouterr().err.splitlines()
    plan = load_checkpoint(tmp_path / "a" / "checkpoint.pt").plan
    assert plan["minutes"] == more["minutes"] and plan["from_step"] == first.step
    assert straight.run.step == plan["steps"] > first.step
    added = plan["steps"] - first.step  # a new cool-down over the last share of the added steps ...
    assert abs(plan["cooldown"] - KW["cooldown_frac"] * added) <= 2
    lrs, peak = _lrs(tmp_path / "a"), straight.cfg.lr
    assert straight.budget.lr_at(first.step) == pytest.approx(peak)  # ... after the peak again, at once
    assert lrs[plan["steps"]] == pytest.approx(peak / plan["cooldown"])
    records = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert {"step": first.step, "extends": first.plan, "plan": {"minutes": 0.05, "from_step": first.step}} in records
    # Stopped inside its cool-down, the extension continues to the weights of the one left alone
    clock[0] = 0.0
    with monkeypatch.context() as m:
        m.setattr(trainer_module.Trainer, "train_step", _interrupted_at(plan["steps"] - plan["cooldown"] // 2))
        with pytest.raises(KeyboardInterrupt):
            Trainer(fast_config(tmp_path / "b", **more), progress=False).fit()
    assert load_checkpoint(tmp_path / "b" / "checkpoint.pt").plan == plan
    resumed = Trainer(fast_config(tmp_path / "b", **more), progress=False)
    resumed.fit()
    assert resumed.run.step == plan["steps"]
    a, b = straight.run.model.state_dict(), resumed.run.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
