"""What a run does between its steps, each every so many steps: log the loss since the last log line,
validate, draw the sample grid, evaluate (keeping the best checkpoint as best.pt) and checkpoint.

The events read the run's parts from the ``Trainer`` they are given, as a callback does, and write through
its log; what they keep (the best evaluation so far, the last validation losses and grid) is theirs, and the
trainer reads it back for its checkpoint and report. The log window takes its parts as arguments.
Rank 0 alone validates, draws, evaluates and writes; every rank takes part in the logged loss's
reduction and keeps the same clock of seconds trained.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tinydit.compiling import eagerly
from tinydit.errors import TinyDiTError
from tinydit.eval.evaluate import default_best_metric, lower_is_better
from tinydit.eval.sampling import EvalTarget, score_model
from tinydit.flow.path import N_T_BINS, t_bins
from tinydit.runtime import autocast
from tinydit.train import optim
from tinydit.train.budget import Clock
from tinydit.train.diagnostics import sample_grid

__all__ = ["Window", "Events", "best_metric"]


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


class Events:
    """The periodic events of ``trainer``'s loop, and the last of each when it ends."""

    def __init__(self, trainer, best: dict | None = None):
        self.trainer = trainer
        self.best = best  # {metric, value, step} of best.pt, kept here and written into every checkpoint
        self.window = Window(trainer.device, trainer.run.step)
        self.val = self.val_ema = self.samples = None
        self.by_t: list[float] = []

    def start(self, step: int) -> None:
        """The loop begins at ``step``: a fresh log window."""
        self.window = Window(self.trainer.device, step)

    def fire(self, step: int, stop: bool) -> None:
        """Every event due at ``step`` (the log line also when the loop stops)."""
        tr, cfg, main = self.trainer, self.trainer.cfg, self.trainer.world.main
        if step % cfg.log_every == 0 or stop:
            self.by_t = self.window.close(step, tr.log, tr.world, tr.batch_size, tr.budget, tr.clock())
        if step % cfg.val_every == 0 and main:
            self.validate()
        if step % cfg.sample_every == 0 and main:
            self.sample_grid()
        if cfg.eval_every and step % cfg.eval_every == 0 and main:
            seconds = self.evaluate()
            self.window.skip(seconds)  # images per second count training time only
            if cfg.eval_budget == "outside":
                tr.clock.pause(seconds)
        if step % cfg.ckpt_every == 0:
            tr.run.train_seconds = tr.clock()
            if main:
                tr.save()

    def finish(self, step: int) -> None:
        """Rank 0 at the end: the measurements not made at this very step, then the last checkpoint."""
        cfg = self.trainer.cfg
        if step % cfg.val_every:
            self.validate()
        if step % cfg.sample_every:
            self.sample_grid()
        if cfg.eval_every and step % cfg.eval_every:
            self.evaluate()
        self.trainer.save()

    def validate(self) -> None:
        """The validation loss of the raw weights and of the EMA (also per bin of t) into metrics.jsonl."""
        tr = self.trainer
        with eagerly():  # the model's compiled blocks (regional compilation) run as they are
            self.val = tr.validation_losses(tr.run.model)[0]
            self.val_ema, self.by_t = tr.validation_losses(tr.run.ema)
        key = "val_loss_ema_by_steps" if tr.teacher is not None else "val_loss_ema_by_t"
        tr.log.record(
            {
                "step": tr.run.step,
                "val_loss": self.val,
                "val_loss_ema": self.val_ema,
                key: [round(v, 5) for v in self.by_t],
            }
        )

    def sample_grid(self) -> Path:
        """EMA samples from the same noise at every step, into samples/step_NNNNNN.png and samples.png."""
        tr = self.trainer
        cfg = tr.cfg
        # what `tinydit sample --steps --cfg-scale` would draw: the record, with the flags of the run's grids
        settings = tr.sampling.with_flags(steps=cfg.sample_steps, cfg_scale=cfg.sample_cfg)
        path = tr.out / "samples" / f"step_{tr.run.step:06d}.png"
        with autocast(tr.device, tr.precision):
            sample_grid(
                tr.run.ema_forward,
                tr.data,
                tr.model_config,
                optim.step_generator(cfg.seed, 31),
                tr.device,
                settings,
                [path, tr.out / "samples.png"],
            )
        tr.log.image("samples", tr.run.step, path)
        self.samples = path
        return path

    @torch.no_grad()
    def evaluate(self) -> float:
        """Score ``eval_n`` EMA samples (in the run's precision, with the sampler settings the checkpoint
        records) into metrics.jsonl and keep the best as best.pt; returns the seconds it took."""
        tr = self.trainer
        t0 = Clock.now()
        metric, lower = tr.best_metric  # chosen once, when the run was set up
        # what the samples are asked to be: the run's own data, not a checkpoint's record of it
        classes = tuple(tr.data.train_set.classes)
        target = EvalTarget(tr.data.name, classes, tr.data.tokenizer, tr.cfg.held_out_phrases())
        with autocast(tr.device, tr.precision):  # the run's precision: its scores follow the run, not the machine
            metrics = score_model(
                tr.run.ema_forward,
                target,
                tr.cfg.eval_n,
                tr.sampling,
                seed=tr.cfg.seed,
                root=tr.cfg.data_root,
                progress=tr.progress,
            )
        if metric not in metrics:
            raise TinyDiTError(
                f"`best_metric` {metric!r} is not among the evaluation's metrics ({', '.join(sorted(metrics))})"
            )
        value = metrics[metric]
        best = self.best is None or (value < self.best["value"] if lower else value > self.best["value"])
        if best:
            self.best = {"metric": metric, "value": value, "step": tr.run.step}
            tr.checkpoint().save(tr.out / "best.pt")
        seconds = Clock.now() - t0
        tr.log.record(
            {
                "step": tr.run.step,
                **{f"eval/{k}": v for k, v in metrics.items()},
                "eval_seconds": seconds,
                "best_metric": metric,
                "eval_best": best,
            }
        )
        return seconds
