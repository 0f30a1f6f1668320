import os
import runpy
import shutil
import sys
import tempfile
import types
from pathlib import Path

import pytest
import torch
from filelock import FileLock

import tinydit.train.budget as budget_module
from tinydit.config import TrainConfig
from tinydit.flow.samplers import SampleResult, sample
from tinydit.flow.settings import SamplingSettings
from tinydit.train import Trainer

# pytest-xdist workers (the suite runs with `-n`, see pyproject.toml) share the machine's cores: one thread
# each, here and in the CLI processes the tests start, so that two workers do not fight over two cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    # Inductor compiles in a pool of worker processes, each importing torch: on a worker's one core that is
    # startup without parallelism (the compiled kernels and the cache are the same).
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

# Compiled kernels of the tests go to a cache of their own (kept between runs of the suite on a machine, as
# Inductor's own /tmp default is), not to the user's ~/.cache/tinydit/compile (tinydit.compiling).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(tempfile.gettempdir()) / "tinydit-test-compile"))
# The timing probes' answers likewise (tinydit.machine): not the user's ~/.cache/tinydit/machine.json, even where
# the user has moved theirs.
os.environ["TINYDIT_MACHINE_RECORD"] = str(Path(tempfile.gettempdir()) / "tinydit-test-machine.json")

FAST = dict(
    preset="dit-0.2m",
    batch_size=16,
    limit=256,
    val_size=32,
    log_every=2,
    val_every=4,
    sample_every=1000,
    ckpt_every=1000,
    sample_steps=2,
    warmup=2,
    precision="fp32",
    report=False,
    repa=0.0,  # the alignment's encoder and projector, on every step of every short run: tested in test_repa.py
)


def dead_parameters_after_sgd(model, args, steps: int) -> list[str]:
    """Names of the parameters that got no gradient in the last of ``steps`` SGD steps regressing
    model(*args) onto args[0]. Zero-initialised layers pass no gradient through themselves, so each
    step wakes one more layer of them; the tests say how many steps their model needs."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        (model(*args) - args[0]).pow(2).mean().backward()
        opt.step()
    return [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]


def sample_with(
    name, model, noise, y, steps=32, cfg_scale=1.0, *, generator=None, on_step=None, **options
) -> SampleResult:
    """``tinydit.flow.samplers.sample`` from raw arguments, for tests: the settings built (and so checked)
    first, as every caller of the package builds them."""
    settings = SamplingSettings(name, steps, cfg_scale, **options)
    return sample(settings, model, noise, y, generator=generator, on_step=on_step)


def built_once(tmp_path_factory, name: str, build) -> Path:
    """A directory that ``build(path)`` fills once per test session, shared by the pytest-xdist workers.

    A module- or session-scoped fixture runs once in every worker that runs one of its tests, so a
    fixture that trains (the two-rank reference runs take half a minute) would otherwise run up to once
    per worker. The first worker builds under a file lock; the others wait for it and reuse the result.
    Tests only read what is built here."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' temporary directories share this parent
    path = root / f"shared-{name}"
    with FileLock(str(path) + ".lock"):
        if not (path / ".built").exists():
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir()
            build(path)
            (path / ".built").touch()
    return path


def run_script(script: Path, args: list[str], capsys) -> tuple[int, str, str]:
    """``python SCRIPT ARGS`` as a user runs it, but in the test's process, whose torch is imported already (a
    fresh interpreter spends seconds importing it): its exit code, stdout and stderr."""
    argv, path = sys.argv, list(sys.path)
    sys.argv, sys.path[0:0] = [str(script), *args], [str(script.parent)]  # as `python SCRIPT` sets them
    code = 0
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    finally:
        sys.argv, sys.path[:] = argv, path
    out = capsys.readouterr()
    return code, out.out, out.err


def fast_config(out, **kw) -> TrainConfig:
    """A training config that runs in about a second on a CPU."""
    return TrainConfig(out=str(out), **{"data": "shapes", **FAST, **kw})


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Tests never download: a missing data set must fail fast and the same way with or without a network."""
    monkeypatch.setenv("TINYDIT_OFFLINE", "1")


def fashion_mnist_available() -> bool:
    from tinydit.data import get_fashion_mnist
    from tinydit.errors import TinyDiTError

    try:
        get_fashion_mnist("data", train=False, download=False)
        return True
    except TinyDiTError:
        return False


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One short shapes run shared by the sampling and CLI tests: (run dir, TrainResult)."""
    out = tmp_path_factory.mktemp("run")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    result = Trainer(fast_config(out, steps=8), progress=False).fit()
    return out, result


@pytest.fixture(scope="session")
def eval_cache(tmp_path_factory):
    """One reference-feature cache for the evaluation and sweep tests: the shapes features are computed once
    (its files are written atomically, so workers that fill it at once each write a whole file)."""
    return built_once(tmp_path_factory, "eval-cache", lambda path: None)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
NEEDS_CHROMIUM = "needs a Chromium (Debian: apt-get install chromium; .ci/run does)"


def chromium(profile, *args: str) -> list[str]:
    """A headless Chromium command line that runs as root and reaches nothing outside this machine."""
    return [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        *args,
    ]


@pytest.fixture
def clock(monkeypatch):
    """A fake clock for time budgets (tinydit.train.budget): every reading advances it 0.01 s. Returns the
    one-element list that holds the time, which a test may set (``clock[0] = 0.0``)."""
    now = [0.0]

    def perf_counter():
        now[0] += 0.01
        return now[0]

    monkeypatch.setattr(budget_module, "time", types.SimpleNamespace(perf_counter=perf_counter, time=perf_counter))
    return now
