"""What a run does between its steps, each every so many steps: log the loss since the last log line,
validate, draw the sample grid, evaluate (keeping the best checkpoint as best.pt) and checkpoint.

``Events`` decides when, from the config's intervals, and keeps what the events leave (the log window, the
best evaluation so far, the last validation losses and grid), which the trainer reads back for its
checkpoint and report; what each event computes with the run's parts, the trainer gives it as ``Actions``.
Rank 0 alone validates, draws, evaluates and writes; every rank takes part in the logged loss's
reduction and keeps the same clock of seconds trained.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from tinydit.config import TrainConfig
from tinydit.errors import TinyDiTError
from tinydit.eval.evaluate import default_best_metric, lower_is_better
from tinydit.flow.objectives import objective_named
from tinydit.flow.path import N_T_BINS, t_bins
from tinydit.train.budget import Clock

__all__ = ["Window", "Actions", "Events", "best_metric"]


class Window:
    """The training loss since the last log line, summed on the device (no sync per step), overall and per
    bin of t, and the images per second of the training steps in it."""

    def __init__(self, device: torch.device, step: int):
        self.loss, self.n = torch.zeros((), device=device), 0
        self.repa_loss: torch.Tensor | None = None  # REPA's alignment loss, summed, where the run aligns
        self.bin_loss = torch.zeros(N_T_BINS, device=device)
        self.bin_count = torch.zeros(N_T_BINS, device=device)
        self.started, self.step = Clock.now(), step

    def add(self, loss: torch.Tensor) -> None:
        self.loss += loss
        self.n += 1

    def add_times(self, t: torch.Tensor, per_sample: torch.Tensor, repa_loss: torch.Tensor | None = None) -> None:
        """The per-image losses (n,) of plain flow matching at their times t (n,), into the bins of t; and the
        step's REPA alignment loss, where the run aligns."""
        if repa_loss is not None:
            repa_loss = repa_loss.detach()
            self.repa_loss = repa_loss if self.repa_loss is None else self.repa_loss + repa_loss
        bins = t_bins(t)
        self.bin_loss.index_add_(0, bins, per_sample.detach().float())
        self.bin_count.index_add_(0, bins, torch.ones_like(t))

    def skip(self, seconds: float) -> None:
        """Time spent in the window that is not training (an evaluation)."""
        self.started += seconds

    def close(self, step: int, log, world, batch_size: int, budget, seconds: float) -> torch.Tensor:
        """Log the window (the global batch's mean loss, per bin of t, rate, time) into ``log`` at ``step`` after
        ``seconds`` trained, and start the next; returns the loss per bin of t."""
        now = Clock.now()
        img_s = (step - self.step) * batch_size / max(now - self.started, 1e-9)
        loss = world.sum(self.loss / self.n) / world.size
        by_t = world.sum(self.bin_loss) / world.sum(self.bin_count)
        repa = None if self.repa_loss is None else (world.sum(self.repa_loss / self.n) / world.size).item()
        log.window(step, loss.item(), img_s, budget.lr_at(step - 1), seconds, by_t, budget.seconds_left(seconds), repa)
        self.bin_loss.zero_(), self.bin_count.zero_(), self.loss.zero_()
        self.repa_loss = None
        self.n, self.started, self.step = 0, now, step
        return by_t


def best_metric(cfg, data_name: str, text: bool) -> tuple[str, bool]:
    """The metric `eval_every` keeps best.pt by, and whether lower is better."""
    try:
        metric, _ = default_best_metric(data_name, text)
    except TinyDiTError as err:
        raise TinyDiTError(
            f"`eval_every` scores samples with an offline feature network, which fashion-mnist and "
            f"shapes have and {data_name} has not ({err})"
        ) from None
    if cfg.best_metric != "auto":
        metric = cfg.best_metric
    return metric, lower_is_better(metric)


@dataclass(frozen=True)
class Actions:
    """What the events do with the run's parts (the trainer's methods): validate (the raw weights' and the
    EMA's loss, and the EMA's per bin), draw the sample grid at a step (its file), score the EMA's samples
    (the metrics), and save a checkpoint (to the run's checkpoint.pt, or to the path given)."""

    validate: Callable[[], tuple[float, float, list[float]]]
    draw_grid: Callable[[int], Path]
    score: Callable[[], dict[str, float]]
    save: Callable[..., Path]


class Events:
    """When each periodic event of a run's loop fires (the ``cfg``'s intervals), and what the events keep:
    the log window, the best evaluation so far, the last validation losses and grid."""

    def __init__(
        self,
        cfg: TrainConfig,
        run,
        log,
        world,
        budget,
        batch_size: int,
        actions: Actions,
        best_metric: tuple[str, bool] | None,
        best: dict | None = None,
    ):
        self.cfg, self.run, self.log, self.world, self.budget = cfg, run, log, world, budget
        self.batch_size, self.actions, self.best_metric = batch_size, actions, best_metric
        self.best = best  # {metric, value, step} of best.pt, kept here and written into every checkpoint
        self.window = Window(run.device, run.step)
        self.clock: Clock | None = None  # the loop's, from ``start``
        self.val = self.val_ema = self.samples = None
        self.by_t: list[float] = []

    def start(self, clock: Clock) -> None:
        """The loop begins, its seconds trained on ``clock``: a fresh log window."""
        self.clock, self.window = clock, Window(self.run.device, self.run.step)

    def fire(self, step: int, stop: bool) -> None:
        """Every event due at ``step`` (the log line also when the loop stops)."""
        cfg, main = self.cfg, self.world.main
        if step % cfg.log_every == 0 or stop:
            self.by_t = self.window.close(step, self.log, self.world, self.batch_size, self.budget, self.clock())
        if step % cfg.val_every == 0 and main:
            self.validate()
        if step % cfg.sample_every == 0 and main:
            self.sample_grid()
        if cfg.eval_every and step % cfg.eval_every == 0 and main:
            seconds = self.evaluate()
            self.window.skip(seconds)  # images per second count training time only
            if cfg.eval_budget == "outside":
                self.clock.pause(seconds)
        if step % cfg.ckpt_every == 0:
            self.run.train_seconds = self.clock()
            if main:
                self.actions.save()

    def finish(self, step: int) -> None:
        """Rank 0 at the end: the measurements not made at this very step, then the last checkpoint."""
        cfg = self.cfg
        if step % cfg.val_every:
            self.validate()
        if step % cfg.sample_every:
            self.sample_grid()
        if cfg.eval_every and step % cfg.eval_every:
            self.evaluate()
        self.actions.save()

    def validate(self) -> None:
        """The validation loss of the raw weights and of the EMA (also per bin of t) into metrics.jsonl."""
        self.val, self.val_ema, self.by_t = self.actions.validate()
        key = "val_loss_ema_by_steps" if objective_named(self.cfg.objective).teacher else "val_loss_ema_by_t"
        record = {"val_loss": self.val, "val_loss_ema": self.val_ema, key: [round(v, 5) for v in self.by_t]}
        self.log.record({"step": self.run.step, **record})

    def sample_grid(self) -> Path:
        """The EMA's sample grid at this step, into the log."""
        self.samples = self.actions.draw_grid(self.run.step)
        self.log.image("samples", self.run.step, self.samples)
        return self.samples

    def evaluate(self) -> float:
        """Score the EMA's samples into metrics.jsonl and keep the best as best.pt; returns the seconds it took."""
        t0 = Clock.now()
        metric, lower = self.best_metric  # chosen once, when the run was set up
        metrics = self.actions.score()
        if metric not in metrics:
            raise TinyDiTError(
                f"`best_metric` {metric!r} is not among the evaluation's metrics ({', '.join(sorted(metrics))})"
            )
        value, step = metrics[metric], self.run.step
        best = self.best is None or (value < self.best["value"] if lower else value > self.best["value"])
        if best:
            self.best = {"metric": metric, "value": value, "step": step}
            self.actions.save("best.pt")
        seconds = Clock.now() - t0
        evaluation = {f"eval/{k}": v for k, v in metrics.items()}
        self.log.record({"step": step, **evaluation, "eval_seconds": seconds, "best_metric": metric, "eval_best": best})
        return seconds
