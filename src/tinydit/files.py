"""Writing files so that nothing half-written is ever left behind, output folders checked up front, and
the lock that keeps two trainers out of one run directory.

Every file TinyDiT writes (checkpoints, sample images and arrays, reports, sweep tables, plots, cached
features and teacher paths) goes through ``atomic_write``: the bytes go to a temporary file beside the
target, are flushed to disk, and only then ``os.replace`` it. A reader, or a run interrupted mid-save,
sees the old file or the new one, never a mix; a failed write removes its temporary file.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import torch
from filelock import FileLock, Timeout

from tinydit.errors import TinyDiTError

__all__ = [
    "atomic_write",
    "torch_save",
    "write_text",
    "append_line",
    "read_lines",
    "ensure_writable_dir",
    "io_error",
    "RunDirLock",
]


def io_error(path: Path, err: OSError) -> TinyDiTError:
    """An OSError while writing ``path`` as one line naming the path and the errno, and the fix."""
    name = errno.errorcode.get(err.errno, str(err.errno)) if err.errno else type(err).__name__
    fix = "free some space and run the same command again" if err.errno == errno.ENOSPC else "fix that and run again"
    return TinyDiTError(f"cannot write {path}: {err.strerror or err} ({name}); the previous file is kept, {fix}")


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file for writing in ``mode`` ("wb" or "w"); on a clean exit it becomes ``path``.

    An OSError (a full disk, a read-only folder) leaves ``path`` as it was, removes the temporary file
    and is raised as one ``TinyDiTError`` line naming the path and the errno."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")  # same folder, so the rename never crosses file systems
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the rename makes them the file
        os.replace(tmp, path)
    except OSError as err:
        raise io_error(path, err) from err
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def torch_save(path: str | Path, obj) -> None:
    """``torch.save`` atomically. The object is serialised in memory first, so that torch's zip writer
    never meets the disk: a full disk is then an OSError of the write, reported as one line."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    with atomic_write(path) as f:
        f.write(buf.getbuffer())


def write_text(path: str | Path, text: str) -> None:
    """Write a text file atomically."""
    with atomic_write(path, "w") as f:
        f.write(text)


def append_line(path: Path, line: str) -> None:
    """Append one line to a log (metrics.jsonl); a line torn by a full disk is skipped by its readers."""
    try:
        with open(path, "a") as f:
            f.write(line + "\n")
    except OSError as err:
        raise io_error(path, err) from err


def read_lines(path: Path) -> list[dict]:
    """The records of a log written by ``append_line`` (one JSON object a line), [] if there is none; a line
    torn by a kill or a full disk is skipped."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


class RunDirLock:
    """The operating system's lock on a run directory (its ``.lock``), held by a trainer for as long as it
    trains and by a command that rewrites its checkpoint: a second holder is refused at once, naming the
    first. ``filelock`` takes it on every platform (flock on POSIX, the Windows file-locking call there),
    and the OS releases it when the process ends, however it ends, so a ``kill -9`` never leaves a stale
    lock. The holder's pid goes into ``.lock.pid`` beside it, for the message, rather than into the lock
    file, whose bytes filelock owns (a waiting process may empty it, and Windows cannot read a locked byte)."""

    def __init__(self, folder: Path):
        self.path, self.holder = folder / ".lock", folder / ".lock.pid"
        self.lock = FileLock(str(self.path), timeout=0)  # 0: refused at once, never waited for

    def acquire(self) -> RunDirLock:
        """Take the lock (again: a no-op), or raise a one-line ``TinyDiTError`` naming the directory."""
        if self.lock.is_locked:  # filelock counts nested acquires; one release must let go of this one
            return self
        try:
            self.lock.acquire()
        except Timeout:
            try:
                holder = f"process {int(self.holder.read_text())}"
            except (OSError, ValueError):  # not written yet, or unreadable: the lock alone is sure
                holder = "another process"
            raise TinyDiTError(
                f"{self.path.parent} is being trained by {holder}; wait for it to finish (or stop it), "
                "or choose another `out`"
            ) from None
        with contextlib.suppress(OSError):  # the pid only names the holder in a message: the lock holds without it
            self.holder.write_text(str(os.getpid()))
        return self

    def release(self) -> None:
        if self.lock.is_locked:
            self.lock.release(force=True)


def ensure_writable_dir(path: str | Path, param: str = "`out`") -> Path:
    """Create ``path`` if needed and prove it can be written, before any long work starts."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise TinyDiTError(f"{path} exists and is not a directory; choose another {param}")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".tinydit-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise TinyDiTError(f"cannot write to output directory {path} ({err.strerror}); choose another {param}") from err
    return path
