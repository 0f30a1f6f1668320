"""The trainer: AdamW with warm-up and clipping, an EMA of the weights, validation, samples and
checkpoints, and exact resumption.

Exact resumption: every random draw of step s (which images, their flips, times, noise and guidance
dropout) comes from a generator seeded with (seed, s), and the batch order of epoch e from one seeded
with (seed, e). A checkpoint therefore only needs the weights, EMA, optimizer state and step, and on
a CPU in fp32 a run stopped and resumed ends with exactly the weights of an uninterrupted one (the
checkpoint also records the token-linear kernel, ``tinydit.linear``, which a continuation on the
same kind of device and precision keeps).

Text runs (``cond="text"``, always for MMDiT): the tokenizer is built once from the training captions
(after the held-out combinations are removed) and stored in the checkpoint; every caption is encoded
once, at set-up, into one LongTensor (N, L), and a batch's ``y`` is its rows. Guidance dropout swaps in
the empty caption instead of the null label.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from tinydit import __version__, distill, get_device
from tinydit.attention import resolve_backend as resolve_attention
from tinydit.checkpoint import load_checkpoint, save_checkpoint, unwrap
from tinydit.config import TRAJECTORY_FIELDS, TrainConfig
from tinydit.data import canonical_name, load_dataset
from tinydit.errors import TinyDiTError
from tinydit.flow import N_T_BINS, flow_loss, sample_t, t_bins
from tinydit.images import save_grid
from tinydit.linear import linear_backend
from tinydit.linear import resolve_backend as resolve_linear
from tinydit.model import count_params
from tinydit.registry import build_model, config_from_dict, preset_config
from tinydit.runtime import autocast, make_grad_scaler, maybe_compile, resolve_compile, resolve_precision
from tinydit.sampling import class_cycle, euler_sample
from tinydit.shortcut import n_self_consistency, shortcut_loss
from tinydit.text import Tokenizer, holds_phrase

__all__ = ["Trainer", "TrainResult", "adamw", "resolve_device", "ema_update", "ensure_writable_dir"]

VAL_SEED = 1234  # fixed noise for the validation loss, the same in every run


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return get_device()
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise TinyDiTError(f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise TinyDiTError(f"device {name!r} asked for, but CUDA is not available here; use --device cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise TinyDiTError(f"device {name!r} asked for, but MPS is not available here; use --device cpu")
    return device


def ensure_writable_dir(path: Path) -> None:
    """Create ``path`` if needed and prove we can write there, before any long work starts."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".tinydit-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise TinyDiTError(f"cannot write to output directory {path} ({err.strerror}); choose another --out") from err


def adamw(params, device: torch.device, lr: float, weight_decay: float = 0.0,
          fused: bool | None = None) -> torch.optim.AdamW:  # fmt: skip
    """The trainer's AdamW (betas 0.9, 0.99); ``fused`` None: PyTorch's fused kernel where it has one (CPU, CUDA).

    Fused, an AdamW step over dit-1.9m's parameters took 0.8 ms on our 2-core CPU instead of 3.2 ms
    (one loop per parameter tensor, the CPU default): about 1% of an fp32 training step, more for
    smaller models. Both compute the same update but round differently, so an exact resume needs the
    same one: a continued run keeps the one its checkpoint was written with (``Trainer``).
    """
    if fused is None:
        fused = device.type in ("cpu", "cuda")
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), weight_decay=weight_decay, fused=fused or None)


@torch.no_grad()
def ema_update(ema: nn.Module, model: nn.Module, decay: float) -> None:
    """ema <- decay * ema + (1 - decay) * model, for every parameter (buffers are copied)."""
    ema_params = [p for p in ema.parameters()]
    params = [p.detach() for p in model.parameters()]
    torch._foreach_lerp_(ema_params, params, 1.0 - decay)
    for b_ema, b in zip(ema.buffers(), model.buffers(), strict=True):
        b_ema.copy_(b)


def _generator(*keys: int) -> torch.Generator:
    """A CPU generator seeded from integer keys, independent of any global RNG state."""
    seed = 0
    for k in keys:
        seed = (seed * 1_000_003 + k) % (2**62)
    return torch.Generator().manual_seed(seed)


class GracefulInterrupt:
    """The first Ctrl-C asks the loop to stop at the next step boundary (so the checkpoint holds a
    whole step); a second one interrupts at once, leaving the last checkpoint as it was."""

    def __enter__(self) -> GracefulInterrupt:
        self.requested = False
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\nstopping after this step to save a checkpoint (Ctrl-C again to abort without saving)",
              file=sys.stderr)

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


@dataclass
class TrainResult:
    step: int
    train_seconds: float
    val_loss: float | None
    val_loss_ema: float | None
    checkpoint: Path
    samples: Path | None


class Trainer:
    """Trains a DiT or an MMDiT with flow matching as ``cfg`` says, continuing ``cfg.out`` if it holds a run."""

    def __init__(self, cfg: TrainConfig, overwrite: bool = False, require_resume: bool = False, progress: bool = True):
        self.cfg = cfg
        self.progress = progress
        self.out = Path(cfg.out)
        self.ckpt_path = self.out / "checkpoint.pt"
        self.device = resolve_device(cfg.device)
        self.precision = resolve_precision(cfg.precision, self.device)
        self.compiled = resolve_compile(cfg.compile, self.device)
        ensure_writable_dir(self.out)
        # Distillation: the student copies the teacher's preset and architecture (tinydit.distill).
        self.teacher_state = None
        if cfg.few_step == "distill":
            self.teacher_state = distill.load_teacher(cfg.teacher, cfg.model, canonical_name(cfg.data))
            cfg.preset = self.teacher_state["train_config"]["preset"]

        state = None
        if self.ckpt_path.exists() and not overwrite:
            state = load_checkpoint(self.ckpt_path)
            self._check_same_run(state)
        elif require_resume:
            raise TinyDiTError(f"--resume given, but {self.ckpt_path} does not exist; drop --resume to start a run")

        self.data_name = canonical_name(cfg.data)
        self.train_set = load_dataset(cfg.data, train=True, root=cfg.data_root, limit=cfg.limit)
        self.val_set = load_dataset(cfg.data, train=False, root=cfg.data_root, limit=cfg.val_size)
        self.text = cfg.cond == "text"
        self.n_held_out = 0
        data = dict(img_size=self.train_set.img_size, in_channels=self.train_set.channels,
                    n_classes=len(self.train_set.classes))  # fmt: skip
        self.tokenizer: Tokenizer | None = None
        self.train_tokens = self.val_tokens = None  # text runs: every caption's ids, (N, L) int64
        if self.text:
            self.train_set = self._hold_out(self.train_set, cfg.held_out_phrases())
            stored_tok = state.get("tokenizer") if state is not None else None
            self.tokenizer = (Tokenizer.from_dict(stored_tok) if stored_tok is not None
                              else Tokenizer.from_captions(self.train_set.captions))  # fmt: skip
            self.train_tokens = self.tokenizer.encode(self.train_set.captions)
            self.val_tokens = self.tokenizer.encode(self.val_set.captions, warn=False)  # unseen words: <unk>
            data.update(vocab_size=self.tokenizer.vocab_size, text_len=self.tokenizer.max_len)
        self.prompts = self._grid_prompts() if self.text else []
        if self.teacher_state is not None:
            teacher_config = config_from_dict(cfg.model, self.teacher_state["model_config"])
            self.model_config = dataclasses.replace(teacher_config, shortcut=True)
        else:
            self.model_config = preset_config(
                cfg.model, cfg.preset, **data, **cfg.arch_overrides(), shortcut=cfg.few_step == "shortcut",
                cond=cfg.cond,
            )
        if state is not None:
            # A run keeps the architecture it started with, even if its preset has changed since
            # (presets follow the ablations); only the data's shape must still match.
            stored = config_from_dict(cfg.model, state["model_config"])
            if all(getattr(stored, f) == getattr(self.model_config, f) for f in data):
                self.model_config = stored

        # A run continued on the same kind of device in the same precision keeps the token-linear kernel it
        # started with: auto's choice comes from a timing probe, and the two kernels round differently.
        saved = state.get("kernels") if state is not None else None
        same = saved is not None and (saved["device"], saved["precision"]) == (self.device.type, self.precision)
        self.linear_kernel: str | None = saved["token_linears"] if same else None  # None: as the caller's context

        torch.manual_seed(cfg.seed)
        self.model = build_model(cfg.model, self.model_config).to(self.device)  # fp32 master weights, saved as they are
        if self.teacher_state is not None and state is None:
            distill.init_student(self.model, self.teacher_state["ema"])
        self.ema = copy.deepcopy(self.model).requires_grad_(False).eval()
        # A continued run also keeps the optimizer it was written with: a checkpoint from before the fused
        # AdamW continues unfused, which keeps the resume exact and keeps fp16's gradient scaler on the
        # unfused step (a fused optimizer merely loaded with unfused settings takes the scaler's fused path).
        unfused = state is not None and not state["optimizer"]["param_groups"][0].get("fused")
        fused = False if unfused else None  # None: the device's fused kernel where it has one
        self.opt = adamw(self.model.parameters(), self.device, cfg.lr, cfg.weight_decay, fused=fused)
        self.scaler = make_grad_scaler(self.device, self.precision)
        self.bin_loss = torch.zeros(N_T_BINS, device=self.device)  # training loss summed per bin of t
        self.bin_count = torch.zeros(N_T_BINS, device=self.device)
        # The compiled wrappers share the weights of model and ema; checkpoints come from the originals.
        self.forward = maybe_compile(self.model, self.compiled)
        self.ema_forward = maybe_compile(self.ema, self.compiled)
        self.step = 0
        self.train_seconds = 0.0
        if state is not None:
            self._restore(state)
        elif overwrite:
            for old in (self.out / "metrics.jsonl",):
                old.unlink(missing_ok=True)
        self.paths = self.val_paths = None  # distillation: the teacher's paths (tinydit.distill.TeacherPaths)
        if self.teacher_state is not None:
            self.paths, self.val_paths = distill.run_paths(cfg, self.teacher_state, self.out / "teacher_paths.pt",
                                                           self.device, self.precision, self.progress)
            self._log({"step": self.step, "teacher_paths": len(self.paths), "teacher_nfe": self.paths.nfe,
                       "teacher_seconds": round(self.paths.seconds, 1)})  # fmt: skip
        self.n_train = len(self.paths) if self.paths is not None else len(self.train_set)
        self.batch_size = min(cfg.batch_size, self.n_train)
        self.steps_per_epoch = self.n_train // self.batch_size
        self._perm_epoch, self._perm = -1, torch.empty(0, dtype=torch.long)
        self._write_config()

    # ---------------------------------------------------------------------------------- text data

    def _hold_out(self, ds, phrases: tuple[str, ...]):
        """The training set without the images whose caption holds a held-out phrase (``--holdout``)."""
        if not phrases:
            return ds
        held = [holds_phrase(c, phrases) for c in ds.captions]
        for phrase in phrases:
            if not any(holds_phrase(c, (phrase,)) for c, h in zip(ds.captions, held, strict=True) if h):
                warnings.warn(f"--holdout phrase {phrase!r} matches no training caption, so it holds nothing out",
                              stacklevel=3)  # fmt: skip
        keep = [i for i, h in enumerate(held) if not h]
        if not keep:
            raise TinyDiTError(f"--holdout {self.cfg.holdout!r} removes every training image; hold out less")
        self.n_held_out = len(ds) - len(keep)
        return ds.subset(keep) if self.n_held_out else ds

    def _grid_prompts(self) -> list[str]:
        """The prompts of the sample grids, one row each: for shapes a fixed list (held-out combinations
        included), else the first 8 distinct training captions."""
        if self.data_name == "shapes":
            from tinydit.adherence import GRID_PROMPTS

            return list(GRID_PROMPTS)
        return list(dict.fromkeys(self.train_set.captions))[:8]

    def _batch(self, ds, tokens: torch.Tensor | None, idx: torch.Tensor, generator=None):
        """Images (B, C, H, W) and their conditions: labels (B,), or caption ids (B, L) in text runs."""
        x, y = ds.batch(idx, generator=generator, device=self.device)
        if tokens is not None:
            y = tokens[idx].to(self.device, non_blocking=True)
        return x, y

    # ---------------------------------------------------------------------------------- run state

    def _check_same_run(self, state: dict) -> None:
        old = TrainConfig.from_dict(state["train_config"])
        old_data, new_data = state["data"]["name"], canonical_name(self.cfg.data)  # both canonical
        changed = [
            f"{name}: {getattr(old, name)!r} -> {getattr(self.cfg, name)!r}"
            for name in TRAJECTORY_FIELDS
            if name != "data" and getattr(old, name) != getattr(self.cfg, name)
        ]
        if old_data != new_data:
            changed.insert(0, f"data: {old_data!r} -> {new_data!r}")
        if changed:
            raise TinyDiTError(
                f"{self.out} holds a run with other settings ({'; '.join(changed)}); "
                "re-run with the same settings to continue it, or choose another --out (or --overwrite)"
            )
        self._check_same_schedule(old, int(state["step"]))

    def _restore(self, state: dict) -> None:
        if config_from_dict(self.cfg.model, state["model_config"]) != self.model_config:
            raise TinyDiTError(
                f"{self.ckpt_path} holds another model ({state['model_config']}); choose another --out"
            )
        if state["data"]["classes"] != self.train_set.classes:
            raise TinyDiTError(
                f"the classes of {self.cfg.data} changed since {self.ckpt_path} was written "
                f"({state['data']['classes']} -> {self.train_set.classes}); choose another --out"
            )
        self.model.load_state_dict(state["model"])
        self.ema.load_state_dict(state["ema"])
        self.opt.load_state_dict(state["optimizer"])
        if "grad_scaler" in state and self.scaler.is_enabled():
            self.scaler.load_state_dict(state["grad_scaler"])
        self.step = int(state["step"])
        self.train_seconds = float(state["train_seconds"])
        torch.set_rng_state(state["rng"]["torch"])
        if torch.cuda.is_available() and state["rng"].get("cuda"):
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])

    def _check_same_schedule(self, old: TrainConfig, step: int) -> None:
        """--steps and --cooldown may change between invocations only while no step done so far is affected
        (without a cool-down on either side, both starts are inf and nothing is)."""
        new = self.cfg
        changed = (old.steps, old.cooldown) != (new.steps, new.cooldown)
        if changed and step > min(old.cooldown_start(), new.cooldown_start()):
            raise TinyDiTError(
                f"{self.out} is at step {step}, past the start of a learning-rate cool-down "
                f"(--steps {old.steps} --cooldown {old.cooldown} before, --steps {new.steps} --cooldown "
                f"{new.cooldown} now), so its schedule is fixed: finish it with --steps {old.steps} --cooldown "
                f"{old.cooldown}, or train another run (--out, --overwrite)"
            )

    def state_dict(self) -> dict:
        text = {"tokenizer": self.tokenizer.to_dict()} if self.text else {}
        return {
            "model_type": self.cfg.model,
            "model_config": self.model_config.to_dict(),
            **text,
            "train_config": self.cfg.to_dict(),
            "data": {
                "name": self.data_name,
                "classes": list(self.train_set.classes),
                "channels": self.train_set.channels,
                "img_size": self.train_set.img_size,
                **({"prompts": list(self.prompts)} if self.text else {}),
            },
            "model": unwrap(self.model).state_dict(),
            "ema": unwrap(self.ema).state_dict(),
            "optimizer": self.opt.state_dict(),
            "grad_scaler": self.scaler.state_dict(),
            "step": self.step,
            "train_seconds": self.train_seconds,
            "kernels": {"device": self.device.type, "precision": self.precision, **self.kernels()},
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            },
        }

    def save(self) -> Path:
        """Write the checkpoint, unless the weights went non-finite: then the last good one is kept."""
        if not all(torch.isfinite(p).all() for p in self.model.parameters()):
            raise TinyDiTError(
                f"the weights became NaN or infinite by step {self.step}; the last good checkpoint is kept. "
                "Lower --lr (or raise --warmup) and start again with --overwrite"
            )
        save_checkpoint(self.ckpt_path, self.state_dict())
        return self.ckpt_path

    def kernels(self) -> dict[str, str]:
        """The kernels this run's device and precision get (``tinydit.linear``, ``tinydit.attention``): two
        machines that pick differently train to results that differ by float rounding."""
        x = torch.empty(0, device=self.device)
        with self._linear_kernel(), autocast(self.device, self.precision):
            return {"token_linears": resolve_linear(x), "attention": resolve_attention(x)}

    def _write_config(self) -> None:
        resolved = {
            "train": self.cfg.to_dict(),
            "model_type": self.cfg.model,
            "model": self.model_config.to_dict(),
            "data": {"name": self.data_name, "classes": self.train_set.classes, "train_images": len(self.train_set)},
            "params": count_params(self.model),
            "device": str(self.device),
            "precision": self.precision,
            "compile": self.compiled,
            "kernels": self.kernels(),
            "tinydit_version": __version__,
            "torch_version": torch.__version__,
        }
        if self.text:
            resolved["text"] = {"vocab_size": self.tokenizer.vocab_size, "text_len": self.tokenizer.max_len,
                                "holdout": list(self.cfg.held_out_phrases()), "held_out_images": self.n_held_out,
                                "grid_prompts": self.prompts}  # fmt: skip
        (self.out / "config.json").write_text(json.dumps(resolved, indent=2) + "\n")

    def _log(self, record: dict) -> None:
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    # ---------------------------------------------------------------------------------- one step

    def lr_at(self, step: int) -> float:
        """Linear warm-up to the peak, then constant (DiT trains at a constant rate); with --cooldown C a
        linear fall over the last C steps, to lr / C at the last step (warmup-stable-decay)."""
        lr = self.cfg.lr * min(1.0, (step + 1) / max(1, self.cfg.warmup))
        if step >= self.cfg.cooldown_start():
            lr *= (self.cfg.steps - step) / self.cfg.cooldown
        return lr

    def ema_decay_at(self, step: int) -> float:
        """EMA warm-up: early averages forget the random initialisation quickly."""
        return min(self.cfg.ema_decay, (1 + step) / (10 + step))

    def batch_indices(self, step: int) -> torch.Tensor:
        epoch, i = divmod(step, self.steps_per_epoch)
        if epoch != self._perm_epoch:
            self._perm = torch.randperm(self.n_train, generator=_generator(self.cfg.seed, 7919, epoch))
            self._perm_epoch = epoch
        return self._perm[i * self.batch_size : (i + 1) * self.batch_size]

    def train_step(self) -> torch.Tensor:
        """One optimizer step; returns the (detached) loss without synchronising the device."""
        cfg, dev = self.cfg, self.device
        g = _generator(cfg.seed, self.step)
        idx = self.batch_indices(self.step)
        if self.paths is not None:
            return self._optimizer_step(self._distill_loss(idx, g))
        x, y = self._batch(self.train_set, self.train_tokens, idx, generator=g)  # (B, C, H, W), (B,) or (B, L)
        n = x.shape[0]
        t = sample_t(n, generator=g, device=dev, kind=cfg.t_sampling, shift=cfg.t_shift)  # (B,)
        noise = torch.randn(x.shape, generator=g).to(dev)  # (B, C, H, W)
        drop = (torch.rand(n, generator=g) < cfg.class_dropout).to(dev)  # (B,) guidance dropout
        # The null label, or the empty caption (BOS, then padding) in text runs.
        drop = drop.view(-1, *[1] * (y.dim() - 1))  # (B,) or (B, 1)
        y = torch.where(drop, unwrap(self.model).null_condition(y), y)

        n_fm = n  # images trained by plain flow matching at their time t
        with autocast(dev, self.precision):
            if cfg.few_step == "shortcut":
                per_sample = shortcut_loss(self.forward, x, y, t, noise, generator=g, reduce=False)  # (B,)
                n_fm = n - n_self_consistency(n)  # the rest are self-consistency examples
            else:
                per_sample = flow_loss(self.forward, x, y, t, noise, reduce=False)  # (B,)
        bins = t_bins(t[:n_fm])  # summed on the device, read at logging time: no sync per step
        self.bin_loss.index_add_(0, bins, per_sample[:n_fm].detach().float())
        self.bin_count.index_add_(0, bins, torch.ones_like(t[:n_fm]))
        return self._optimizer_step(per_sample.mean())

    def _distill_loss(self, idx: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """The student's loss on the teacher paths ``idx`` (no guidance dropout: guidance is in the paths)."""
        states = self.paths.states[idx].to(self.device, non_blocking=True)  # (B, KNOTS + 1, C, H, W) float16
        y = self.paths.y[idx].to(self.device)
        with autocast(self.device, self.precision):
            return distill.distill_loss(self.forward, states, y, generator=g)

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
        ema_update(self.ema, self.model, self.ema_decay_at(self.step))
        self.step += 1
        return loss.detach()

    # ---------------------------------------------------------------------------------- diagnostics

    @torch.no_grad()
    def validation_loss(self, model: nn.Module) -> float:
        """Loss on the fixed held-out images with fixed noise and evenly spread t: comparable across runs."""
        return self.validation_losses(model)[0]

    @torch.no_grad()
    def validation_losses(self, model: nn.Module) -> tuple[float, list[float]]:
        """The validation loss, and the same loss in N_T_BINS equal bins of t (each bin holds the same
        number of images, because the validation times are evenly spread). Distillation: the student's
        loss on the teacher's validation paths, and the same for each step count of STUDENT_STEPS."""
        if self.val_paths is not None:
            was_training = model.training
            model.eval()
            paths = self.val_paths
            by_steps = distill.distill_losses_by_steps(model, paths.states.to(self.device), paths.y.to(self.device))
            model.train(was_training)
            return sum(by_steps) / len(by_steps), by_steps
        val, tokens = self.val_set, self.val_tokens
        n = len(val)
        g = torch.Generator().manual_seed(VAL_SEED)
        noise = torch.randn(val.images.shape, generator=g)  # (n, C, H, W)
        t = (torch.arange(n) + 0.5) / n  # (n,) one fixed time per image, covering [0, 1]
        was_training = model.training
        model.eval()
        losses = []
        for i in range(0, n, 256):
            idx = torch.arange(i, min(i + 256, n))
            x, y = self._batch(val, tokens, idx)
            losses.append(flow_loss(model, x, y, t[idx].to(self.device), noise[idx].to(self.device), reduce=False))
        model.train(was_training)
        per_image = torch.cat(losses).cpu()  # (n,)
        bins = t_bins(t)  # (n,)
        per_bin = torch.zeros(N_T_BINS).index_add_(0, bins, per_image)
        counts = torch.bincount(bins, minlength=N_T_BINS).clamp(min=1)
        return per_image.mean().item(), (per_bin / counts).tolist()

    @torch.no_grad()
    def sample_grid(self, per_class: int = 8) -> Path:
        """EMA samples from fixed noise (the same grid at every step): one column per class, or in text
        runs one row of ``per_class`` images per prompt of ``self.prompts``."""
        cfg = self.model_config
        if self.text:
            ids = self.tokenizer.encode(self.prompts, warn=False)  # (P, L)
            y, nrow = ids.repeat_interleave(per_class, dim=0).to(self.device), per_class  # (P * per_class, L)
        else:
            y, nrow = class_cycle(per_class * cfg.n_classes, cfg.n_classes, self.device), cfg.n_classes
        gen = _generator(self.cfg.seed, 31)
        noise = torch.randn(len(y), cfg.in_channels, cfg.img_size, cfg.img_size, generator=gen)  # (n, C, H, W)
        steps, scale = self.cfg.sample_steps, self.cfg.sample_cfg
        if self.paths is not None:
            steps, scale = 4, 1.0  # a distilled student: 4 steps, guidance already in its paths
        with autocast(self.device, self.precision):
            x = euler_sample(self.ema_forward, noise.to(self.device), y, steps, scale).x
        folder = self.out / "samples"
        folder.mkdir(exist_ok=True)
        path = folder / f"step_{self.step:06d}.png"
        save_grid(x.cpu(), path, nrow=nrow)
        save_grid(x.cpu(), self.out / "samples.png", nrow=nrow)
        return path

    def _validate(self) -> tuple[float, float, list[float]]:
        val = self.validation_loss(self.model)
        val_ema, by_t = self.validation_losses(self.ema)
        key = "val_loss_ema_by_steps" if self.paths is not None else "val_loss_ema_by_t"
        self._log({"step": self.step, "val_loss": val, "val_loss_ema": val_ema, key: [round(v, 5) for v in by_t]})
        return val, val_ema, by_t

    # ---------------------------------------------------------------------------------- the loop

    def _done(self, started: float) -> bool:
        cfg = self.cfg
        if cfg.steps is not None and self.step >= cfg.steps:
            return True
        return cfg.minutes is not None and self._seconds(started) >= cfg.minutes * 60

    def _seconds(self, started: float) -> float:
        return self.train_seconds + (time.perf_counter() - started)

    def fit(self) -> TrainResult:
        """Train until --steps or --minutes, whichever comes first, then save and report."""
        with self._linear_kernel():
            return self._fit()

    def _linear_kernel(self) -> contextlib.AbstractContextManager:
        """The recorded kernel of a continued run; otherwise whatever the caller's context (or auto) picks."""
        return linear_backend(self.linear_kernel) if self.linear_kernel else contextlib.nullcontext()

    def _fit(self) -> TrainResult:
        from tqdm.auto import tqdm

        cfg = self.cfg
        started = time.perf_counter()
        if self._done(started):
            print(f"{self.out}: already trained to step {self.step}; raise --steps or --minutes to continue",
                  file=sys.stderr)
            return TrainResult(self.step, self.train_seconds, None, None, self.ckpt_path, None)

        if self.step == 0:
            what = f"{cfg.preset}, text-conditioned," if self.text else cfg.preset
            held = f", {self.n_held_out} held out: {cfg.holdout}" if self.n_held_out else ""
            print(f"training {what} ({count_params(self.model) / 1e6:.2f}M parameters) on {self.data_name} "
                  f"({len(self.train_set)} images, {self.train_set.channels}x{self.train_set.img_size}x"
                  f"{self.train_set.img_size}{held}) on {self.device}; run directory {self.out}", file=sys.stderr)
        else:
            print(f"continuing {self.out} from step {self.step}", file=sys.stderr)
        bar = tqdm(total=cfg.steps, initial=self.step, unit="step", disable=not self.progress, dynamic_ncols=True)
        self.model.train()
        loss_sum, loss_n = torch.zeros((), device=self.device), 0  # summed on the device: no sync per step
        window_start, window_step = time.perf_counter(), self.step
        val = val_ema = None
        by_t: list[float] = []
        samples = None
        with GracefulInterrupt() as interrupt:
            while not self._done(started) and not interrupt.requested:
                loss_sum += self.train_step()
                loss_n += 1
                bar.update(1)
                s = self.step
                if s % cfg.log_every == 0 or self._done(started):
                    now = time.perf_counter()
                    img_s = (s - window_step) * self.batch_size / max(now - window_start, 1e-9)
                    loss = (loss_sum / loss_n).item()
                    if not math.isfinite(loss):
                        raise TinyDiTError(
                            f"the training loss became {loss} by step {s}; the last good checkpoint is kept. "
                            "Lower --lr (or raise --warmup) and start again with --overwrite"
                        )
                    train_by_t = (self.bin_loss / self.bin_count).tolist()  # NaN where no time fell in a bin
                    self._log({"step": s, "loss": loss, "lr": self.lr_at(s - 1), "img_per_s": img_s,
                               "train_seconds": self._seconds(started),
                               "loss_by_t": [round(v, 5) if math.isfinite(v) else None for v in train_by_t]})
                    self.bin_loss.zero_()
                    self.bin_count.zero_()
                    postfix = {"loss": f"{loss:.4f}", "img/s": f"{img_s:.0f}"}
                    if cfg.minutes is not None:
                        left = max(0.0, cfg.minutes * 60 - self._seconds(started))
                        postfix["left"] = time.strftime("%M:%S", time.gmtime(left))
                    bar.set_postfix(postfix)
                    loss_sum.zero_()
                    loss_n, window_start, window_step = 0, now, s
                if s % cfg.val_every == 0:
                    val, val_ema, by_t = self._validate()
                if s % cfg.sample_every == 0:
                    samples = self.sample_grid()
                if s % cfg.ckpt_every == 0:
                    self.train_seconds = self._seconds(started)
                    started = time.perf_counter()
                    self.save()
        if interrupt.requested:
            self.train_seconds = self._seconds(started)
            self.save()
            bar.close()
            print(f"interrupted at step {self.step}; checkpoint saved to {self.ckpt_path}. "
                  "Re-run the same command to continue.", file=sys.stderr)
            raise KeyboardInterrupt
        bar.close()
        self.train_seconds = self._seconds(started)
        if self.step % cfg.val_every:
            val, val_ema, by_t = self._validate()
        if self.step % cfg.sample_every:
            samples = self.sample_grid()
        self.save()
        print(f"step {self.step}: val loss {val:.4f} (EMA {val_ema:.4f}) after "
              f"{self.train_seconds / 60:.1f} min; checkpoint {self.ckpt_path}, samples {samples}", file=sys.stderr)
        if self.paths is not None:
            pairs = zip(distill.STUDENT_STEPS, by_t, strict=True)
            print("EMA val loss by step count: " + ", ".join(f"{n} steps {v:.4f}" for n, v in pairs), file=sys.stderr)
        else:
            print(f"EMA val loss by t (0 = data ... 1 = noise, {N_T_BINS} bins): "
                  + " ".join(f"{v:.3f}" for v in by_t), file=sys.stderr)
        return TrainResult(self.step, self.train_seconds, val, val_ema, self.ckpt_path, samples)
