"""Where a command may write: never over what it reads, nor into what another command or run owns.

Every command that writes (train, sample, eval, sweep, export) checks its output with ``check_out`` before
any work starts, so that a refused output costs nothing and leaves every file as it was:

- the models shipped in the package (``SHIPPED``) are never written, nor anything inside them;
- the output is not what the command reads, nor inside a folder it reads (a subfolder of a run directory
  it reads is allowed: ``tinydit eval --checkpoint RUN --out RUN/eval``);
- a folder of one kind (a run directory, a pretrained folder, a web export, an evaluation, a sweep) is
  written only by its own command: an export into a run directory would replace the run's config.json;
- nothing is written inside a pretrained folder or a web export, which hold the export alone, nor over a
  file a run writes (``RUN/samples.png``); a new file or subfolder in a run directory is the user's;
- an export (a pretrained folder, a web page, an ONNX or torch.export file) replaces an earlier one only
  with ``overwrite``, and goes into a new or empty folder: its config.json and README.md would replace a
  user's own.

The kinds are recognised by the files their writers write, named here (``KINDS``, ``WRITES``); tests
tie the names to their writers'. Hidden files (.lock, .git) are nobody's output and are ignored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from tinydit.errors import TinyDiTError

__all__ = ["SHIPPED", "RUN", "KINDS", "WRITES", "EXPORTS", "kind_of", "check_out", "read_paths", "check_not_shipped"]

SHIPPED = Path(__file__).parent / "reference"  # the reference models inside the package (`tinydit sample --pretrained`)
RUN = "run directory"
# Each kind of folder TinyDiT writes, and the files that mark one (any of them), in the order they are told apart:
# a run directory into which something else was written is still a run directory.
KINDS: dict[str, tuple[str, ...]] = {
    RUN: ("checkpoint.pt", "metrics.jsonl"),  # tinydit train (and a run's config.json, see kind_of)
    "pretrained folder": ("model.safetensors",),  # tinydit export --format safetensors
    "web export": ("model.json",),  # tinydit export --format web
    "evaluation": ("metrics.json",),  # tinydit eval
    "sweep": ("sweep.json",),  # tinydit sweep
}
# The files each kind's command writes into its folder: a folder that holds one of them without being of
# that kind holds someone else's file of that name.
WRITES: dict[str, tuple[str, ...]] = {
    RUN: ("checkpoint.pt", "best.pt", "config.json", "metrics.jsonl", "samples.png", "samples", "report.html"),
    "pretrained folder": ("model.safetensors", "config.json", "README.md"),
    "web export": ("index.html", "sampler.js", "model.onnx", "model.json"),
    "evaluation": ("metrics.json", "report.md", "samples_by_class.png"),
    "sweep": ("sweep.json", "sweep.csv", "sweep.md", "sweep.png"),
}
SUBFOLDER = {"evaluation": "eval", "sweep": "sweep", "pretrained folder": "export", "web export": "web"}  # hints
EXPORTS = ("pretrained folder", "web export")  # a folder that is the export itself: new, empty or an earlier one
MODELS = (RUN, "pretrained folder", "web export")  # folders whose files are a model's: nothing else goes there


def _real(path: str | Path) -> Path:
    """``path`` made absolute with its links followed, so that two names of one file compare equal."""
    return Path(os.path.realpath(os.path.abspath(path)))


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def kind_of(path: str | Path) -> str | None:
    """The kind of TinyDiT folder ``path`` is (a key of ``KINDS``), or None: not a folder, or none of them."""
    path = Path(path)
    try:
        if not path.is_dir():
            return None
        for kind, marks in KINDS.items():
            if any((path / m).exists() for m in marks):
                return kind
        # A run stopped before its first log line or checkpoint holds only the config.json it wrote.
        config = path / "config.json"
        if config.is_file() and {"train", "model"} <= set(json.loads(config.read_text())):
            return RUN
    except (OSError, ValueError, TypeError):  # unreadable, or a config.json that is not a run's object
        return None
    return None


def read_paths(*paths) -> list[Path]:
    """The files and folders a command reads, from its path arguments (None, and objects that are no path,
    such as a ``Checkpoint`` given from Python, are left out): a pretrained folder's config.json or
    model.safetensors stands for the folder too."""
    found = []
    for p in paths:
        if not isinstance(p, (str, os.PathLike)):
            continue
        found.append(Path(p))
        if Path(p).is_file() and kind_of(Path(p).parent) in EXPORTS:
            found.append(Path(p).parent)
    return found


def check_not_shipped(path: str | Path, param: str, fix: str) -> None:
    """Refuse ``path`` (named by ``param``) if it is, or is inside, a model shipped with tinydit."""
    if _inside(_real(path), _real(SHIPPED)):
        raise TinyDiTError(f"`{param}` {path} is a model shipped with tinydit, which no command writes; {fix}")


def check_out(
    out: str | Path, writes: str, reads: Iterable[Path] = (), *, overwrite: bool = False, param: str = "out"
) -> Path:
    """Refuse, before any work, an output ``out`` that would write over what the command reads or what it does
    not own (the rules are the module docstring's). ``writes``: what the command writes there, a kind of
    folder (a key of ``KINDS``), "samples" (a file, or a folder of image files) or "file" (an export's one
    file); ``reads``: its inputs (``read_paths``); ``overwrite``: an earlier export of the same kind may be
    replaced. Returns ``out`` as a Path."""
    out = Path(out)
    real = _real(out)
    check_not_shipped(out, param, f"choose another `{param}`")
    for read in reads:
        there = _real(read)
        if real == there:
            raise TinyDiTError(f"`{param}` {out} is {read}, which this command reads; choose another `{param}`")
        if there.is_dir() and _inside(real, there) and kind_of(there) != RUN:
            raise TinyDiTError(
                f"`{param}` {out} is inside {read}, which this command reads; choose a folder outside it"
            )
    inside = next((p for p in real.parents if kind_of(p) in EXPORTS), None)
    if inside is not None:
        raise TinyDiTError(
            f"`{param}` {out} is inside the {kind_of(inside)} {inside}, which holds the export alone; "
            f"choose another `{param}`"
        )
    if out.suffix and writes in ("samples", "file"):
        return _check_file(out, writes, overwrite, param)
    if out.exists() and not out.is_dir():
        raise TinyDiTError(f"`{param}` {out} exists and is not a folder; choose another `{param}`")
    kind = kind_of(out)
    if kind == writes:
        if writes in EXPORTS and not overwrite:
            raise TinyDiTError(
                f"`{param}` {out} holds an earlier {kind}; pass `overwrite` to replace it, or choose another `{param}`"
            )
        return out
    if kind is not None and (writes != "samples" or kind in MODELS):
        sub = f" (a subfolder such as {out / SUBFOLDER.get(writes, 'out')} is yours)" if kind == RUN else ""
        raise TinyDiTError(
            f"`{param}` {out} is a {kind}, which this command does not write; choose another `{param}`{sub}"
        )
    try:
        held = sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) if out.is_dir() else []
    except OSError:  # unreadable: writing into it fails too, naming the errno (tinydit.files)
        held = []
    theirs = held if writes in EXPORTS else [n for n in held if n in WRITES.get(writes, ())]
    if theirs:
        shown = ", ".join(theirs[:5]) + (" ..." if len(theirs) > 5 else "")
        raise TinyDiTError(
            f"`{param}` {out} holds files that are not a {writes}'s ({shown}), which writing it would replace; "
            f"choose a new or empty folder for `{param}`"
        )
    return out


def _check_file(out: Path, writes: str, overwrite: bool, param: str) -> Path:
    """A file output: not a folder, not a file a run writes, and an export's replaced only with ``overwrite``."""
    if out.is_dir():
        raise TinyDiTError(f"`{param}` {out} is a folder; give a file name, or another `{param}`")
    if kind_of(out.parent) == RUN and out.name in WRITES[RUN]:
        raise TinyDiTError(f"`{param}` {out} is a file of the {RUN} {out.parent}; choose another `{param}`")
    if writes == "file" and out.exists() and not overwrite:
        raise TinyDiTError(f"`{param}` {out} exists; pass `overwrite` to replace it, or choose another `{param}`")
    return out
