"""Several processes, one run (torchrun, gloo on the CPU): the same data and weights as one process,
exact continuation across stops and across process counts, one stop for all ranks, no hang when a rank
dies, and sampling split over ranks.

Every run here is the CLI under ``torchrun`` (or ``--nproc``), as a user starts it. One process per
rank with one thread each (torchrun's default), fp32, and the token-linear kernel pinned so that the
reference runs and the stopped ones cannot pick different kernels by timing.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import built_once

from tinydit.checkpoints.checkpoint import load_checkpoint
from tinydit.cli import main
from tinydit.config import TrainConfig
from tinydit.distributed import World
from tinydit.errors import TinyDiTError
from tinydit.models.linear import linear_backend
from tinydit.models.registry import build_model

# REPA's projector trains outside DDP and averages its own gradients: aligning in every run here tests that too.
FLAGS = (
    "--data shapes --preset dit-0.2m --batch-size 16 --limit 256 --val-size 32 --log-every 2 "
    "--val-every 1000 --sample-every 1000 --ckpt-every 1000 --warmup 2 --precision fp32 --no-report "
    "--no-progress --repa 0.5"
).split()
ENV = {
    **os.environ,
    "TINYDIT_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
    "TINYDIT_LINEAR_KERNEL": "blas",
    "OMP_NUM_THREADS": "1",
}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
# 2 ranks against 1: each rank averages its 8 images' losses and DDP averages the 2 gradients, where one
# process averages 16 at once; the sums round differently (about 1e-7 relative per step), and Adam's
# division by the root of its second moment carries that into the weights. After 12 steps the largest
# difference measured was about 2e-6 (2026-12-01, the 2-core EPYC); 1e-4 leaves room for other CPUs
# while a wrong share (another image, time or noise on a rank) moves weights by 1e-3 or more.
ATOL = 1e-4


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nproc: int, *args, extra=()) -> list[str]:
    return [*TORCHRUN, "--standalone", f"--nproc_per_node={nproc}", *extra, "-m", "tinydit", "--", *map(str, args)]


def _run(cmd: list[str], timeout: float = 240) -> str:
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def _train(out: Path, steps: int, nproc: int, *extra) -> str:
    args = ("train", *FLAGS, "--steps", steps, "--out", out, *extra)
    if nproc == 0:  # no torchrun: this process
        _one_process(*args)
        return ""
    return _run(_torchrun(nproc, *args))


def _one_process(*args) -> None:
    """A command in this process, as the ranks run it (one thread, the pinned kernel): the reference that a
    torchrun run of the same command is compared with."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with linear_backend(ENV["TINYDIT_LINEAR_KERNEL"]):
            assert main([*map(str, args)]) == 0
    finally:
        torch.set_num_threads(threads)


def _state(run: Path) -> dict:
    return load_checkpoint(run / "checkpoint.pt")


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The reference runs every test below compares with: 12 steps in one process and on 2 ranks."""

    def build(root: Path) -> None:
        _train(root / "one", 12, 0)
        (root / "two.log").write_text(_train(root / "two", 12, 2))

    root = built_once(tmp_path_factory, "ddp", build)
    return root, (root / "two.log").read_text()


@pytest.mark.parametrize("n", [0, 1, 5, 16, 17])
@pytest.mark.parametrize("size", [1, 2, 3, 8])
def test_shares_cover_every_item_once_in_order(n, size):
    shares = [World(rank, size).share(n) for rank in range(size)]
    assert [i for s in shares for i in range(n)[s]] == list(range(n))
    assert max(s.stop - s.start for s in shares) - min(s.stop - s.start for s in shares) <= 1


def test_two_ranks_train_the_weights_of_one_process(runs):
    root, log = runs
    one, two = _state(root / "one"), _state(root / "two")
    assert one.step == two.step == 12
    diff = _max_diff(one.model, two.model)
    assert diff < ATOL, diff
    diff = _max_diff(one.repa_projector, two.repa_projector)  # averaged over the ranks by hand
    assert diff < ATOL, diff
    # and the weights moved: the comparison is not of two untrained models
    torch.manual_seed(0)  # the run's seed: its initial weights
    init = build_model("dit", one.config).state_dict()
    assert _max_diff(init, one.model) > 100 * ATOL
    # rank 0 alone wrote and printed: one line per run, one metrics file with the global loss
    assert log.count("training dit-0.2m") == 1
    processes = {name: json.loads((root / name / "config.json").read_text())["processes"] for name in ("one", "two")}
    assert processes == {"one": 1, "two": 2}  # config.json says what the run ran on
    lines = [ln for ln in (root / "two" / "metrics.jsonl").read_text().splitlines() if '"loss"' in ln]
    assert len(lines) == 6  # log every 2 steps, written once


def test_two_ranks_train_a_mean_flow_model_as_one_process(tmp_path):
    """The intervals and the folded guidance are drawn for the global batch, and the JVP target of a rank's
    share is its share of the target: two ranks learn what one process learns."""
    assert FLAGS[-2:] == ["--repa", "0.5"]
    flags = [*FLAGS[:-1], "0", "--objective", "meanflow", "--steps", 6]  # the alignment is for `objective` flow
    _one_process("train", *flags, "--out", tmp_path / "one")
    _run(_torchrun(2, "train", *flags, "--out", tmp_path / "two"))
    one, two = _state(tmp_path / "one").model, _state(tmp_path / "two").model
    assert _max_diff(one, two) < ATOL
    torch.manual_seed(0)
    init = build_model("dit", _state(tmp_path / "one").config).state_dict()
    assert _max_diff(init, one) > 100 * ATOL


def test_a_run_continues_on_another_number_of_ranks(runs, tmp_path):
    root, _ = runs
    _train(tmp_path / "run", 6, 0)  # one process for 6 steps, then 2 ranks to the end
    _train(tmp_path / "run", 12, 2)
    assert _max_diff(_state(tmp_path / "run").model, _state(root / "one").model) < ATOL


def test_sigterm_on_one_rank_stops_both_at_one_step_and_the_run_continues_bit_exactly_through_nproc(runs, tmp_path):
    """The stop reaches every rank at the same step, and the checkpoint it leaves continues bit-exactly, here
    through ``--nproc`` (tinydit starting its own ranks) where the run began under torchrun: it ends where the
    uninterrupted two-rank run of the same command ends."""
    root, _ = runs
    out = tmp_path / "run"
    proc = subprocess.Popen(  # 12 steps, as the reference; a line logged every step so that the stop lands early
        _torchrun(2, "train", *FLAGS, "--steps", 12, "--out", out, "--log-every", 1),
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    workers = []
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.time() + 120
        while (not metrics.exists() or metrics.read_text().count('"loss"') < 1) and time.time() < deadline:
            time.sleep(0.05)
        workers = _workers(proc.pid)
        assert len(workers) == 2, workers
        os.kill(workers[-1], signal.SIGTERM)  # one rank only: as a scheduler preempting one node would
        output, _ = proc.communicate(timeout=180)
    finally:
        _kill_job(proc, workers)
    assert proc.returncode != 0, output  # stopped: a run that reached its 12 steps would have exited 0
    assert "SIGTERM: stopping after this step" in output
    assert "interrupted at step" in output
    assert 1 <= _state(out).step < 12
    # The checkpoint holds a whole step of both ranks: the same command continues it to the end.
    _run([sys.executable, "-m", "tinydit", "train", *FLAGS, "--steps", "12", "--out", str(out), "--nproc", "2"])
    assert _equal(_state(out).model, _state(root / "two").model)
    assert _equal(_state(out).ema, _state(root / "two").ema)


def _kill_job(proc: subprocess.Popen, workers: list[int]) -> None:
    """Kill torchrun and its workers (those found before, which torchrun's exit may have orphaned, and
    those alive now): a worker left behind by a failed test would go on training and slow every test
    after it."""
    for pid in {*workers, *_workers(proc.pid), proc.pid}:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def _workers(parent: int) -> list[int]:
    """The pids of torchrun's worker processes (its children that run tinydit), in rank order."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
            cmd = (p / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"tinydit" in cmd:
            env = (p / "environ").read_bytes().split(b"\0")
            rank = next(int(e[5:]) for e in env if e.startswith(b"RANK="))
            found.append((rank, int(p.name)))
    return [pid for _, pid in sorted(found)]


def test_a_killed_rank_ends_the_others_within_seconds(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        _torchrun(2, "train", *FLAGS, "--steps", 100000, "--out", out, "--ckpt-every", 5),
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    workers = []
    try:
        deadline = time.time() + 120
        while not (out / "checkpoint.pt").exists() and time.time() < deadline:
            time.sleep(0.05)
        workers = _workers(proc.pid)
        assert len(workers) == 2, workers
        killed = time.time()
        os.kill(workers[1], signal.SIGKILL)  # rank 1 dies without a word
        output, _ = proc.communicate(timeout=60)
        took = time.time() - killed
        survivors = [pid for pid in workers if _alive(pid)]  # read before the clean-up below kills them
    finally:
        _kill_job(proc, workers)
    assert proc.returncode != 0
    assert took < 15, took
    assert not survivors, survivors
    assert "Signal 9" in output or "SIGKILL" in output  # torchrun names the rank that died and how
    assert _state(out).step >= 5  # the last checkpoint is whole


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_two_local_nodes_rendezvous_over_c10d(runs, tmp_path):
    """The multi-node command of docs/distributed.md, with two "nodes" of one process each on localhost."""
    root, _ = runs
    port = _port()
    args = ["-m", "tinydit", "--", "train", *FLAGS, "--steps", "12", "--out", str(tmp_path / "run")]
    nodes = [
        subprocess.Popen(
            [
                *TORCHRUN,
                "--nnodes=2",
                "--nproc_per_node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=test",
                *args,
            ],
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [node.communicate(timeout=240)[0] for node in nodes]
    assert all(node.returncode == 0 for node in nodes), outputs
    assert _max_diff(_state(tmp_path / "run").model, _state(root / "one").model) < ATOL


def test_an_uneven_global_batch_is_refused_naming_the_flag(tmp_path, monkeypatch, capsys):
    """--nproc refuses it before starting any process; under torchrun each rank's trainer refuses it."""
    from tinydit import distributed
    from tinydit.train import Trainer

    monkeypatch.setattr(distributed, "launch_local", lambda *a: pytest.fail("torchrun was started"))
    out = tmp_path / "run"
    assert main(["train", *FLAGS, "--out", out, "--nproc", 2, "--steps", 2, "--batch-size", 15]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "tinydit train: error: --batch-size 15 (the global batch) does not split evenly over 2 processes; "
        "use a multiple of 2"
    )
    monkeypatch.setattr(distributed, "init", lambda device: World(rank=1, size=2))  # a rank torchrun started
    cfg = TrainConfig(data="shapes", preset="dit-0.2m", limit=64, batch_size=15, steps=2, out=str(out))
    with pytest.raises(TinyDiTError, match="`batch_size` 15 .* does not split evenly over 2 processes"):
        Trainer(cfg, progress=False)
    assert not (out / "checkpoint.pt").exists()


def test_sampling_split_over_ranks_gives_the_images_of_one_process(runs, tmp_path):
    root, _ = runs
    args = [
        "sample",
        "--checkpoint",
        root / "one" / "checkpoint.pt",
        "--n",
        13,
        "--steps",
        3,
        "--sampler",
        "heun",
        "--precision",
        "fp32",
    ]
    _one_process(*args, "--out", tmp_path / "one.npz")
    log = _run(_torchrun(2, *args, "--out", tmp_path / "two.npz"))
    one, two = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert two["images"].shape[0] == 13
    np.testing.assert_array_equal(one["labels"], two["labels"])
    # 7 and 6 images per forward pass instead of 13: the same arithmetic per image up to float rounding,
    # which can move a pixel that lies on a rounding boundary of the uint8 file by one level
    diff = np.abs(one["images"].astype(np.int16) - two["images"].astype(np.int16))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.999, (diff.max(), (diff == 0).mean())
    assert log.count("wrote 13 samples") == 1  # rank 0 alone writes and prints


def test_evaluation_split_over_ranks_scores_what_one_process_scores(runs, tmp_path, eval_cache):
    root, _ = runs
    args = [
        "eval",
        "--checkpoint",
        root / "one" / "checkpoint.pt",
        "--n",
        24,
        "--steps",
        2,
        "--sampler",
        "euler",
        "--cache-dir",
        eval_cache,
    ]
    _one_process(*args, "--out", tmp_path / "one")
    log = _run(_torchrun(2, *args, "--out", tmp_path / "two"))
    one, two = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("one", "two"))
    for key in ("fid_shapes_cnn", "shape_accuracy", "class_consistency_shapes_cnn"):
        assert abs(one[key] - two[key]) < 1e-3, (key, one[key], two[key])
    assert log.count("wrote ") == 1  # rank 0 alone scores and writes


def test_a_time_budget_with_a_planned_cooldown_ends_every_rank_at_one_step(tmp_path):
    """Rank 0's clock and plan decide for all: ranks that disagreed would wait for each other forever
    (the test's timeout), or one would leave the others behind in a collective. The run ends at the plan's
    last step, or, where the rate fell by more than the plan's margin after planning (a loaded machine:
    the suite's other workers), at the clock, during the cool-down; never before the plan was made."""
    out = tmp_path / "run"
    _run(_torchrun(2, "train", *FLAGS, "--minutes", 0.15, "--cooldown-frac", 0.3, "--out", out), timeout=120)
    state = _state(out)
    plan, step = state.plan, state.step
    assert plan is not None and plan["planned_at"] < step <= plan["steps"]
    assert step == plan["steps"] or state.train_seconds >= 0.15 * 60, (step, plan, state.train_seconds)
    assert '"plan"' in (out / "metrics.jsonl").read_text()
