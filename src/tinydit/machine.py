"""What TinyDiT keeps about the machine it runs on: where its caches live, and the answers of the timing
probes that choose kernels, so that every run on a machine chooses alike.

Two choices are made by timing (``tinydit.models.linear.onednn_is_faster``: the token-linear kernel;
``tinydit.runtime.cpu_bf16_is_faster``: whether ``precision`` auto trains a CPU run in bf16). The
alternatives round differently, and a timing differs from process to process on a loaded machine, so two
runs of one command and seed would otherwise train to different weights. ``answer`` measures each probe
once per machine and keeps the answer in the machine record, ``~/.cache/tinydit/machine.json``
(``$XDG_CACHE_HOME``; the environment variable ``TINYDIT_MACHINE_RECORD`` names another file). Every later
run reads it there. Deleting the file makes the next run measure again.

The record holds one entry per machine identity: the torch version, the CPU (its model name and the
instruction-set flags its matmul libraries choose kernels by, its logical CPUs) and the thread count a process
runs with (a one-thread process measures another race). A probe whose meaning changes takes a new name, so
an old answer is never read as a new one. For example::

    {"torch 2.14.1, Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz (amx_bf16 avx2 avx512_bf16 avx512f),
      2 CPUs, 2 threads": {"cpu_bf16_is_faster": true, "onednn_is_faster": false}}

Processes that probe at once take turns (a lock beside the file), so they agree, and the file is written
atomically (``tinydit.files``). A record that cannot be read is measured again and replaced; one that
cannot be written (a read-only home, a full disk) costs one warning and a probe in every process, as
before the record existed: never the run.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from filelock import FileLock

from tinydit.errors import TinyDiTError
from tinydit.files import write_text

__all__ = ["RECORD_ENV", "answer", "cache_root", "identity", "record_path"]

RECORD_ENV = "TINYDIT_MACHINE_RECORD"
# The flags x86 and Arm CPUs report that decide which matmul kernels oneDNN and the BLAS libraries run.
_KERNEL_FLAGS = {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "bf16", "i8mm", "sve", "sve2"}
# How long a process waits for another one measuring the same machine (a probe takes well under a second).
_LOCK_SECONDS = 60
_warned = False  # one warning a process for a record that cannot be kept


def cache_root() -> Path:
    """Where TinyDiT keeps what outlives a run on this machine: ``$XDG_CACHE_HOME/tinydit``, else
    ``~/.cache/tinydit``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tinydit"


def record_path() -> Path:
    """The machine record: ``TINYDIT_MACHINE_RECORD``, else ``machine.json`` in ``cache_root()``."""
    return Path(os.environ.get(RECORD_ENV) or cache_root() / "machine.json")


@functools.lru_cache(maxsize=1)
def _cpu() -> str:
    """The CPU's model name and kernel flags (``/proc/cpuinfo``), else what ``platform`` says of it."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:  # not Linux
        return platform.processor() or platform.machine() or "an unknown CPU"
    fields: dict[str, str] = {}
    for line in lines:  # the first processor's fields: the others repeat them
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or platform.machine() or "an unknown CPU"
    flags = sorted(set((fields.get("flags") or fields.get("Features") or "").split()) & _KERNEL_FLAGS)
    return f"{name} ({' '.join(flags)})" if flags else name


def identity() -> str:
    """What a probe's answer holds for: this torch, this CPU and its cores, this process's thread count."""
    return f"torch {torch.__version__}, {_cpu()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads"


def _read(path: Path) -> dict[str, dict[str, bool]]:
    """The record at ``path``; {} where there is none yet. Raises ValueError for a file that is not one."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    entries = record.values() if isinstance(record, dict) else [None]
    if not all(isinstance(e, dict) and all(isinstance(a, bool) for a in e.values()) for e in entries):
        raise ValueError("not a record of probe answers")
    return record


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        # Attributed to ``answer``, inside the package, where the CLI shows it as one line: its own caller may
        # be torch's (``torch.compiler.disable``'s wrapper).
        warnings.warn(message, stacklevel=2)


def answer(probe: str, measure: Callable[[], bool]) -> bool:
    """The answer of ``probe`` recorded for this machine (``identity``), else ``measure()``'s, recorded for
    the runs after this one. A record that cannot be read is replaced; one that cannot be written is left
    alone, with a warning: this process keeps its own measurement."""
    path, key = record_path(), identity()
    measured = None
    try:
        with contextlib.suppress(ValueError):  # a damaged record is replaced below
            known = _read(path).get(key, {}).get(probe)
            if known is not None:
                return known
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{path}.lock", timeout=_LOCK_SECONDS):  # one process measures, the others then read
            try:
                record, damage = _read(path), None
            except ValueError as err:
                record, damage = {}, err
            known = record.get(key, {}).get(probe)
            if known is not None:
                return known
            measured = measure()
            record.setdefault(key, {})[probe] = measured
            write_text(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
        if damage is not None:
            _warn_once(f"the machine record {path} could not be read ({damage}); measured again and replaced it")
        return measured
    except (OSError, TinyDiTError) as err:  # a lock that timed out is an OSError too
        _warn_once(
            f"the machine record {path} cannot be kept ({err}); this run timed its kernels itself, so another run "
            f"on this machine may choose others and round differently (set {RECORD_ENV} to a writable file, or "
            "pin TINYDIT_LINEAR_KERNEL and `precision`)"
        )
        return measure() if measured is None else measured
