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

Beside the answers, an entry keeps what CPU training runs measured (``keep_run``, read by ``runs``), so that
``compile`` auto weighs this machine's own runs (``tinydit.runtime.choose_compile``): under ``"runs"``, per
kind of run (its model, data, precision and batch: ``tinydit.train.budget.speed_key``), per way it ran
(eager, or compiled from an empty or the kept cache), the seconds to its first step, the steps per second
after it, and how many runs these are the best of::

    "runs": {"dit dit-1.4m, shapes class, repa, bf16, batch 64": {
        "eager": {"first_step_s": 4.1, "runs": 1, "steps_per_s": 4.93},
        "compiled, empty cache": {"first_step_s": 40.2, "runs": 1, "steps_per_s": 4.99}}}

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
from typing import TypeVar

import torch
from filelock import FileLock

from tinydit.errors import TinyDiTError
from tinydit.files import write_text

__all__ = ["RECORD_ENV", "answer", "cache_root", "identity", "keep_run", "record_path", "runs"]

RECORD_ENV = "TINYDIT_MACHINE_RECORD"
# The flags x86 and Arm CPUs report that decide which matmul kernels oneDNN and the BLAS libraries run.
_KERNEL_FLAGS = {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "bf16", "i8mm", "sve", "sve2"}
# How long a process waits for another one measuring the same machine (a probe takes well under a second).
_LOCK_SECONDS = 60
RUNS = "runs"  # the key of an entry's training-run measurements, beside its probes' answers
_warned = False  # one warning a process for a record that cannot be kept
T = TypeVar("T")


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


def _read(path: Path) -> dict[str, dict]:
    """The record at ``path``; {} where there is none yet. Raises ValueError for a file that is not one."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    entries = record.values() if isinstance(record, dict) else [None]
    if not all(isinstance(e, dict) and all(_valid(name, value) for name, value in e.items()) for e in entries):
        raise ValueError("not a record of probe answers")
    return record


def _valid(name: str, value) -> bool:
    """Whether an entry's ``value`` under ``name`` is what the record keeps there: a probe's answer (a bool),
    or under ``RUNS`` the measurements {kind of run: {way it ran: {field: number}}}."""
    if name != RUNS:
        return isinstance(value, bool)
    return isinstance(value, dict) and all(
        isinstance(ways, dict)
        and all(
            isinstance(fields, dict)
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in fields.values())
            for fields in ways.values()
        )
        for ways in value.values()
    )


def _update(path: Path, change: Callable[[dict], T]) -> T:
    """``change(record)`` under the record's lock, the record written back (atomically) where it changed it;
    returns what ``change`` returns. A record that cannot be read is replaced, with one warning."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{path}.lock", timeout=_LOCK_SECONDS):  # one process changes it, the others then read
        try:
            record, damage = _read(path), None
        except ValueError as err:
            record, damage = {}, err
        before = json.dumps(record, sort_keys=True)
        result = change(record)
        if damage is not None or json.dumps(record, sort_keys=True) != before:
            write_text(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
    if damage is not None:
        _warn_once(f"the machine record {path} could not be read ({damage}); measured again and replaced it")
    return result


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
    measured: list[bool] = []

    def change(record: dict) -> bool:
        known = record.get(key, {}).get(probe)
        if known is None:  # no other process measured it while this one waited for the lock
            known = measure()
            measured.append(known)
            record.setdefault(key, {})[probe] = known
        return known

    try:
        with contextlib.suppress(ValueError):  # a damaged record is replaced below
            known = _read(path).get(key, {}).get(probe)
            if known is not None:
                return known
        return _update(path, change)
    except (OSError, TinyDiTError) as err:  # a lock that timed out is an OSError too
        _warn_once(
            f"the machine record {path} cannot be kept ({err}); this run timed its kernels itself, so another run "
            f"on this machine may choose others and round differently (set {RECORD_ENV} to a writable file, or "
            "pin TINYDIT_LINEAR_KERNEL and `precision`)"
        )
        return measured[0] if measured else measure()


def runs(kind: str) -> dict[str, dict[str, float]]:
    """What the training runs of ``kind`` measured on this machine, by the way each ran ({way: {field:
    number}}, as ``keep_run`` kept them); {} where none is recorded, or the record cannot be read (the next
    ``keep_run`` replaces it)."""
    try:
        return _read(record_path()).get(identity(), {}).get(RUNS, {}).get(kind, {})
    except (OSError, ValueError):
        return {}


def keep_run(kind: str, way: str, update: Callable[[dict | None], dict[str, float]]) -> None:
    """Record what a training run of ``kind`` that ran ``way`` measured: ``update`` turns what is kept for them
    on this machine (None where nothing is yet) into what is kept from now on. A record that cannot be
    written costs one warning, never the run."""
    path, key = record_path(), identity()

    def change(record: dict) -> None:
        ways = record.setdefault(key, {}).setdefault(RUNS, {}).setdefault(kind, {})
        ways[way] = update(ways.get(way))

    try:
        _update(path, change)
    except (OSError, TinyDiTError) as err:
        _warn_once(
            f"the machine record {path} cannot be kept ({err}); `compile` auto cannot weigh what this run "
            f"measured in later runs (set {RECORD_ENV} to a writable file)"
        )
