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
  the first compiled call raise. ``GuardedCompile`` then warns once, clears that cache (or moves to a fresh
  temporary one where it cannot be written) and compiles again; should that fail too, it warns and the run
  goes on eagerly. A bad cache costs speed, never the run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

__all__ = [
    "CACHE_ENV",
    "GuardedCompile",
    "cache_dir",
    "compile_regions",
    "eagerly",
    "repeated_blocks",
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


def _default_cache_dir() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "tinydit" / "compile" / f"torch-{torch.__version__}"


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path):
            return True
    except OSError:
        return False


def _fresh_dir() -> Path:
    """An empty temporary cache, in place of one that cannot be written; Inductor is pointed at it."""
    path = Path(tempfile.mkdtemp(prefix="tinydit-compile-"))
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


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model``'s ``*blocks`` lists (a DiT's ``blocks``, an MMDiT's ``blocks`` and
    ``single_blocks``), in order; a DDP wrapper is looked through."""
    model = getattr(model, "module", model) if isinstance(model, nn.parallel.DistributedDataParallel) else model
    return [
        block
        for name, child in model.named_children()
        if name.endswith("blocks") and isinstance(child, nn.ModuleList)
        for block in child
    ]


def compile_regions(model: nn.Module) -> Callable[[], None]:
    """Compile each repeated block of ``model`` in place (``nn.Module.compile``: the weights and the
    state dict are untouched); returns what undoes it."""
    blocks = repeated_blocks(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no `*blocks` list to compile by region")
    for block in blocks:
        block.compile()

    def undo() -> None:
        for block in blocks:
            block._compiled_call_impl = None  # what nn.Module.compile set: the block calls itself eagerly again

    return undo


def eagerly() -> contextlib.AbstractContextManager:
    """Run every compiled model and region eagerly inside the block: a pass that runs now and then (the
    validation batch) would otherwise compile a graph of its own, which costs more than it saves."""
    return torch.compiler.set_stance("force_eager")


def _compile_failure(error: Exception) -> bool:
    """Whether ``error`` is Inductor failing to compile or load (InductorError is a BackendCompilerFailed),
    or the disk under its cache failing."""
    import torch._dynamo.exc

    return isinstance(error, (torch._dynamo.exc.BackendCompilerFailed, OSError))


class GuardedCompile:
    """``model`` called through its compiled form ``compiled``, recovering from a compile cache that
    cannot be used: the first failure clears the cache and compiles again, a second one runs eagerly
    (``undo`` takes back a compilation made in place). Other errors pass through unchanged."""

    def __init__(self, model: nn.Module, compiled: Callable, undo: Callable[[], None] | None = None):
        self.model, self.compiled, self._undo = model, compiled, undo
        self._orig_mod = model  # the attribute torch.compile's wrapper has: ``unwrap`` finds the plain module
        self.failures, self.eager = 0, False

    def __call__(self, *args, **kwargs):
        while True:
            try:
                return self.compiled(*args, **kwargs)
            except Exception as e:
                if self.eager or not _compile_failure(e):  # a bug in the model is not the cache's fault
                    raise
                self._recover(e)

    def _recover(self, error: BaseException) -> None:
        self.failures += 1
        reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        torch._dynamo.reset()  # forget what the failed compilation left in this process
        if self.failures == 1:
            path = cache_dir()
            shutil.rmtree(path, ignore_errors=True)
            if not _writable(path):
                path = _fresh_dir()
            warnings.warn(
                f"the compile cache could not be used ({reason[:200]}); compiling again into an empty {path}",
                stacklevel=3,
            )
            return
        warnings.warn(f"compiling failed again ({reason[:200]}); the run goes on without compiling", stacklevel=3)
        if self._undo is not None:
            self._undo()
        self.compiled, self.eager = self.model, True

    def __getattr__(self, name: str):
        # The wrapper stands in for the model where a forward is called (``model.config``, ``.training``).
        return getattr(self.__dict__["model"], name)
