"""Several processes, one run: PyTorch's own distributed engine (torchrun, a process group, DDP).

TinyDiT never starts processes itself: ``torchrun --nproc_per_node N -m tinydit train ...`` (or
``tinydit train --nproc N``, which calls torchrun) starts them and sets RANK, WORLD_SIZE and LOCAL_RANK;
``init`` reads those and joins the process group: NCCL on CUDA (one GPU per local rank), gloo on CPU.
Without them everything runs in one process, as before, and every helper here is a no-op.

What every rank of a run computes is fixed by the 1-rank run: each rank draws a step's random numbers
for the whole global batch (the same seeded generator on every rank, ``tinydit.train.optim``) and keeps
its own contiguous share (``World.share``), so N ranks see exactly the images, flips, times, noise and
guidance dropout one rank would. DDP averages the shares' gradients, which is the global batch's mean.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import gc
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tinydit.errors import TinyDiTError

__all__ = ["World", "launched", "rank", "init", "launch_local", "SINGLE"]

# How long a rank waits in a collective for the others. Rank 0 alone validates, draws sample grids,
# evaluates and writes checkpoints while the others wait at the next step, so this bounds those; a rank
# that dies is noticed at once (its sockets close, and torchrun stops the rest), not after this.
TIMEOUT = datetime.timedelta(minutes=30)


def rank() -> int:
    """This process's rank under torchrun, else 0 (read from the environment: no process group needed)."""
    return int(os.environ["RANK"]) if launched() else 0


def launched() -> bool:
    """Whether this process was started by torchrun (or anything that sets its environment)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


@dataclass(frozen=True)
class World:
    """This process's place among the run's processes. ``backend`` None: a single process, no group."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def main(self) -> bool:
        """Rank 0: the one that writes checkpoints, logs, samples and reports, and prints."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        """A process group exists (torchrun started this process), even one of size 1."""
        return self.backend is not None

    def share(self, n: int) -> slice:
        """This rank's contiguous share of n items: sizes differ by at most one, rank 0's first."""
        base, extra = divmod(n, self.size)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + (self.rank < extra))

    def device(self, device: torch.device) -> torch.device:
        """The device this rank runs on: its own GPU (``cuda:LOCAL_RANK``) under NCCL, else ``device``."""
        if self.backend == "nccl":
            return torch.device("cuda", self.local_rank)
        return device

    def _flat(self, t: torch.Tensor) -> torch.Tensor:
        return t.cuda(self.local_rank) if self.backend == "nccl" else t.cpu()

    def any(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag true on every rank if it is true on any: how all ranks stop at the same step."""
        if not self.active:
            return flags
        t = self._flat(torch.tensor([int(f) for f in flags], dtype=torch.int32))
        _collective(dist.all_reduce, t, op=dist.ReduceOp.MAX)
        return tuple(bool(v) for v in t.tolist())

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """The sum of ``t`` over the ranks (a new tensor on ``t``'s device)."""
        if not self.active:
            return t
        flat = self._flat(t.detach().clone())
        _collective(dist.all_reduce, flat, op=dist.ReduceOp.SUM)
        return flat.to(t.device)

    def gather(self, part: torch.Tensor, n: int) -> torch.Tensor:
        """Every rank's ``part`` (its ``share(n)`` of n rows) put back in order: (n, ...) on every rank."""
        if not self.active:
            return part
        rows = -(-n // self.size)  # the largest share; shorter ones are padded to it for all_gather
        padded = self._flat(torch.zeros((rows, *part.shape[1:]), dtype=part.dtype))
        padded[: len(part)] = self._flat(part)
        parts = [torch.empty_like(padded) for _ in range(self.size)]
        _collective(dist.all_gather, parts, padded)
        shares = [World(r, self.size).share(n) for r in range(self.size)]
        return torch.cat([p[: s.stop - s.start].cpu() for p, s in zip(parts, shares, strict=True)])

    def barrier(self) -> None:
        if self.active:
            if self.backend == "nccl":
                _collective(dist.barrier, device_ids=[self.local_rank])
            else:
                _collective(dist.barrier)

    @contextlib.contextmanager
    def main_first(self) -> Iterator[None]:
        """Rank 0 runs the block first (it downloads, decodes and caches data, writes teacher paths), then
        the others, which find its files: no two processes write the same file at once."""
        if not self.main:
            self.barrier()
        yield
        if self.main:
            self.barrier()


SINGLE = World()


def init(device: torch.device | str = "cpu") -> World:
    """Join torchrun's process group (once per process) and return this process's ``World``; without
    torchrun's environment, ``SINGLE``. NCCL when ``device`` is CUDA, gloo otherwise."""
    if not launched():
        return SINGLE
    rank, size, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    device = torch.device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if dist.is_initialized():
        if dist.get_backend() != backend:
            raise TinyDiTError(
                f"this process already joined a {dist.get_backend()} process group; a {device.type} "
                f"run needs {backend}: run CPU and CUDA work in separate launches"
            )
        return World(rank, size, local, backend)
    if device.type == "cuda":
        if local >= torch.cuda.device_count():
            raise TinyDiTError(
                f"local rank {local} has no GPU of its own ({torch.cuda.device_count()} visible): "
                "start at most one process per GPU (--nproc_per_node)"
            )
        torch.cuda.set_device(local)
    elif device.type != "cpu":
        raise TinyDiTError(f"several processes run on CUDA (NCCL) or the CPU (gloo), not {device.type}")
    kwargs = {"device_id": torch.device("cuda", local)} if backend == "nccl" else {}
    dist.init_process_group(backend, timeout=TIMEOUT, **kwargs)
    atexit.register(_leave)
    return World(rank, size, local, backend)


def check_split(batch_size: int, size: int) -> None:
    """Each of ``size`` processes takes an equal share of the global batch."""
    if batch_size % size:
        raise TinyDiTError(
            f"`batch_size` {batch_size} (the global batch) does not split evenly over {size} processes; "
            f"use a multiple of {size}"
        )


def _leave() -> None:
    if dist.is_initialized():
        # A DDP reducer left in a reference cycle holds the process group; collected here, while the
        # interpreter is whole, the group's C++ threads are joined by destroy_process_group, not left to
        # the process's exit, where a thread still running aborts the process after a finished run.
        gc.collect()
        with contextlib.suppress(Exception):  # the others may be gone already
            dist.destroy_process_group()


def _collective(fn, *args, **kwargs):
    """Run a collective; another rank gone (crashed, killed) becomes one clear error instead of a trace."""
    try:
        return fn(*args, **kwargs)
    except (RuntimeError, dist.DistError) as err:
        rank = dist.get_rank() if dist.is_initialized() else "?"
        raise TinyDiTError(
            f"rank {rank} lost contact with the other ranks of this run ({str(err).splitlines()[0]}): "
            "another rank crashed or was stopped; its own error is above. The last checkpoint is "
            "kept: re-run the same command to continue"
        ) from err


def launch_local(nproc: int, argv: list[str]) -> int:
    """``tinydit CMD --nproc N ...``: the same command as N processes, started by torchrun on this machine;
    returns the exit status."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    rest, skip = [], False
    for a in argv:  # the command without --nproc N / --nproc=N
        if skip or a.startswith("--nproc="):
            skip = False
            continue
        skip = a == "--nproc"
        if not skip:
            rest.append(a)
    try:
        # "--": torchrun would read abbreviations of its own flags (--n for --nnodes) past the module name
        torchrun(["--standalone", f"--nproc_per_node={nproc}", "-m", "tinydit", "--", *rest])
    except ChildFailedError as err:  # torchrun has printed each failed rank's error above
        print(
            f"tinydit {argv[0]}: error: {len(err.failures)} of {nproc} processes failed "
            f"(first: rank {min(err.failures)}, exit status {err.get_first_failure()[1].exitcode})",
            file=sys.stderr,
        )
        return 1
    return 0
