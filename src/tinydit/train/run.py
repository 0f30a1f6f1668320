"""The state training changes (``Run``): the model and its EMA, the optimizer and the gradient scaler, the
step and the seconds trained, the forwards the loop calls (compiled, wrapped in DDP), the kernels they
run on, and the update."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from tinydit.checkpoints.checkpoint import Checkpoint
from tinydit.compiling import unwrap
from tinydit.config import TrainConfig
from tinydit.errors import TinyDiTError
from tinydit.flow import distill
from tinydit.models.attention import resolve_backend as resolve_attention
from tinydit.models.linear import linear_backend
from tinydit.models.linear import resolve_backend as resolve_linear
from tinydit.models.registry import build_model
from tinydit.runtime import autocast, make_grad_scaler, maybe_compile
from tinydit.train import optim
from tinydit.train.checkpoint import restore
from tinydit.train.repa import Alignment

__all__ = ["Run", "TrainResult"]


@dataclass
class TrainResult:
    """What ``Trainer.fit`` returns: the last step, the training time, the final validation losses and files.
    ``val_loss`` and ``val_loss_ema`` are at times spread evenly over [0, 1] (a student: on its teacher's
    paths); the ``_train_t`` ones at the fixed draw of the run's training times (``tinydit.train.diagnostics``)."""

    step: int
    train_seconds: float
    val_loss: float | None
    val_loss_ema: float | None
    checkpoint: Path
    samples: Path | None
    val_loss_train_t: float | None = None
    val_loss_ema_train_t: float | None = None


class Run:
    """A ``kind`` model of ``config`` on ``device`` with its EMA, AdamW and gradient scaler, at step 0.

    ``student_of``: a teacher's EMA weights to start from (distillation). ``unfused``: keep the unfused
    AdamW of a checkpoint written before the fused one (the two round differently). ``build`` and
    ``optimizer``: what makes the model and its optimizer (``Trainer``'s parameters of the same names). The compiled
    wrappers (``forward``, ``ema_forward``) share the weights of ``model`` and ``ema``; checkpoints come
    from the originals. DDP averages the ranks' gradients in backward; the EMA (updated alike on every
    rank) needs none.
    """

    def __init__(
        self,
        kind: str,
        config,
        cfg: TrainConfig,
        device: torch.device,
        precision: str,
        world,
        compiled: bool,
        student_of: dict | None = None,
        unfused: bool = False,
        repa_encoder: str | None = None,
        build: Callable[..., torch.nn.Module] = build_model,
        optimizer: Callable[..., torch.optim.Optimizer] = optim.adamw,
    ):
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        self.model = build(kind, config).to(device)  # fp32 master weights, saved as they are
        if student_of is not None:
            distill.init_student(self.model, student_of)
        self.ema = copy.deepcopy(self.model).requires_grad_(False).eval()
        # REPA's projector trains beside the model (after it is copied: the EMA holds the model alone)
        self.alignment = Alignment(self.model, repa_encoder).to(device) if repa_encoder else None
        params = [*self.model.parameters(), *(self.alignment.parameters() if self.alignment else ())]
        self.opt = optimizer(params, device, cfg.lr, cfg.weight_decay, fused=False if unfused else None)
        self.world = world
        self.scaler = make_grad_scaler(device, precision)
        ddp = None
        if world.active:
            ddp = DistributedDataParallel(self.model, device_ids=[device.index] if device.type == "cuda" else None)
        self.forward = maybe_compile(ddp or self.model, compiled)
        # The grids' and evaluations' sampling: on a CPU a few seconds a run, less than compiling it would cost.
        self.ema_forward = maybe_compile(self.ema, compiled and device.type != "cpu")
        self.device, self.precision, self.compiled = device, precision, compiled
        self.step, self.train_seconds = 0, 0.0
        self.linear_kernel: str | None = None  # None: whatever the caller's context (or auto) picks

    def restore(self, ckpt: Checkpoint, kind: str, config, classes: list[str]) -> None:
        """Continue from a checkpoint's weights, EMA, optimizer, scaler, step and seconds. A continuation on
        the same kind of device in the same precision also keeps its token-linear kernel: the
        alternatives round differently."""
        if self.alignment is not None:  # before the optimizer's state, which holds the projector's moments
            self.alignment.projector.load_state_dict(ckpt.repa_projector)
        self.step, self.train_seconds = restore(
            ckpt, kind, config, classes, self.model, self.ema, self.opt, self.scaler
        )
        saved = ckpt.kernels
        if saved is not None and (saved["device"], saved["precision"]) == (self.device.type, self.precision):
            self.linear_kernel = saved["token_linears"]

    def kernel(self) -> contextlib.AbstractContextManager:
        """The context the run trains in: a continued run's recorded token-linear kernel, else the caller's."""
        return linear_backend(self.linear_kernel) if self.linear_kernel else contextlib.nullcontext()

    def kernels(self) -> dict[str, str]:
        """The kernels this run's device and precision get: machines that pick differently train to
        results that differ by float rounding."""
        x = torch.empty(0, device=self.device)
        with self.kernel(), autocast(self.device, self.precision):
            return {"token_linears": resolve_linear(x), "attention": resolve_attention(x)}

    def update(self, loss: torch.Tensor, lr: float) -> torch.Tensor:
        """Backward, clip, an optimizer step at ``lr``, the EMA, the next step; returns the detached loss."""
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.opt.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if self.alignment is not None and self.world.active:  # outside DDP: its gradients averaged here
            grads = [p.grad for p in self.alignment.parameters()]
            mean = self.world.sum(torch.cat([g.flatten() for g in grads])) / self.world.size  # one collective
            for g, m in zip(grads, mean.split([g.numel() for g in grads]), strict=True):
                g.copy_(m.view_as(g))
        if self.cfg.grad_clip > 0:
            self.scaler.unscale_(self.opt)  # clip the true gradients, not the scaled ones
            params = [p for group in self.opt.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip)
        self.scaler.step(self.opt)
        self.scaler.update()
        optim.ema_update(self.ema, self.model, optim.ema_decay_at(self.cfg, self.step))
        self.step += 1
        return loss.detach()

    def state_dict(self) -> dict:
        """The weights, EMA, optimizer, scaler, step, seconds and random state: a checkpoint's changing part. Refuses
        weights that went non-finite, so the last good checkpoint is kept."""
        if not all(torch.isfinite(p).all() for p in self.model.parameters()):
            raise TinyDiTError(
                f"the weights became NaN or infinite by step {self.step}; the last good checkpoint is "
                "kept. Lower `lr` (or raise `warmup`) and start again with `overwrite`"
            )
        return {
            "model": unwrap(self.model).state_dict(),
            "ema": unwrap(self.ema).state_dict(),
            "optimizer": self.opt.state_dict(),
            **({"repa_projector": self.alignment.projector.state_dict()} if self.alignment is not None else {}),
            "grad_scaler": self.scaler.state_dict(),
            "step": self.step,
            "train_seconds": self.train_seconds,
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            },
        }
