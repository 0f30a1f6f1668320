"""Compiling a model on a time budget (``tinydit.runtime.maybe_compile`` is the one entry point): what is
compiled, where the compiled kernels are kept between runs, and what a bad cache costs.

- **Regional compilation on a CPU.** The repeated blocks (each module of a model's ``*blocks`` lists) are
  compiled in place, one region each; identical blocks share their compiled graphs, so a cold start
  compiles one block's forward and backward instead of the whole model as one large graph, and the glue
  around the blocks (patches, embeddings, the final layer) runs eagerly. On CUDA, where a run is long beside
  its start-up, the whole model is compiled.
- **The kept cache.** Inductor keeps compiled kernels and graphs (its FX graph and AOTAutograd caches) in
  ``TORCHINDUCTOR_CACHE_DIR``. Where the user has not set it, it is ``$XDG_CACHE_HOME/tinydit/compile/
  torch-<version>`` (``~/.cache/...``), which outlives ``/tmp``, so the second run of a command on a machine
  starts warm. Inductor keys every entry by the graph, its config, the torch version and the CPU's vector
  instruction set, so an entry written by another torch or another CPU kind is never loaded, only missed;
  two runs compiling at once write each entry atomically.
- **A cache that cannot be used** (a corrupt entry, a directory that is read-only or on a full disk) makes
  the first compiled call raise (the backward is compiled in the same call, not at the first backward).
  ``CompileGuard`` then warns once, sets the kept cache aside (a directory the user named is never
  emptied: this process moves to a fresh temporary one) and compiles again; should that fail too, it warns
  and the run goes on eagerly. A bad cache costs speed, never the run.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from tinydit import machine

__all__ = [
    "CACHE_ENV",
    "CompileGuard",
    "GuardedCompile",
    "cache_dir",
    "cache_holds_files",
    "compile_regions",
    "eagerly",
    "repeated_blocks",
    "unwrap",
    "use_cache_dir",
]

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"  # Inductor's own variable: a user's setting is kept


def cache_dir() -> Path:
    """The directory Inductor keeps this process's compiled kernels in: the user's ``TORCHINDUCTOR_CACHE_DIR``,
    else the kept one (``use_cache_dir`` sets it)."""
    # Importing Inductor writes its own default (a folder in /tmp) into the variable: that is not a choice.
    # (Imported here, not with the package: Inductor takes a second or more to import.)
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    given = os.environ.get(CACHE_ENV)
    return Path(given) if given and given != default_cache_dir() else _default_cache_dir()


def cache_holds_files() -> bool:
    """Whether the compile cache (``cache_dir``) holds anything. Inductor names its entries by hashes of the
    graphs, which only compiling computes, so whether it holds a model's kernels cannot be asked; beside a
    record that a compiled run of the model finished on this machine, this is how ``compile`` auto tells a
    kept cache from an emptied one (``tinydit.runtime.choose_compile``)."""
    path = cache_dir()
    return path.is_dir() and any(entry.is_file() for entry in path.rglob("*"))


def _default_cache_dir() -> Path:
    return machine.cache_root() / "compile" / f"torch-{torch.__version__}"


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path):
            return True
    except OSError:
        return False


def _fresh_dir() -> Path:
    """An empty temporary cache, in place of one that cannot be used, removed when the process ends;
    Inductor is pointed at it."""
    path = Path(tempfile.mkdtemp(prefix="tinydit-compile-"))
    atexit.register(shutil.rmtree, path, True)
    os.environ[CACHE_ENV] = str(path)
    return path


def use_cache_dir() -> Path:
    """Point Inductor at the kept cache, unless ``TORCHINDUCTOR_CACHE_DIR`` is set already; a directory that
    cannot be written is replaced by a temporary one (with a warning): the run compiles, cold."""
    path = cache_dir()
    if _writable(path):
        os.environ[CACHE_ENV] = str(path)
        return path
    fresh = _fresh_dir()
    warnings.warn(
        f"the compile cache {path} cannot be written; compiling into {fresh} instead, so the next run "
        f"starts cold too (set {CACHE_ENV} to a writable directory to keep it)",
        stacklevel=2,
    )
    return fresh


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under torch.compile / DDP wrappers: checkpoints are saved from it."""
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model``'s ``*blocks`` lists (a DiT's ``blocks``, an MMDiT's ``blocks`` and
    ``single_blocks``), in order; a DDP wrapper is looked through."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module
    return [
        block
        for name, child in model.named_children()
        if name.endswith("blocks") and isinstance(child, nn.ModuleList)
        for block in child
    ]


def compile_regions(model: nn.Module) -> None:
    """Compile each repeated block of ``model`` in place (``nn.Module.compile``: the weights and the state
    dict are untouched), each call guarded by one ``CompileGuard``: a failure retries the block alone (not
    a DDP wrapper's collectives around it), and giving up returns every block to eager."""
    blocks = repeated_blocks(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no `*blocks` list to compile by region")

    def undo() -> None:
        for block in blocks:
            block._compiled_call_impl = None  # what nn.Module.compile set: the block calls itself eagerly again

    guard = CompileGuard(undo)
    for block in blocks:
        block.compile()
        block._compiled_call_impl = functools.partial(guard.call, block._compiled_call_impl, block._call_impl)


def eagerly() -> contextlib.AbstractContextManager:
    """Run every compiled model and region eagerly inside the block: a pass that runs now and then (the
    validation batch) would otherwise compile a graph of its own, which costs more than it saves."""
    return torch.compiler.set_stance("force_eager")


def _compile_failure(error: Exception) -> bool:
    """Whether ``error`` is Inductor failing to compile or load (InductorError is a BackendCompilerFailed),
    or the disk under its cache failing."""
    import torch._dynamo.exc

    return isinstance(error, (torch._dynamo.exc.BackendCompilerFailed, OSError))


class CompileGuard:
    """Recovery from a compile cache that cannot be used, shared by the compiled parts of one model: the
    first failure warns, sets the bad cache aside and compiles again; a second one warns, calls ``undo``
    and runs eagerly from then on. Errors that are not Inductor's or the disk's pass through unchanged.

    Only the kept cache (``~/.cache/tinydit/compile/...``) is ever removed; a directory the user named is
    left as it is, and this process compiles into a fresh temporary one instead."""

    def __init__(self, undo: Callable[[], None] | None = None):
        self._undo = undo
        self.failures, self.eager = 0, False

    def call(self, compiled: Callable, eager: Callable, *args, **kwargs):
        while not self.eager:
            try:
                return compiled(*args, **kwargs)
            except Exception as e:
                if not _compile_failure(e):  # a bug in the model is not the cache's fault
                    raise
                self._recover(e)
        return eager(*args, **kwargs)

    def _recover(self, error: BaseException) -> None:
        self.failures += 1
        reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        torch._dynamo.reset()  # forget what the failed compilation left in this process
        if self.failures == 1:
            path = cache_dir()
            if path == _default_cache_dir():  # ours: set aside whole (other runs may be reading it), then removed
                aside = path.with_name(f"{path.name}.bad-{os.getpid()}")
                with contextlib.suppress(OSError):
                    os.replace(path, aside)
                shutil.rmtree(aside, ignore_errors=True)
            if path != _default_cache_dir() or not _writable(path):
                path = _fresh_dir()
            warnings.warn(
                f"the compile cache could not be used ({reason[:200]}); compiling again into an empty {path}",
                stacklevel=2,  # CompileGuard.call, in TinyDiT: its own caller is torch's Module.__call__
            )
            return
        warnings.warn(f"compiling failed again ({reason[:200]}); the run goes on without compiling", stacklevel=2)
        if self._undo is not None:
            self._undo()
        self.eager = True


class GuardedCompile:
    """``model`` called through its whole compiled form ``compiled`` (``torch.compile(model)``), guarded by a
    ``CompileGuard``: eager ``model`` once the guard gives up."""

    def __init__(self, model: nn.Module, compiled: Callable):
        self.model, self.compiled, self.guard = model, compiled, CompileGuard()
        self._orig_mod = model  # the attribute torch.compile's wrapper has: ``unwrap`` finds the plain module

    def __call__(self, *args, **kwargs):
        return self.guard.call(self.compiled, self.model, *args, **kwargs)

    def __getattr__(self, name: str):
        # The wrapper stands in for the model where a forward is called (``model.config``, ``.training``).
        if "model" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["model"], name)
