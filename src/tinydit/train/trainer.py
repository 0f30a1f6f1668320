"""The training loop: flow matching with AdamW, an EMA of the weights, validation, sample grids and
checkpoints, continued exactly when its run directory already holds a run.

Its parts each own one job: the ``Run`` (model, EMA, optimizer, step, kernels, the update), the ``Budget``
(when to stop, the learning-rate schedule), the ``Events`` (log, validate, grid, evaluate, checkpoint),
the ``RunData`` and a student's ``Distillation``. A step draws a batch, updates, agrees with the other
ranks on stopping (the time budget, Ctrl-C or SIGTERM on any of them) and fires what is due. Every
random draw of step s comes from a generator seeded with (seed, s) and made for the whole global batch,
each rank keeping its share, so a stopped run continues exactly, on any number of ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from tinydit import distributed
from tinydit.checkpoints.checkpoint import Checkpoint, load_checkpoint
from tinydit.compiling import eagerly, unwrap
from tinydit.config import TrainConfig
from tinydit.errors import TinyDiTError
from tinydit.eval.report import headline_scores
from tinydit.eval.run_report import write_run_report
from tinydit.eval.sampling import EvalTarget, score_model
from tinydit.files import RunDirLock, ensure_writable_dir
from tinydit.flow.guidance import null_condition
from tinydit.flow.objectives import Loss, Objective, StepBatch, with_loss
from tinydit.flow.path import sample_t
from tinydit.flow.settings import recommended_sampling
from tinydit.models.registry import build_model
from tinydit.paths import RUN, check_out, read_paths
from tinydit.runtime import autocast, compile_scope, record_run, resolve_device, resolve_precision
from tinydit.train import optim
from tinydit.train.budget import Budget, Clock, speed_key
from tinydit.train.checkpoint import GracefulInterrupt, began_compiled, check_same_run, model_config_for
from tinydit.train.data import BatchOrder, prepare_data
from tinydit.train.diagnostics import sample_grid, training_times, validation_losses
from tinydit.train.events import Actions, Events, Validation, best_metric
from tinydit.train.log import RunLog
from tinydit.train.repa import repa_encoder
from tinydit.train.resolve import resolve
from tinydit.train.run import Run, TrainResult
from tinydit.train.teacher import Distillation

__all__ = ["Trainer", "TrainResult"]


class Trainer:
    """Trains a DiT or an MMDiT with flow matching as ``cfg`` (resolved: ``self.cfg``) says, continuing ``cfg.out``.

    ``dataset`` (and ``val_dataset``): any map-style Dataset of (image (C, H, W) in [-1, 1], label) to
    train on instead of the data set ``cfg.data`` names (``tinydit.train.data``).

    The parts an experiment swaps are parameters, each defaulting to what ``cfg`` asks for: ``objective``
    (what a step minimises: an ``Objective`` of ``tinydit.flow.objectives``, the one ``cfg.objective``
    names, or a plain loss function in place of its loss), ``build_model`` ((kind, model config) -> the
    model, ``tinydit.models.registry.build_model``) and ``optimizer`` ((params, device, lr, weight_decay,
    fused) -> the optimizer, ``tinydit.train.optim.adamw``). A run continued with other parts than it
    started with is the caller's to judge: they are not recorded.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        overwrite: bool = False,
        require_resume: bool = False,
        progress: bool = True,
        dataset: Dataset | None = None,
        val_dataset: Dataset | None = None,
        *,
        objective: Objective | Loss | None = None,
        build_model: Callable[..., nn.Module] = build_model,
        optimizer: Callable[..., torch.optim.Optimizer] = optim.adamw,
    ):
        # its defaults filled for the data set, once
        self.cfg, self.progress = resolve(cfg, dataset), progress
        self.objective, self.parts = with_loss(self.cfg.objective, objective), (build_model, optimizer)
        self.out, self.ckpt_path = Path(cfg.out), Path(cfg.out) / "checkpoint.pt"
        # Held from before the checkpoint is read until fit() ends: one trainer per run directory.
        self.lock = RunDirLock(self.out)
        self.world = distributed.init(resolve_device(cfg.device))
        try:
            state = self._read(overwrite, require_resume, dataset, val_dataset)
            self._build(state, overwrite)
        except BaseException:
            self.lock.release()
            raise

    def _read(self, overwrite: bool, require_resume: bool, dataset, val_dataset) -> Checkpoint | None:
        """The checkpoint to continue (or None), the teacher of a student, and the data; then the run directory."""
        cfg, main = self.cfg, self.world.main  # only rank 0 locks, writes and prints
        self.device = self.world.device(resolve_device(cfg.device))
        self.precision = resolve_precision(cfg.precision, self.device)
        # before the lock, which writes into the folder: a folder that is not a run's is left as it was
        data_folder = cfg.data if Path(cfg.data).is_dir() else None
        check_out(self.out, RUN, read_paths(data_folder, cfg.teacher))
        if self.out.is_dir() and main:
            self.lock.acquire()
        self.teacher = Distillation(cfg) if self.objective.teacher else None
        self.preset = self.teacher.preset if self.teacher is not None else cfg.preset  # a student takes its teacher's
        state = None
        if self.ckpt_path.exists() and not overwrite:
            state = load_checkpoint(self.ckpt_path)
            check_same_run(cfg, state, self.out, self.preset)
        elif require_resume:
            raise TinyDiTError(f"`resume` given, but {self.ckpt_path} does not exist; drop `resume` to start a run")
        step, plan = (state.step, state.plan) if state is not None else (0, None)
        seconds = (state.train_seconds or 0.0) if state is not None else 0.0
        self.budget = Budget(cfg, step, plan, str(self.out), seconds)
        self.kind = speed_key(cfg, self.preset, self.precision, self.world.size)
        began = began_compiled(state, self.device, self.precision, cfg.minutes)
        self.compile_choice = self.budget.compile_choice(self.device, self.kind, began)
        self.compiled = self.compile_choice.compiles
        with self.world.main_first():  # rank 0 downloads, decodes and caches; the others then read its files
            self.data = prepare_data(cfg, state, dataset, val_dataset)
        if main:
            ensure_writable_dir(self.out)  # only now: nothing is created for a run whose inputs are wrong
            self.lock.acquire()
        return state

    def _build(self, state: Checkpoint | None, overwrite: bool) -> None:
        """The run's parts, from the checkpoint where it continues one."""
        cfg, main = self.cfg, self.world.main
        self.log = RunLog(self.out, self.progress, cfg.tensorboard, quiet=not main)
        self.text = cfg.cond == "text"
        # The sampler settings the checkpoint records for sampling it: a continued run keeps its record
        # (`tinydit sweep --apply` may have written it), a new one takes the measured best for its setup.
        self.sampling = (
            state.sampling_settings()
            if state is not None
            else recommended_sampling(self.data.name, self.preset, cfg.cond, cfg.objective)
        )
        # (the metric best.pt is kept by, lower is better): unsupported data fails now, not at the first evaluation
        self.best_metric = best_metric(cfg, self.data.name, self.text) if cfg.eval_every else None
        teacher_state = self.teacher.state if self.teacher is not None else None
        objective_fields = self.objective.model_fields()
        self.model_config = model_config_for(cfg, self.data.model_fields(), state, teacher_state, objective_fields)
        # A checkpoint from before the fused AdamW continues unfused: exact, and fp16's scaler keeps the unfused step.
        unfused = state is not None and not state.optimizer_fused
        student_of = teacher_state.ema if teacher_state is not None and state is None else None
        setup = (cfg.model, self.model_config, cfg, self.device, self.precision, self.world, self.compiled)
        self.run = Run(*setup, student_of, unfused, repa_encoder(cfg.repa, self.data.name), *self.parts)
        self.objective.check_model(unwrap(self.run.model), self.device, lambda: autocast(self.device, self.precision))
        if self.run.alignment is not None:  # the encoder runs once per training image, not once per step
            self.run.alignment.keep_targets(len(self.data.train_set))
        if state is not None:  # also keeps its token-linear kernel where the device and precision are the same
            self.run.restore(state, cfg.model, self.model_config, self.data.train_set.classes)
        elif overwrite and main:
            (self.out / "metrics.jsonl").unlink(missing_ok=True)
        if self.teacher is not None:  # a student trains on its teacher's paths
            self.teacher.prepare(self)
        n_train = len(self.teacher.paths) if self.teacher is not None else len(self.data.train_set)
        # where a step's draws come from: a student's teacher's paths, or the run's images
        self.draw = self._draw_paths if self.teacher is not None else self._draw_images
        self.batch_size = min(cfg.batch_size, n_train)
        distributed.check_split(self.batch_size, self.world.size)
        self.order = BatchOrder(n_train, self.batch_size, cfg.seed)
        # the validation's draw of the training times: fixed, so its curve is smooth from step to step
        self.val_times = training_times(len(self.data.val_set), cfg.t_sampling, cfg.t_shift)  # (n_val,)
        actions = Actions(self._validate, self._draw_grid, self._score, self.save)
        best = state.best if state is not None else None
        parts = (cfg, self.run, self.log, self.world, self.budget, self.batch_size)
        self.events = Events(*parts, actions, self.best_metric, best)
        if main:  # config.json: the resolved config and what the run runs on
            self.log.write_config(cfg, self.preset, self.data, self.model_config, self.run, self.world.size)

    def checkpoint(self) -> Checkpoint:
        """The checkpoint: everything needed to sample from the run or to continue it exactly."""
        return Checkpoint(
            model_type=self.cfg.model,
            config=self.model_config,
            train_config={**self.cfg.to_dict(), "preset": self.preset},
            data=self.data.record(),
            tokenizer=self.data.tokenizer.to_dict() if self.text else None,
            **self.run.state_dict(),
            best=self.events.best,
            sampling=self.sampling.to_json(),
            plan=self.budget.plan,
            # what it trained with: a continuation keeps the kernels and whether it compiled (they round differently)
            kernels={
                "device": self.device.type,
                "precision": self.precision,
                "compiled": self.compiled,
                **self.run.kernels(),
            },
        )

    def save(self, name: str | None = None) -> Path:
        """Write the checkpoint (to the run directory's ``name``, default checkpoint.pt), unless the weights
        went non-finite: then the last good one is kept."""
        path = self.ckpt_path if name is None else self.out / name
        self.checkpoint().save(path)
        return path

    def train_step(self) -> torch.Tensor:
        """One optimizer step; returns this rank's (detached) flow-matching loss without synchronising the
        device. Every draw is made for the whole global batch, then each rank keeps its share (``World.share``)."""
        cfg, run = self.cfg, self.run
        g = optim.step_generator(cfg.seed, run.step)
        idx = self.order.indices(run.step)
        mine = self.world.share(len(idx))
        # The few-step objectives draw more inside their losses, per image: under several ranks each draws
        # from its own seeded stream, so those runs resume exactly on the same number of ranks only.
        g_loss = g if self.world.size == 1 else optim.step_generator(cfg.seed, run.step, 104_729, self.world.rank)
        b, aligned_to = self.draw(idx, mine, g, g_loss)
        with autocast(self.device, self.precision):
            loss = self.objective(run.forward, run.model, b)
            align = run.alignment.loss(b.x, aligned_to) if run.alignment else None  # REPA: tokens vs x
        if loss.at_t is not None:
            self.events.window.add_times(b.t[loss.at_t], loss.per_sample[loss.at_t], align)
        run.update(loss.minimised if align is None else loss.minimised + cfg.repa * align, self.budget.lr_at(run.step))
        return loss.reported.detach()  # the flow-matching loss: comparable with runs that do not align

    def _draw_images(self, idx: torch.Tensor, mine: slice, g: torch.Generator, g_loss: torch.Generator):
        """This rank's share of a step's images and their draws (``StepBatch``), and the alignment's key for them."""
        cfg, dev = self.cfg, self.device
        flips = self.data.train_set.draw_flips(len(idx), g)  # (N,) bool: the alignment keeps a target per way round
        x, y = self.data.batch(True, idx, device=dev, flips=flips)  # (N, C, H, W), (N,) or (N, L)
        n = x.shape[0]

        def draw_t() -> torch.Tensor:  # (N,) the run's training times
            return sample_t(n, generator=g, device=dev, kind=cfg.t_sampling, shift=cfg.t_shift)

        t = draw_t()
        noise = torch.randn(x.shape, generator=g).to(dev)  # (N, C, H, W)
        drop = (torch.rand(n, generator=g) < cfg.class_dropout).to(dev)  # (N,) guidance dropout
        null = null_condition(unwrap(self.run.model), y)
        y = torch.where(drop.view(-1, *[1] * (y.dim() - 1)), null, y)
        r, t = self.objective.draw_times(t, draw_t, g)  # (N,) each: drawn for the global batch, so ranks agree
        # this rank's share: n = N / ranks
        b = StepBatch(x[mine], y[mine], t[mine], r[mine], noise[mine], drop[mine], null[mine], g_loss, cfg.meanflow_cfg)
        return b, (idx[mine], flips[mine])

    def _draw_paths(self, idx: torch.Tensor, mine: slice, g: torch.Generator, g_loss: torch.Generator):
        """This rank's share of a step's teacher paths (``PathBatch``); a student does not align."""
        return self.teacher.batch(idx[mine], self.device, g_loss), None

    def validation_losses(self, model, times: str = "even") -> tuple[float, list[float]]:
        """The loss on the fixed held-out images (a student: its teacher's validation paths) with fixed noise,
        overall and per bin of t (per step count). ``times``: ``even`` spreads t evenly over [0, 1], the same
        for every run (comparable across runs); ``training`` takes a fixed draw of the run's own training
        times (comparable with its training loss; not for a student)."""
        if times not in ("even", "training"):
            raise TinyDiTError(f"`times` must be even or training, got {times!r}")
        if times == "training" and self.teacher is not None:
            raise TinyDiTError("a student validates on its teacher's paths: `times` training is not for it")
        val_paths = self.teacher.val_paths if self.teacher is not None else None
        t = self.val_times if times == "training" else None
        return validation_losses(model, self.data, self.device, val_paths, t)

    # What the periodic events do with the run's parts (``Events`` decides when).

    def _validate(self) -> Validation:
        """The raw weights' validation losses, and the EMA's, at even times (the EMA's also per bin) and, but
        for a student, at the training times."""
        model, ema = self.run.model, self.run.ema
        with eagerly():  # the model's compiled blocks (regional compilation) run as they are
            even = (self.validation_losses(model)[0], *self.validation_losses(ema))
            if self.teacher is not None:
                return Validation(*even)
            return Validation(
                *even, self.validation_losses(model, "training")[0], self.validation_losses(ema, "training")[0]
            )

    def _draw_grid(self, step: int) -> Path:
        """EMA samples from the same noise at every step, into samples/step_NNNNNN.png and samples.png."""
        cfg = self.cfg
        # what `tinydit sample --steps --cfg-scale` would draw: the record, with the flags of the run's grids
        settings = self.sampling.with_flags(steps=cfg.sample_steps, cfg_scale=cfg.sample_cfg)
        path = self.out / "samples" / f"step_{step:06d}.png"
        noise = optim.step_generator(cfg.seed, 31)  # the same generator at every step: the same noise
        files = [path, self.out / "samples.png"]
        with autocast(self.device, self.precision):
            sample_grid(self.run.ema_forward, self.data, self.model_config, noise, self.device, settings, files)
        return path

    @torch.no_grad()
    def _score(self) -> dict[str, float | str]:
        """``eval_n`` EMA samples, scored in the run's precision (its scores follow the run, not the machine),
        with the sampler settings the checkpoint records, and where those guide, ``eval_n`` more from the same
        noise at guidance 1 (``guidance_1/...``)."""
        data, cfg = self.data, self.cfg
        # what the samples are asked to be: the run's own data, not a checkpoint's record of it
        target = EvalTarget(data.name, tuple(data.train_set.classes), data.tokenizer, cfg.held_out_phrases())

        def score(settings) -> dict:
            return score_model(
                self.run.ema_forward,
                target,
                cfg.eval_n,
                settings,
                seed=cfg.seed,
                root=cfg.data_root,
                progress=self.progress,
                precision=self.precision,
            )

        with autocast(self.device, self.precision):
            metrics = score(self.sampling)
            if self.sampling.cfg_scale != 1:  # also the model alone, from the same noise, as `tinydit eval` does
                alone = score(self.sampling.with_flags(cfg_scale=1.0))
                metrics.update({f"guidance_1/{k}": v for k, v in headline_scores(alone).items()})
        return metrics

    def _record_pace(self) -> None:
        """A CPU `minutes` run's pace into the machine record, under its kind and the way it ran: what `compile`
        auto weighs for the next run of its kind (``tinydit.runtime.choose_compile``). A run that compiled the
        whole model (TINYDIT_COMPILE_SCOPE) is not the way auto would compile it: not recorded."""
        pace = self.budget.pace()
        if pace is None or self.cfg.minutes is None or self.device.type != "cpu":
            return
        if not self.compiled or compile_scope() == "blocks":
            record_run(self.kind, self.compile_choice, *pace)

    def close(self) -> None:
        """Let go of the run directory without training (``fit`` does it when it ends)."""
        self.lock.release()

    def fit(self) -> TrainResult:
        """Train until ``steps`` or ``minutes``, whichever comes first, then save and report."""
        try:
            with self.run.kernel():
                return self._fit()
        finally:
            self.lock.release()

    def _fit(self) -> TrainResult:
        cfg, log, run, budget, world = self.cfg, self.log, self.run, self.budget, self.world
        self.clock = clock = Clock(run.train_seconds)
        if budget.done(run.step, clock()):
            ended_by = "--steps" if cfg.steps is not None and run.step >= cfg.steps else "--minutes"
            log.say(f"{self.out}: already trained to step {run.step}; raise {ended_by} to continue")
            return TrainResult(run.step, run.train_seconds, None, None, self.ckpt_path, None)
        log.announce(cfg, self.preset, self.data, run.model, run.step, self.device, run.precision, self.compile_choice)
        if budget.extension_note():  # a finished `minutes` run given more: said, and recorded where it began
            log.say(budget.extension_note())
            log.record({"step": run.step, "extends": budget.extended, "plan": budget.plan})
        log.start(cfg.steps, run.step)
        run.model.train()
        events = self.events
        events.start(clock)
        budget.start(run.step, clock())  # the time budget's rate is measured in this process, after its start-up
        with GracefulInterrupt() as interrupt:
            done = stop = False
            while not stop:
                events.window.add(self.train_step())
                log.bar.update(1)
                # One decision for all ranks: their clocks and signals differ, their steps must not.
                # Rank 0's clock is the run's: it alone spends time on validation, grids and evaluation.
                if world.main:
                    seconds = clock()
                    budget.tick(run.step, seconds)  # the pace the machine record keeps
                    done = budget.done(run.step, seconds)
                else:
                    done = budget.steps_done(run.step)
                due = budget.due_plan(run.step, clock()) if world.main else None
                done, interrupt.requested, plan = world.any(done, interrupt.requested, due is not None)
                if plan:
                    log.record({"step": run.step, "plan": budget.agree(due, world, run.step)})
                stop = done or interrupt.requested
                events.fire(run.step, stop)
        log.close()
        run.train_seconds = clock()
        if interrupt.requested and not done:  # asked to stop, on this rank or another: all stop here
            if world.main:
                self.save()
                log.say(
                    f"interrupted at step {run.step}; checkpoint saved to {self.ckpt_path}. "
                    "Re-run the same command to continue."
                )
            world.barrier()  # the checkpoint is whole before any rank exits
            raise KeyboardInterrupt
        if world.main:
            self._record_pace()
            events.finish(run.step)
            if cfg.report:
                write_run_report(self.out)
            log.report(run, events, self.ckpt_path, distilled=self.teacher is not None)
        world.barrier()  # every rank returns once the run's files are written
        val = events.validation
        return TrainResult(
            run.step,
            run.train_seconds,
            events.val,
            events.val_ema,
            self.ckpt_path,
            events.samples,
            val.train_t if val is not None else None,
            val.ema_train_t if val is not None else None,
        )
