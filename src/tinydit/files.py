"""Writing files so that nothing half-written is ever left behind, and output folders checked up front.

Every file TinyDiT writes (checkpoints, sample images and arrays, reports, sweep tables, plots, cached
features and teacher paths) goes through ``atomic_write``: the bytes go to a temporary file beside the
target, are flushed to disk, and only then ``os.replace`` it. A reader, or a run interrupted mid-save,
sees the old file or the new one, never a mix; a failed write removes its temporary file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from tinydit.errors import TinyDiTError

__all__ = ["atomic_write", "write_text", "ensure_writable_dir"]


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file for writing in ``mode`` ("wb" or "w"); on a clean exit it becomes ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")  # same folder, so the rename never crosses file systems
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the rename makes them the file
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> None:
    """Write a text file atomically."""
    with atomic_write(path, "w") as f:
        f.write(text)


def ensure_writable_dir(path: str | Path, param: str = "out") -> Path:
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
