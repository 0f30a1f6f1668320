"""The training loop: flow matching with AdamW, an EMA of the weights, validation, sample grids and
checkpoints, continued exactly when its run directory already holds a run.

Exact resumption: every random draw of step s comes from a generator seeded with (seed, s)
(``tinydit.train.optim.step_generator``), so a checkpoint needs only the weights, EMA, optimizer state and
step; on a CPU in fp32 a run stopped and resumed ends with exactly the weights of an uninterrupted one.
A continuation also keeps the token-linear kernel (``tinydit.models.linear``) and the AdamW variant its
checkpoint was written with: the alternatives round differently.

Several processes (``torchrun``, ``tinydit.distributed``): the model is wrapped in DDP; every rank draws a
step's numbers for the whole global batch and trains on its share, so the run sees the data a 1-rank run
sees and may be continued on any number of ranks. Rank 0 alone writes; all ranks agree after every step
whether to stop (the time budget, Ctrl-C or SIGTERM on any of them), so they stop at the same step.
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset

from tinydit import distributed
from tinydit.config import PLAN_AT, TrainConfig, recommended_sampling, split_sampling
from tinydit.errors import TinyDiTError
from tinydit.eval.evaluate import default_best_metric, lower_is_better, score_model
from tinydit.eval.run_report import write_run_report
from tinydit.files import RunDirLock, ensure_writable_dir
from tinydit.flow import distill
from tinydit.flow.guidance import null_condition
from tinydit.flow.path import N_T_BINS, flow_loss, sample_t, t_bins
from tinydit.flow.shortcut import n_self_consistency, shortcut_loss
from tinydit.models.attention import resolve_backend as resolve_attention
from tinydit.models.checkpoint import load_checkpoint, unwrap
from tinydit.models.dit import count_params
from tinydit.models.linear import linear_backend
from tinydit.models.linear import resolve_backend as resolve_linear
from tinydit.models.registry import build_model
from tinydit.runtime import (
    autocast,
    make_grad_scaler,
    maybe_compile,
    resolve_compile,
    resolve_device,
    resolve_precision,
)
from tinydit.train import optim
from tinydit.train.checkpoint import GracefulInterrupt, check_same_run, model_config_for, restore, save_checkpoint
from tinydit.train.data import canonical_data, prepare_data
from tinydit.train.diagnostics import sample_grid, validation_losses
from tinydit.train.log import RunLog
from tinydit.train.teacher import load_teacher, run_paths

__all__ = ["Trainer", "TrainResult"]

# A time-budget run plans to end at this share of the time left when its cool-down begins: the budget is
# a promise, and the rate can still fall (a sample grid, the validation batch, a busy machine). If it
# falls further than that, the clock still ends the run, mid-cool-down.
PLAN_MARGIN = 0.9


@dataclass
class TrainResult:
    step: int
    train_seconds: float
    val_loss: float | None
    val_loss_ema: float | None
    checkpoint: Path
    samples: Path | None


class Trainer:
    """Trains a DiT or an MMDiT with flow matching as ``cfg`` says, continuing ``cfg.out`` if it holds a run.

    ``dataset`` (and ``val_dataset``): any map-style Dataset of (image (C, H, W) in [-1, 1], label) to
    train on instead of the data set ``cfg.data`` names (``tinydit.train.data``).
    """

    def __init__(self, cfg: TrainConfig, overwrite: bool = False, require_resume: bool = False, progress: bool = True,
                 dataset: Dataset | None = None, val_dataset: Dataset | None = None):  # fmt: skip
        self.cfg, self.progress = cfg, progress
        self.out = Path(cfg.out)
        self.ckpt_path = self.out / "checkpoint.pt"
        # Held from before the checkpoint is read until fit() ends: one trainer per run directory.
        self.lock = RunDirLock(self.out)
        self.world = distributed.init(resolve_device(cfg.device))
        try:
            self._setup(overwrite, require_resume, dataset, val_dataset)
        except BaseException:
            self.lock.release()
            raise

    def _setup(self, overwrite: bool, require_resume: bool, dataset: Dataset | None, val_dataset: Dataset | None):
        cfg = self.cfg
        self.device = self.world.device(resolve_device(cfg.device))
        main = self.world.main  # only rank 0 locks, writes and prints
        self.precision = resolve_precision(cfg.precision, self.device)
        self.compiled = resolve_compile(cfg.compile, self.device, cfg.minutes)
        if self.out.is_dir() and main:
            self.lock.acquire()
        self.teacher_state = None  # distillation: the student copies the teacher's preset and architecture
        if cfg.few_step == "distill":
            self.teacher_state = load_teacher(cfg.teacher, cfg.model, canonical_data(cfg, dataset))
            cfg.preset = self.teacher_state["train_config"]["preset"]
        state = None
        if self.ckpt_path.exists() and not overwrite:
            state = load_checkpoint(self.ckpt_path)
            check_same_run(cfg, state, self.out, canonical_data(cfg, dataset))
        elif require_resume:
            raise TinyDiTError(f"`resume` given, but {self.ckpt_path} does not exist; drop `resume` to start a run")
        with self.world.main_first():  # rank 0 downloads, decodes and caches; the others then read its files
            self.data = prepare_data(cfg, state, dataset, val_dataset)
        if main:
            ensure_writable_dir(self.out)  # only now: nothing is created for a run whose inputs are wrong
            self.lock.acquire()
        self.log = RunLog(self.out, self.progress, cfg.tensorboard, quiet=not main)
        self.text = cfg.cond == "text"
        self.best = state.get("best") if state is not None else None  # {metric, value, step} of best.pt
        # The sampler settings the checkpoint records for sampling it: a continued run keeps its record
        # (`tinydit sweep --apply` may have written it), a new one takes the measured best for its setup.
        recorded = state.get("sampling") if state is not None else None
        self.sampling = recorded or recommended_sampling(self.data.name, cfg.preset, cfg.cond, cfg.few_step)
        if cfg.eval_every:
            self.best_metric, self.lower_is_better = self._best_metric()
        self.model_config = model_config_for(cfg, self.data.model_fields(), state, self.teacher_state)
        # A continuation on the same kind of device in the same precision keeps its token-linear kernel.
        saved = state.get("kernels") if state is not None else None
        same = saved is not None and (saved["device"], saved["precision"]) == (self.device.type, self.precision)
        self.linear_kernel: str | None = saved["token_linears"] if same else None  # None: as the caller's context

        torch.manual_seed(cfg.seed)
        self.model = build_model(cfg.model, self.model_config).to(self.device)  # fp32 master weights, saved as they are
        if self.teacher_state is not None and state is None:
            distill.init_student(self.model, self.teacher_state["ema"])
        self.ema = copy.deepcopy(self.model).requires_grad_(False).eval()
        # A checkpoint from before the fused AdamW continues unfused: exact, and fp16's scaler keeps the unfused step.
        unfused = state is not None and not state["optimizer"]["param_groups"][0].get("fused")
        self.opt = optim.adamw(self.model.parameters(), self.device, cfg.lr, cfg.weight_decay,
                               fused=False if unfused else None)  # fmt: skip
        self.scaler = make_grad_scaler(self.device, self.precision)
        self.bin_loss = torch.zeros(N_T_BINS, device=self.device)  # training loss summed per bin of t
        self.bin_count = torch.zeros(N_T_BINS, device=self.device)
        # The compiled wrappers share the weights of model and ema; checkpoints come from the originals.
        # DDP averages the ranks' gradients in backward; the EMA (updated alike on every rank) needs none.
        self.ddp = None
        if self.world.active:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(self.model, device_ids=ids)
        self.forward = maybe_compile(self.ddp or self.model, self.compiled)
        self.ema_forward = maybe_compile(self.ema, self.compiled)
        self.step, self.train_seconds = 0, 0.0
        if state is not None:
            self.step, self.train_seconds = restore(state, self.ckpt_path, cfg.model, self.model_config,
                                                    self.train_set.classes, self.model, self.ema, self.opt,
                                                    self.scaler)  # fmt: skip
        elif overwrite and main:
            (self.out / "metrics.jsonl").unlink(missing_ok=True)
        self.plan = self._restore_plan(state)
        self.paths = self.val_paths = None  # distillation: the teacher's paths (tinydit.train.teacher)
        if self.teacher_state is not None:
            with self.world.main_first():  # rank 0 samples the teacher's paths; the others read its file
                self.paths, self.val_paths = run_paths(cfg, self.teacher_state, self.out / "teacher_paths.pt",
                                                       self.device, self.precision, self.progress and main)
            self.log.record({"step": self.step, "teacher_paths": len(self.paths), "teacher_nfe": self.paths.nfe,
                             "teacher_seconds": round(self.paths.seconds, 1)})  # fmt: skip
        self.n_train = len(self.paths) if self.paths is not None else len(self.train_set)
        self.batch_size = min(cfg.batch_size, self.n_train)
        if self.batch_size % self.world.size:
            raise TinyDiTError(f"`batch_size` {self.batch_size} (the global batch) does not split evenly over "
                               f"{self.world.size} processes; use a multiple of {self.world.size}")  # fmt: skip
        self.steps_per_epoch = self.n_train // self.batch_size
        self._perm_epoch, self._perm = -1, torch.empty(0, dtype=torch.long)
        if main:
            self._write_config()

    # The data's pieces under the names the rest of the package (and older scripts) read.
    train_set = property(lambda self: self.data.train_set)
    val_set = property(lambda self: self.data.val_set)
    tokenizer = property(lambda self: self.data.tokenizer)
    train_tokens = property(lambda self: self.data.train_tokens)
    prompts = property(lambda self: self.data.prompts)
    n_held_out = property(lambda self: self.data.n_held_out)

    def state_dict(self) -> dict:
        """The checkpoint: everything needed to sample from the run or to continue it exactly."""
        text = {"tokenizer": self.tokenizer.to_dict()} if self.text else {}
        return {
            "model_type": self.cfg.model, "model_config": self.model_config.to_dict(), **text,
            "train_config": self.cfg.to_dict(),
            "data": {"name": self.data.name, "classes": list(self.train_set.classes),
                     "channels": self.train_set.channels, "img_size": self.train_set.img_size,
                     **({"prompts": list(self.prompts)} if self.text else {})},
            "model": unwrap(self.model).state_dict(), "ema": unwrap(self.ema).state_dict(),
            "optimizer": self.opt.state_dict(), "grad_scaler": self.scaler.state_dict(),
            "step": self.step, "train_seconds": self.train_seconds, "best": self.best, "sampling": self.sampling,
            "plan": self.plan,
            "kernels": {"device": self.device.type, "precision": self.precision, **self.kernels()},
            "rng": {"torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        }  # fmt: skip

    def save(self) -> Path:
        """Write the checkpoint, unless the weights went non-finite: then the last good one is kept."""
        if not all(torch.isfinite(p).all() for p in self.model.parameters()):
            raise TinyDiTError(f"the weights became NaN or infinite by step {self.step}; the last good checkpoint is "
                               "kept. Lower `lr` (or raise `warmup`) and start again with `overwrite`")  # fmt: skip
        save_checkpoint(self.ckpt_path, self.state_dict())
        return self.ckpt_path

    def kernels(self) -> dict[str, str]:
        """The kernels this run's device and precision get: machines that pick differently train to
        results that differ by float rounding."""
        x = torch.empty(0, device=self.device)
        with self._linear_kernel(), autocast(self.device, self.precision):
            return {"token_linears": resolve_linear(x), "attention": resolve_attention(x)}

    def _linear_kernel(self) -> contextlib.AbstractContextManager:
        """The recorded kernel of a continued run; otherwise whatever the caller's context (or auto) picks."""
        return linear_backend(self.linear_kernel) if self.linear_kernel else contextlib.nullcontext()

    def _write_config(self) -> None:
        """config.json: the resolved config, what the run runs on, and the kernels it gets."""
        text = {"vocab_size": self.tokenizer.vocab_size, "text_len": self.tokenizer.max_len,
                "holdout": list(self.cfg.held_out_phrases()), "held_out_images": self.n_held_out,
                "grid_prompts": self.prompts} if self.text else None  # fmt: skip
        self.log.write_config(self.cfg, self.model_config, self.data, count_params(self.model), self.device,
                              self.precision, self.compiled, self.kernels(), text)  # fmt: skip

    # ---------------------------------------------------------------------------------- one step

    def lr_at(self, step: int) -> float:
        return optim.lr_at(self.cfg, step, self.plan)

    # ---------------------------------------------------------------------------------- the time budget's plan

    def _restore_plan(self, state: dict | None) -> dict | None:
        """A continued time-budget run keeps its plan; a new budget is planned again, unless the old
        plan's cool-down has begun (then its schedule is fixed, as a `steps` run's is)."""
        plan = state.get("plan") if state is not None else None
        if plan is None or plan["minutes"] == self.cfg.minutes:
            return plan
        if self.step > plan["steps"] - plan["cooldown"]:
            raise TinyDiTError(f"{self.out} is at step {self.step}, inside the learning-rate cool-down planned for "
                               f"`minutes` {plan['minutes']} (steps {plan['steps']}), so its schedule is fixed: "
                               f"finish it with `minutes` {plan['minutes']}, or train another run (`out`, "
                               "`overwrite`)")  # fmt: skip
        return None

    def _steps_left(self, seconds: float) -> tuple[int, float]:
        """(steps the time left holds at the rate measured since the start-up, that rate in steps/s).

        The rate is measured from the first step after PLAN_AT of the budget has passed in this process
        (compilation, caching and the first grid come before), or over the whole process until then.
        """
        cfg = self.cfg
        if self._rate_from is None and seconds - self._seconds_at_start >= PLAN_AT * cfg.minutes * 60:
            self._rate_from = (self.step, seconds)
        step0, seconds0 = self._rate_from or (self._step_at_start, self._seconds_at_start)
        if self.step == step0:  # the measurement has only just begun: the whole process's rate until then
            step0, seconds0 = self._step_at_start, self._seconds_at_start
        rate = (self.step - step0) / max(seconds - seconds0, 1e-9)
        left = int((cfg.minutes * 60 - seconds) * rate * PLAN_MARGIN)
        return (min(left, cfg.steps - self.step) if cfg.steps is not None else left), rate

    def _due_plan(self, seconds: float) -> dict | None:
        """Rank 0's plan of a `minutes` run, made when the steps left are the cool-down's share of the run
        (the decay begins at the next step), else None: the step count the time left reaches at the
        measured rate, the last ``cooldown`` of them falling.

        Planning as late as the decay allows uses the best measured rate; the steps before it do not
        depend on the plan (the rate is constant), so a continuation before it simply plans again.
        """
        left, rate = self._steps_left(seconds)
        if self.step == self._step_at_start or left > self.cfg.cooldown_frac * (self.step + left):
            return None
        left = max(left, 1)
        return {"minutes": self.cfg.minutes, "steps": self.step + left, "cooldown": left, "planned_at": self.step,
                "steps_per_second": round(rate, 3)}

    def _agree_plan(self, due: dict | None) -> dict:
        """Every rank's copy of rank 0's plan (``due`` is None on the other ranks)."""
        mine = torch.tensor([due["steps"], due["cooldown"]] if due is not None else [0, 0])
        total, cooldown = (int(v) for v in self.world.sum(mine).tolist())
        return {**(due or {"minutes": self.cfg.minutes, "steps_per_second": None}), "steps": total,
                "cooldown": cooldown, "planned_at": self.step}

    def batch_indices(self, step: int) -> torch.Tensor:
        epoch, i = divmod(step, self.steps_per_epoch)
        if epoch != self._perm_epoch:
            self._perm = torch.randperm(self.n_train, generator=optim.step_generator(self.cfg.seed, 7919, epoch))
            self._perm_epoch = epoch
        return self._perm[i * self.batch_size : (i + 1) * self.batch_size]

    def train_step(self) -> torch.Tensor:
        """One optimizer step; returns the (detached) loss of this rank's share without synchronising the device.

        Every draw is made for the whole global batch, then each rank keeps its share (``World.share``).
        """
        cfg, dev, world = self.cfg, self.device, self.world
        g = optim.step_generator(cfg.seed, self.step)
        idx = self.batch_indices(self.step)
        mine = world.share(len(idx))
        # The few-step objectives draw more inside their losses, per image: under several ranks each draws
        # from its own seeded stream, so those runs resume exactly on the same number of ranks only.
        g_loss = g if world.size == 1 else optim.step_generator(cfg.seed, self.step, 104_729, world.rank)
        if self.paths is not None:  # distillation: no guidance dropout, guidance is in the teacher's paths
            idx = idx[mine]
            states = self.paths.states[idx].to(dev, non_blocking=True)  # (n, KNOTS + 1, C, H, W) float16
            with autocast(dev, self.precision):
                loss = distill.distill_loss(self.forward, states, self.paths.y[idx].to(dev), generator=g_loss)
            return self._optimizer_step(loss)
        x, y = self.data.batch(True, idx, generator=g, device=dev)  # (N, C, H, W), (N,) or (N, L)
        n = x.shape[0]
        t = sample_t(n, generator=g, device=dev, kind=cfg.t_sampling, shift=cfg.t_shift)  # (N,)
        noise = torch.randn(x.shape, generator=g).to(dev)  # (N, C, H, W)
        drop = (torch.rand(n, generator=g) < cfg.class_dropout).to(dev)  # (N,) guidance dropout
        drop = drop.view(-1, *[1] * (y.dim() - 1))  # (N,) or (N, 1)
        y = torch.where(drop, null_condition(unwrap(self.model), y), y)
        x, y, t, noise = x[mine], y[mine], t[mine], noise[mine]  # this rank's share: (n, ...), n = N / ranks
        n = x.shape[0]
        n_fm = n  # images trained by plain flow matching at their time t
        with autocast(dev, self.precision):
            if cfg.few_step == "shortcut":
                per_sample = shortcut_loss(self.forward, x, y, t, noise, generator=g_loss, reduce=False)  # (n,)
                n_fm = n - n_self_consistency(n)  # the rest are self-consistency examples
            else:
                per_sample = flow_loss(self.forward, x, y, t, noise, reduce=False)  # (n,)
        bins = t_bins(t[:n_fm])  # summed on the device, read at logging time: no sync per step
        self.bin_loss.index_add_(0, bins, per_sample[:n_fm].detach().float())
        self.bin_count.index_add_(0, bins, torch.ones_like(t[:n_fm]))
        return self._optimizer_step(per_sample.mean())

    def _optimizer_step(self, loss: torch.Tensor) -> torch.Tensor:
        """Backward, clip, step at this step's learning rate, EMA; returns the detached loss."""
        for group in self.opt.param_groups:
            group["lr"] = self.lr_at(self.step)
        self.opt.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if self.cfg.grad_clip > 0:
            self.scaler.unscale_(self.opt)  # clip the true gradients, not the scaled ones
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.scaler.step(self.opt)
        self.scaler.update()
        optim.ema_update(self.ema, self.model, optim.ema_decay_at(self.cfg, self.step))
        self.step += 1
        return loss.detach()

    # ---------------------------------------------------------------------------------- measurements

    def validation_loss(self, model) -> float:
        """Loss on the fixed held-out images with fixed noise and evenly spread t: comparable across runs."""
        return self.validation_losses(model)[0]

    def validation_losses(self, model) -> tuple[float, list[float]]:
        return validation_losses(model, self.data, self.device, self.val_paths)

    def _validate(self) -> tuple[float, float, list[float]]:
        val = self.validation_loss(self.model)
        val_ema, by_t = self.validation_losses(self.ema)
        key = "val_loss_ema_by_steps" if self.paths is not None else "val_loss_ema_by_t"
        self.log.record({"step": self.step, "val_loss": val, "val_loss_ema": val_ema, key: [round(v, 5) for v in by_t]})
        return val, val_ema, by_t

    def sample_grid(self) -> Path:
        """EMA samples from the same noise at every step, into samples/step_NNNNNN.png and samples.png."""
        cfg, rec = self.cfg, self.sampling
        if self.paths is not None:  # a distilled student: 4 steps, guidance in its paths
            settings = {"sampler": "euler", "steps": 4, "cfg_scale": 1.0}
        elif cfg.sample_steps is None and cfg.sample_cfg is None:  # what `tinydit sample` will draw
            settings = rec
        else:
            settings = {"sampler": "euler", "steps": cfg.sample_steps or rec["steps"],
                        "cfg_scale": rec["cfg_scale"] if cfg.sample_cfg is None else cfg.sample_cfg}  # fmt: skip
        path = self.out / "samples" / f"step_{self.step:06d}.png"
        with autocast(self.device, self.precision):
            sample_grid(self.ema_forward, self.data, self.model_config, optim.step_generator(cfg.seed, 31),
                        self.device, settings, [path, self.out / "samples.png"])  # fmt: skip
        self.log.image("samples", self.step, path)
        return path

    def _best_metric(self) -> tuple[str, bool]:
        try:
            metric, lower = default_best_metric(self.data.name, self.text)
        except TinyDiTError as err:
            raise TinyDiTError(f"`eval_every` scores samples with an offline feature network, which fashion-mnist and "
                               f"shapes have and {self.data.name} has not ({err})") from None  # fmt: skip
        if self.cfg.best_metric != "auto":
            metric = self.cfg.best_metric
        return metric, lower_is_better(metric)

    @torch.no_grad()
    def _evaluate(self, started: float) -> float:
        """Score ``eval_n`` EMA samples (in the run's precision, with the sampler settings the checkpoint
        records, ``self.sampling``) into metrics.jsonl and keep the best as
        best.pt; returns the training clock's start, moved past the evaluation unless it counts."""
        t0 = time.perf_counter()
        # the settings the checkpoint records: what sample and eval will use
        sampler, steps, cfg_scale, options = split_sampling(self.sampling)
        state = {"data": {"name": self.data.name, "classes": self.train_set.classes},
                 "train_config": self.cfg.to_dict(), "tokenizer": self.tokenizer.to_dict() if self.text else None}
        with autocast(self.device, self.precision):  # the run's precision: its scores follow the run, not the machine
            metrics = score_model(self.ema_forward, state, self.cfg.eval_n, steps, cfg_scale, seed=self.cfg.seed,
                                  root=self.cfg.data_root, progress=self.progress, sampler=sampler,
                                  **options)  # fmt: skip
        if self.best_metric not in metrics:
            raise TinyDiTError(f"`best_metric` {self.best_metric!r} is not among the evaluation's metrics "
                               f"({', '.join(sorted(metrics))})")  # fmt: skip
        value = metrics[self.best_metric]
        best = self.best is None or (value < self.best["value"] if self.lower_is_better else value > self.best["value"])
        if best:
            self.best = {"metric": self.best_metric, "value": value, "step": self.step}
            save_checkpoint(self.out / "best.pt", self.state_dict())
        seconds = time.perf_counter() - t0
        self.log.record({"step": self.step, **{f"eval/{k}": v for k, v in metrics.items()}, "eval_seconds": seconds,
                         "best_metric": self.best_metric, "eval_best": best})  # fmt: skip
        return started + seconds if self.cfg.eval_budget == "outside" else started

    # ---------------------------------------------------------------------------------- the loop

    def _seconds(self, started: float) -> float:
        return self.train_seconds + (time.perf_counter() - started)

    def _steps_done(self) -> bool:
        if self.plan is not None and self.step >= self.plan["steps"]:
            return True
        return self.cfg.steps is not None and self.step >= self.cfg.steps

    def _done(self, started: float) -> bool:
        if self._steps_done():
            return True
        return self.cfg.minutes is not None and self._seconds(started) >= self.cfg.minutes * 60

    def close(self) -> None:
        """Let go of the run directory without training (``fit`` does it when it ends)."""
        self.lock.release()

    def fit(self) -> TrainResult:
        """Train until ``steps`` or ``minutes``, whichever comes first, then save and report."""
        try:
            with self._linear_kernel():
                return self._fit()
        finally:
            self.lock.release()

    def _fit(self) -> TrainResult:
        cfg, log = self.cfg, self.log
        started = time.perf_counter()
        if self._done(started):
            log.say(f"{self.out}: already trained to step {self.step}; raise --steps or --minutes to continue")
            return TrainResult(self.step, self.train_seconds, None, None, self.ckpt_path, None)
        log.announce(self.step, self.out, self.cfg, self.data, count_params(self.model), self.device)
        if self.compiled and cfg.compile == "auto" and self.device.type == "cpu":
            log.say(f"compiling the model: a CPU run of {cfg.minutes:g} minutes wins back the first minute it "
                    "takes (--compile off to skip)")
        log.start(cfg.steps, self.step)
        self.model.train()
        loss_sum, loss_n = torch.zeros((), device=self.device), 0  # summed on the device: no sync per step
        window_start, window_step = time.perf_counter(), self.step
        val = val_ema = samples = None
        by_t: list[float] = []
        world, main = self.world, self.world.main
        # The time budget's rate is measured in this process, after its start-up (see _steps_left).
        self._step_at_start, self._seconds_at_start, self._rate_from = self.step, self._seconds(started), None
        with GracefulInterrupt() as interrupt:
            done = stop = False
            while not stop:
                loss_sum += self.train_step()
                loss_n += 1
                log.bar.update(1)
                s = self.step
                # One decision for all ranks: their clocks and signals differ, their steps must not.
                # Rank 0's clock is the run's: it alone spends time on validation, grids and evaluation.
                done = self._done(started) if main else self._steps_done()
                due = None
                if main and cfg.cooldown_frac > 0 and self.plan is None:
                    due = self._due_plan(self._seconds(started))
                done, interrupt.requested, plan = world.any(done, interrupt.requested, due is not None)
                if plan:
                    self.plan = self._agree_plan(due)
                    log.record({"step": s, "plan": self.plan})
                stop = done or interrupt.requested
                if s % cfg.log_every == 0 or stop:
                    now, seconds = time.perf_counter(), self._seconds(started)
                    img_s = (s - window_step) * self.batch_size / max(now - window_start, 1e-9)
                    left = cfg.minutes * 60 - seconds if cfg.minutes is not None else None
                    loss = world.sum(loss_sum / loss_n) / world.size  # the global batch's mean loss
                    by_t = world.sum(self.bin_loss) / world.sum(self.bin_count)
                    log.window(s, loss.item(), img_s, self.lr_at(s - 1), seconds, by_t, left)
                    self.bin_loss.zero_(), self.bin_count.zero_(), loss_sum.zero_()
                    loss_n, window_start, window_step = 0, now, s
                if s % cfg.val_every == 0 and main:
                    val, val_ema, by_t = self._validate()
                if s % cfg.sample_every == 0 and main:
                    samples = self.sample_grid()
                if cfg.eval_every and s % cfg.eval_every == 0 and main:
                    t0 = time.perf_counter()
                    started = self._evaluate(started)
                    window_start += time.perf_counter() - t0  # images per second count training time only
                if s % cfg.ckpt_every == 0:
                    self.train_seconds, started = self._seconds(started), time.perf_counter()
                    if main:
                        self.save()
        log.close()
        self.train_seconds = self._seconds(started)
        if interrupt.requested and not done:  # asked to stop, on this rank or another: all stop here
            if main:
                self.save()
                log.say(f"interrupted at step {self.step}; checkpoint saved to {self.ckpt_path}. "
                        "Re-run the same command to continue.")  # fmt: skip
            world.barrier()  # the checkpoint is whole before any rank exits
            raise KeyboardInterrupt
        if main:
            if self.step % cfg.val_every:
                val, val_ema, by_t = self._validate()
            if self.step % cfg.sample_every:
                samples = self.sample_grid()
            if cfg.eval_every and self.step % cfg.eval_every:
                self._evaluate(time.perf_counter())
            self.save()
            if cfg.report:
                write_run_report(self.out)
            log.report(self.step, self.train_seconds / 60, val, val_ema, by_t, self.ckpt_path, samples,
                       self.paths is not None)  # fmt: skip
        world.barrier()  # every rank returns once the run's files are written
        return TrainResult(self.step, self.train_seconds, val, val_ema, self.ckpt_path, samples)
