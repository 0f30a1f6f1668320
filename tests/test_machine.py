"""The machine record (``tinydit.machine``): a timing probe answered once on a machine is the answer of every
later process there, so one command and seed train to one result, however loaded the machine is when each
process starts. Each test fakes the probes' timings and starts "processes" by forgetting what was probed."""

import json
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import fast_config

import tinydit.models.linear as linear
from tinydit import compiling, machine, runtime
from tinydit.checkpoints.checkpoint import load_checkpoint
from tinydit.runtime import resolve_precision
from tinydit.train import Trainer

CPU = torch.device("cpu")


def new_process(monkeypatch) -> None:
    """Forget what this process probed, as a new process starts with nothing."""
    monkeypatch.setattr(linear, "_onednn_faster", None)
    runtime.cpu_bf16_is_faster.cache_clear()


def fake_timings(monkeypatch, faster: bool) -> list[str]:
    """Time both probes as ``faster`` says (oneDNN and bf16 win, or lose) on a CPU with native bf16; returns
    the list of the probes timed from now on."""
    timed = []
    monkeypatch.setattr(linear, "_time_kernels", lambda rounds: timed.append("linear") or faster)
    monkeypatch.setattr(runtime, "_time_bf16", lambda: timed.append("bf16") or faster)
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: True)
    return timed


@pytest.fixture
def record(tmp_path, monkeypatch):
    """The path of a machine record of the test's own (nothing there yet), in a process that has not probed."""
    path = tmp_path / "cache" / "machine.json"
    monkeypatch.setenv(machine.RECORD_ENV, str(path))
    monkeypatch.setattr(machine, "_warned", False)
    new_process(monkeypatch)
    yield path
    runtime.cpu_bf16_is_faster.cache_clear()  # the later tests' processes time for themselves, not with a fake


def record_warnings(caught) -> list[str]:
    """The record's warnings, each checked to come from TinyDiT's code (which the CLI shows as one line),
    not from torch's wrapper around the token-linear probe."""
    found = [w for w in caught if "machine record" in str(w.message)]
    assert all(Path(w.filename).name == "machine.py" for w in found), [w.filename for w in found]
    return [str(w.message) for w in found]


def test_a_later_process_reads_the_first_ones_answers_and_chooses_the_same(record, monkeypatch):
    x = torch.randn(2, 3, 4)
    timed = fake_timings(monkeypatch, True)
    assert linear.resolve_backend(x) == "onednn" and resolve_precision("auto", CPU) == "bf16"
    assert timed == ["linear", "bf16"]
    new_process(monkeypatch)
    timed = fake_timings(monkeypatch, False)  # a loaded machine: this process would time the other way
    assert linear.resolve_backend(x) == "onednn" and resolve_precision("auto", CPU) == "bf16"
    assert timed == []  # read, not timed
    answers = {"onednn_is_faster": True, "cpu_bf16_is_faster": True}
    assert json.loads(record.read_text()) == {machine.identity(): answers}
    # pins win over the record: TINYDIT_LINEAR_KERNEL sets `forced`, and a precision named is kept
    monkeypatch.setattr(linear.LINEAR, "forced", "blas")
    assert linear.resolve_backend(x) == "blas" and resolve_precision("fp32", CPU) == "fp32"
    # deleting the record makes the next process time again
    record.unlink()
    new_process(monkeypatch)
    assert not linear.onednn_is_faster() and timed == ["linear"]


def test_the_record_is_kept_per_machine_identity(record, monkeypatch):
    fake_timings(monkeypatch, True)
    assert linear.onednn_is_faster()
    monkeypatch.setattr(machine, "identity", lambda: "torch 9.9, another CPU, 2 CPUs, 2 threads")
    new_process(monkeypatch)
    timed = fake_timings(monkeypatch, False)
    assert not linear.onednn_is_faster() and timed == ["linear"]  # another torch or CPU measures for itself
    assert len(json.loads(record.read_text())) == 2


def test_the_record_lives_beside_the_compile_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(machine.RECORD_ENV)
    monkeypatch.delenv(compiling.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert machine.record_path() == tmp_path / "xdg" / "tinydit" / "machine.json"
    assert compiling.cache_dir().parent.parent == machine.record_path().parent


@pytest.mark.parametrize("precision", ["fp32", "auto"])
def test_one_command_and_seed_train_to_one_result_whatever_each_process_times(record, monkeypatch, tmp_path, precision):
    """The tester's report: the same `steps` command run twice, the first process timing oneDNN (bf16) faster
    and the second timing it slower, trained to weights that differed in every tensor."""
    runs = []
    for name, faster in (("a", True), ("b", False)):
        new_process(monkeypatch)
        fake_timings(monkeypatch, faster)
        Trainer(fast_config(tmp_path / name, steps=3, precision=precision), progress=False).fit()
        runs.append(load_checkpoint(tmp_path / name / "checkpoint.pt"))
    a, b = runs
    for state_a, state_b in ((a.model, b.model), (a.ema, b.ema)):
        assert state_a.keys() == state_b.keys()
        assert [k for k in state_a if not torch.equal(state_a[k], state_b[k])] == []
    assert a.kernels == b.kernels


def test_two_processes_probing_at_once_agree(record):
    """The first to measure holds the record's lock; the other waits, then reads its answer."""
    measuring, answers = threading.Event(), {}

    def slow_true() -> bool:
        measuring.set()
        time.sleep(0.3)
        return True

    first = threading.Thread(target=lambda: answers.update(first=machine.answer("probe", slow_true)))
    first.start()
    measuring.wait()
    answers["second"] = machine.answer("probe", lambda: False)
    first.join()
    assert answers == {"first": True, "second": True}


@pytest.mark.parametrize(
    "damage", [b'{"torch 2.', b"[1, 2]", b'{"torch 2": {"onednn_is_faster": "yes"}}', b"\xff\xfe\x00"]
)
def test_a_damaged_record_costs_one_warning_and_is_replaced(record, monkeypatch, damage):
    record.parent.mkdir(parents=True)
    record.write_bytes(damage)
    timed = fake_timings(monkeypatch, True)
    with pytest.warns(UserWarning) as caught:
        assert linear.onednn_is_faster() and resolve_precision("auto", CPU) == "bf16"
    assert timed == ["linear", "bf16"]
    assert len(record_warnings(caught)) == 1 and "could not be read" in record_warnings(caught)[0]
    assert json.loads(record.read_text())[machine.identity()] == {"onednn_is_faster": True, "cpu_bf16_is_faster": True}


def test_a_record_that_cannot_be_written_costs_one_warning_not_the_run(record, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    # its folder is a file: nothing can be written there, even by root
    monkeypatch.setenv(machine.RECORD_ENV, str(blocker / "machine.json"))
    timed = fake_timings(monkeypatch, True)
    with pytest.warns(UserWarning) as caught:
        assert linear.onednn_is_faster() and resolve_precision("auto", CPU) == "bf16"
    assert timed == ["linear", "bf16"]  # each timed once, as before the record
    assert len(record_warnings(caught)) == 1 and "cannot be kept" in record_warnings(caught)[0]


def test_training_runs_are_kept_beside_the_answers_and_a_damaged_entry_of_them_is_replaced(record, monkeypatch):
    fake_timings(monkeypatch, True)
    assert linear.onednn_is_faster()
    machine.keep_run("a kind", "eager", lambda kept: {"steps_per_s": 5.0, "runs": 1})
    machine.keep_run("a kind", "eager", lambda kept: {**kept, "runs": kept["runs"] + 1})  # given what is kept
    assert machine.runs("a kind") == {"eager": {"steps_per_s": 5.0, "runs": 2}} and machine.runs("another") == {}
    new_process(monkeypatch)
    timed = fake_timings(monkeypatch, False)
    assert linear.onednn_is_faster() and timed == []  # the answer is read beside the runs, not timed again
    entry = json.loads(record.read_text())[machine.identity()]
    assert entry == {"onednn_is_faster": True, "runs": {"a kind": {"eager": {"steps_per_s": 5.0, "runs": 2}}}}
    record.write_text(json.dumps({machine.identity(): {"runs": {"a kind": {"eager": {"steps_per_s": "fast"}}}}}))
    assert machine.runs("a kind") == {}  # not a record: read as none ...
    with pytest.warns(UserWarning, match="could not be read"):
        machine.keep_run("a kind", "eager", lambda kept: {"steps_per_s": 4.0})  # ... and replaced by the next
    assert machine.runs("a kind") == {"eager": {"steps_per_s": 4.0}}
