"""The periodic events of a run's loop, apart from any trainer: when each fires, and which evaluation best.pt
keeps. Their actions are stand-ins that record their calls."""

from types import SimpleNamespace

import pytest
import torch
from conftest import fast_config

from tinydit.distributed import SINGLE
from tinydit.errors import TinyDiTError
from tinydit.train.budget import Budget, Clock
from tinydit.train.events import Actions, Events, Validation
from tinydit.train.resolve import resolve


class Log:
    def __init__(self):
        self.records, self.windows, self.images = [], [], []

    def record(self, rec: dict) -> None:
        self.records.append(rec)

    def window(self, step, loss, *rest) -> None:
        self.windows.append((step, round(loss, 6)))

    def image(self, tag, step, path) -> None:
        self.images.append(step)


def _events(tmp_path, scores, **intervals):
    cfg = resolve(fast_config(tmp_path, steps=12, **intervals))  # the defaults filled, as a trainer has them
    run = SimpleNamespace(step=0, device=torch.device("cpu"), train_seconds=0.0)
    calls = []

    def score():
        calls.append(("score", run.step))
        return {"fid_shapes_cnn": scores.pop(0), "fid_other": 1.0}

    actions = Actions(
        validate=lambda: (calls.append(("validate", run.step)), Validation(2.0, 1.5, [1.0, 2.0], 0.5, 0.4))[1],
        draw_grid=lambda step: (calls.append(("grid", step)), tmp_path / f"grid_{step}.png")[1],
        score=score,
        save=lambda name=None: (calls.append(("save", run.step, name or "checkpoint.pt")), tmp_path)[1],
    )
    log = Log()
    events = Events(cfg, run, log, SINGLE, Budget(cfg), 8, actions, ("fid_shapes_cnn", True))
    return events, run, log, calls


def test_each_event_fires_on_its_interval_and_best_pt_keeps_the_lowest_score(tmp_path):
    intervals = dict(log_every=3, val_every=4, sample_every=6, eval_every=4, ckpt_every=6)
    events, run, log, calls = _events(tmp_path, [5.0, 3.0, 4.0], **intervals)
    events.start(Clock(0.0))
    for step in range(1, 13):
        run.step = step
        events.window.add(torch.tensor(float(step)))
        events.fire(step, stop=step == 12)
    events.finish(12)
    assert [w[0] for w in log.windows] == [3, 6, 9, 12]
    assert log.windows[0] == (3, 2.0)  # the mean of the window's losses 1, 2, 3
    assert [c[1] for c in calls if c[0] == "validate"] == [4, 8, 12]
    assert [c[1] for c in calls if c[0] == "grid"] == [6, 12] == log.images
    assert [c[1] for c in calls if c[0] == "score"] == [4, 8, 12]
    # best.pt at the first evaluation and when the score fell (3 after 5), not when it rose (4)
    assert [c[1:] for c in calls if c[0] == "save"] == [
        (4, "best.pt"),
        (6, "checkpoint.pt"),
        (8, "best.pt"),
        (12, "checkpoint.pt"),
        (12, "checkpoint.pt"),  # finish: the last checkpoint, all measurements at 12 already made
    ]
    assert events.best == {"metric": "fid_shapes_cnn", "value": 3.0, "step": 8}
    assert (events.val, events.val_ema, events.by_t) == (2.0, 1.5, [1.0, 2.0])
    val = [r for r in log.records if "val_loss_ema_by_t" in r][-1]  # each loss under a name that says its times
    assert val == {
        "step": 12,
        "val_loss_even_t": 2.0,
        "val_loss_ema_even_t": 1.5,
        "val_loss_ema_by_t": [1.0, 2.0],
        "val_loss_train_t": 0.5,
        "val_loss_ema_train_t": 0.4,
    }
    evals = [r for r in log.records if "eval_best" in r]
    assert [r["eval_best"] for r in evals] == [True, True, False] and evals[0]["eval/fid_other"] == 1.0


def test_a_best_metric_the_evaluation_does_not_give_is_refused_by_name(tmp_path):
    events, run, _, _ = _events(tmp_path, [5.0], eval_every=4)
    events.best_metric = ("fid_missing", True)
    with pytest.raises(TinyDiTError, match="`best_metric` 'fid_missing' is not among"):
        events.evaluate()
