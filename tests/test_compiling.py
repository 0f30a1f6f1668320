"""Compiling on a time budget (tinydit.compiling): regional compilation, the kept cache, and a bad cache costing
speed, not the run. The cases that compile run in their own processes, as a run meets its cache."""

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from tinydit import compiling
from tinydit.cli import main
from tinydit.compiling import unwrap
from tinydit.errors import TinyDiTError
from tinydit.models.dit import DiT
from tinydit.models.dit_config import DiTConfig
from tinydit.runtime import maybe_compile, resolve_compile

# A model with a `blocks` list, compiled by tinydit.runtime.maybe_compile in a fresh process; prints its output.
SCRIPT = textwrap.dedent(
    """
    import torch, warnings
    from torch import nn
    from tinydit.runtime import maybe_compile

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(2))

        def forward(self, x):
            for block in self.blocks:
                x = x + block(x)
            return x

    torch.manual_seed(0)
    model = Tiny()
    x = torch.randn(4, 8)
    with torch.no_grad():
        eager = model(x)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = maybe_compile(model, True)(x)
    for w in caught:
        if "compil" in str(w.message):  # TinyDiT's about the cache (torch's own may come and go)
            print("warning:", w.message)
    print("equal:", torch.allclose(out, eager, atol=1e-6))
    """
)


def _kept(xdg: Path) -> Path:
    return xdg / "tinydit" / "compile" / f"torch-{torch.__version__}"


def _compile_in(xdg: Path, **popen) -> subprocess.Popen:
    """The script in a fresh process whose kept cache is under ``xdg`` (as ~/.cache is a user's)."""
    env = {k: v for k, v in os.environ.items() if k != compiling.CACHE_ENV}
    env["XDG_CACHE_HOME"] = str(xdg)
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
    )


def _finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    return out


def _dit(**kw) -> DiT:
    return DiT(DiTConfig(img_size=16, in_channels=3, patch_size=4, dim=32, depth=3, n_heads=2, n_classes=4, **kw))


def test_the_compile_scope_chooses_the_blocks_or_the_whole_model(monkeypatch, tmp_path, capsys):
    """TINYDIT_COMPILE_SCOPE=model compiles a CPU model whole, as on CUDA (nothing compiles until the first call);
    a scope it does not know is one clear error, which a training run gives before it writes anything."""
    monkeypatch.setenv("TINYDIT_COMPILE_SCOPE", "model")
    model = _dit()
    compiled = maybe_compile(model, True)
    assert isinstance(compiled, compiling.GuardedCompile) and unwrap(compiled) is model
    assert all(b._compiled_call_impl is None for b in model.blocks)  # no block compiled in place
    monkeypatch.setenv("TINYDIT_COMPILE_SCOPE", "everything")
    with pytest.raises(TinyDiTError, match="TINYDIT_COMPILE_SCOPE must be one of blocks, model, got 'everything'"):
        maybe_compile(_dit(), True)
    out = tmp_path / "run"
    flags = ["--data", "shapes", "--preset", "dit-0.2m", "--limit", "32", "--steps", "1", "--compile", "on"]
    assert main(["train", *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "error:" in line] == [
        "tinydit train: error: TINYDIT_COMPILE_SCOPE must be one of blocks, model, got 'everything'"
    ]
    assert not out.exists()


def test_regions_are_the_repeated_blocks_compiled_in_place_with_the_weights_untouched():
    from tinydit.models.mmdit import MMDiT, MMDiTConfig

    model = _dit()
    keys = list(model.state_dict())
    assert compiling.repeated_blocks(model) == list(model.blocks)
    small = dict(img_size=16, in_channels=3, patch_size=4, dim=32, n_heads=2, vocab_size=8, text_len=4)
    mmdit = MMDiT(MMDiTConfig(depth=2, single_blocks=1, **small))
    assert compiling.repeated_blocks(mmdit) == [*mmdit.blocks, *mmdit.single_blocks]
    assert maybe_compile(model, True) is model  # the blocks compiled in place: the model is the forward
    assert all(b._compiled_call_impl is not None for b in model.blocks)
    assert list(model.state_dict()) == keys and unwrap(model) is model  # checkpoints hold the same names
    with pytest.raises(ValueError, match="no `\\*blocks` list"):
        compiling.compile_regions(nn.Linear(2, 2))


def _failing_compile(failures: list[int]):
    """A stand-in for torch.compile whose compiled function fails like a full disk the first failures[0] times."""

    def fake(fn, **kwargs):
        def compiled(*args, **kw):
            if failures[0]:
                failures[0] -= 1
                raise OSError(errno.ENOSPC, "No space left on device")
            return fn(*args, **kw)

        return compiled

    return fake


@pytest.mark.parametrize("failures", [1, 2])
def test_a_block_whose_compilation_fails_is_retried_alone_then_every_block_runs_eagerly(
    failures, tmp_path, monkeypatch
):
    """A cache on a full disk (or corrupt) fails inside a block's first compiled call: one warning, the
    cache set aside, the block called again (not the model around it, whose DDP wrapper would repeat its
    collectives); a second failure warns again and returns every block to eager. Other errors pass."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(compiling.CACHE_ENV, raising=False)
    kept = compiling.use_cache_dir()
    (kept / "entry").write_text("half-written")
    monkeypatch.setattr(torch, "compile", _failing_compile([failures]))
    torch.manual_seed(0)
    model = _dit()
    x, t, y = torch.randn(2, 3, 16, 16), torch.rand(2), torch.tensor([0, 1])
    with torch.no_grad():
        eager = model(x, t, y)
        compiling.compile_regions(model)
        with pytest.warns(UserWarning) as caught:
            out = model(x, t, y)
    messages = [str(w.message) for w in caught]
    assert "could not be used" in messages[0] and "No space left" in messages[0]
    assert not (kept / "entry").exists()  # the kept cache was set aside
    assert torch.equal(out, eager)
    if failures == 1:
        assert len(messages) == 1 and all(b._compiled_call_impl is not None for b in model.blocks)
    else:
        assert len(messages) == 2 and "without compiling" in messages[1]
        assert all(b._compiled_call_impl is None for b in model.blocks)


def test_a_directory_the_user_named_is_never_emptied_and_other_errors_pass(tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "entry").write_text("theirs")
    monkeypatch.setenv(compiling.CACHE_ENV, str(mine))
    model = nn.Linear(3, 2)

    def full_disk(x):
        raise OSError(errno.ENOSPC, "No space left on device")

    guarded = compiling.GuardedCompile(model, full_disk)
    x = torch.randn(5, 3)
    with pytest.warns(UserWarning) as caught:
        out = guarded(x)
    assert ["could not be used" in str(w.message) for w in caught] == [True, False]  # then: without compiling
    assert torch.equal(out, model(x)) and guarded.guard.eager
    assert (mine / "entry").read_text() == "theirs"  # left as it was: this process moved to a fresh one
    assert os.environ[compiling.CACHE_ENV] != str(mine)
    assert unwrap(guarded) is model  # checkpoints are saved from the plain module

    def bug(x):
        raise ValueError("a shape error in the model")

    with pytest.raises(ValueError, match="shape error"):
        compiling.GuardedCompile(model, bug)(x)  # not the cache's fault: no retry, no warning


def test_the_cache_is_kept_where_the_user_says_else_in_the_user_cache_and_an_unwritable_one_is_replaced(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(compiling.CACHE_ENV, str(tmp_path / "mine"))
    assert compiling.cache_dir() == tmp_path / "mine"
    monkeypatch.delenv(compiling.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compiling.cache_dir() == tmp_path / "xdg" / "tinydit" / "compile" / f"torch-{torch.__version__}"
    # Inductor's own default (written into the variable when it is imported) is not a user's choice
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv(compiling.CACHE_ENV, default_cache_dir())
    assert compiling.cache_dir().is_relative_to(tmp_path / "xdg")
    # A directory that cannot be made (even by root: a file stands in its path) costs a cold start, not the run.
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(compiling.CACHE_ENV, str(tmp_path / "file" / "cache"))
    with pytest.warns(UserWarning, match="cannot be written"):
        used = compiling.use_cache_dir()
    assert used.is_dir() and os.environ[compiling.CACHE_ENV] == str(used)


def test_auto_compiles_the_quick_start_on_a_cpu_with_a_compiler(monkeypatch):
    import tinydit.runtime as runtime

    monkeypatch.setattr(runtime, "has_cxx_compiler", lambda: True)
    assert resolve_compile("auto", torch.device("cpu"), 5) is True  # README: `--minutes 5`
    assert resolve_compile("auto", torch.device("cpu"), 1) is False  # a minute cannot win a cold start back


@pytest.mark.slow
def test_runs_share_a_cache_at_once_one_killed_mid_compile_costs_nothing_and_a_corrupt_one_is_rebuilt(tmp_path):
    """Two runs compile into one empty cache at once and one is killed mid-way: the other finishes. Then
    every entry is corrupted (a stale or torn cache at its worst): the next run warns once, rebuilds it and
    computes what the eager model computes, and the run after it loads the rebuilt cache without a word."""
    xdg, cache = tmp_path / "xdg", _kept(tmp_path / "xdg")
    killed, survivor = _compile_in(xdg, start_new_session=True), _compile_in(xdg)
    deadline = time.monotonic() + 120
    while not any(p.is_file() for p in cache.rglob("*")):  # the first entry written: inside the compilation
        assert killed.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.communicate()
    assert killed.returncode == -signal.SIGKILL
    first = _finish(survivor)
    assert first.strip().endswith("equal: True") and "warning" not in first
    files = [p for p in cache.rglob("*") if p.is_file()]
    assert files
    for p in files:
        p.write_text("garbage")
    second = _finish(_compile_in(xdg))
    assert second.count("warning:") == 1 and "could not be used" in second, second
    assert second.strip().endswith("equal: True")
    third = _finish(_compile_in(xdg))
    assert "warning" not in third and third.strip().endswith("equal: True")
