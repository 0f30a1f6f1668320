"""`compile` auto on a CPU decided by this machine's own runs (``tinydit.runtime.choose_compile``): each test
keeps a machine record and a compile cache of its own, fills the record with the paces a 2-core AMD EPYC
measured for the quick start (eager 1,457 steps in five minutes; compiled 1,298 from an empty cache and
1,623 from the kept one), and nothing is really compiled."""

import json
import types

import pytest
import torch
from conftest import fast_config

from tinydit import compiling, machine, runtime
from tinydit.checkpoints.checkpoint import load_checkpoint
from tinydit.errors import TinyDiTError
from tinydit.runtime import EAGER, CompileChoice, choose_compile, compiled_way, record_run
from tinydit.train import Trainer
from tinydit.train.budget import Budget, speed_key
from tinydit.train.checkpoint import began_compiled
from tinydit.train.log import compile_line
from tinydit.train.resolve import resolve

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
KIND = "dit dit-1.4m, shapes class, repa, bf16, batch 64"  # the quick start's, on a CPU with fast bf16
# (seconds to the first step, steps per second after it) of each way, as an EPYC measured them
PACES = {EAGER: (5.0, 4.939), compiled_way("empty"): (40.0, 4.9925), compiled_way("kept"): (8.0, 5.559)}
# A fast_config run of five minutes, the kind its record is kept under written out: the record's own words.
FAST_KIND = "dit dit-0.2m, shapes class, fp32, batch 16"


@pytest.fixture
def record(tmp_path, monkeypatch):
    """An empty machine record and an empty compile cache of the test's own, on a machine with a C++ compiler."""
    path = tmp_path / "machine.json"
    monkeypatch.setenv(machine.RECORD_ENV, str(path))
    monkeypatch.setattr(machine, "_warned", False)
    monkeypatch.setenv(compiling.CACHE_ENV, str(tmp_path / "compile"))
    monkeypatch.setattr(runtime, "has_cxx_compiler", lambda: True)
    return path


def recorded(*ways: str, kind: str = KIND) -> None:
    """Runs of ``kind`` recorded on this machine, one each of ``ways``, at the EPYC's paces."""
    for way in ways:
        first, rate = PACES[way]
        machine.keep_run(kind, way, lambda _, first=first, rate=rate: {"first_step_s": first, "steps_per_s": rate})


def keep_cache(tmp_path) -> None:
    """Something in the compile cache, as a finished compiled run leaves there."""
    (tmp_path / "compile" / "fxgraph").mkdir(parents=True)
    (tmp_path / "compile" / "fxgraph" / "entry").write_text("")


@pytest.mark.parametrize(
    "ways, cache_kept, minutes, compiles, why",
    [
        # nothing measured yet: the first compiles from an empty cache, as every such run did before the record
        ((), False, 5, True, "compiling to measure: no compiled run of this model from an empty cache is recorded"),
        ((), False, 1, False, "not compiling: a 1-minute run is too short to compile from an empty cache"),
        # an eager rate alone says nothing of the compiled one: measure it
        ((EAGER,), False, 5, True, "compiling to measure: no compiled run of this model from an empty cache"),
        # the cache the first compiled run filled: its start-up is measured next, on any budget
        ((compiled_way("empty"),), True, 1, True, "compiling to measure: no compiled run of this model from the kept"),
        # both compiled ways known, eager not: one eager run, to weigh them against
        ((compiled_way("empty"), compiled_way("kept")), True, 5, False, "not compiling, to measure: no eager run"),
        # measured: from an empty cache compiling loses ...
        (
            (EAGER, compiled_way("empty")),
            False,
            5,
            False,
            "not compiling: on this machine an eager 5-minute run of this model holds about 1,457 steps, a compiled "
            "one 1,298 from an empty cache",
        ),
        # ... from the kept one it wins, even a one-minute run
        (
            (EAGER, compiled_way("empty"), compiled_way("kept")),
            True,
            5,
            True,
            "compiling the model's blocks: on this machine a compiled 5-minute run of this model holds about 1,623 "
            "steps from the kept cache, an eager one 1,457",
        ),
        ((EAGER, compiled_way("empty"), compiled_way("kept")), True, 1, True, "holds about 289 steps from the kept"),
        # the same record with the cache emptied: it starts cold, and loses
        ((EAGER, compiled_way("empty"), compiled_way("kept")), False, 5, False, "a compiled one 1,298 from an empty"),
    ],
)
def test_auto_compiles_a_cpu_run_where_this_machines_record_says_it_holds_more_steps(
    record, tmp_path, ways, cache_kept, minutes, compiles, why
):
    recorded(*ways)
    if cache_kept:
        keep_cache(tmp_path)
    choice = choose_compile("auto", CPU, minutes, KIND)
    assert choice.compiles is compiles and why in choice.why, choice.why
    if compiles:
        assert choice.way == compiled_way("kept" if cache_kept else "empty")  # what its measurement is kept as
        line = compile_line(choice)
        assert line == f"{choice.why} (kept in {tmp_path / 'compile'}; --compile off to skip)"
    else:
        assert choice.way == EAGER and compile_line(choice) == choice.why
    assert "\n" not in compile_line(choice)


def test_the_record_does_not_decide_for_cuda_flags_steps_runs_or_a_machine_without_a_compiler(
    record, tmp_path, monkeypatch
):
    recorded(EAGER, compiled_way("empty"))  # eager wins here
    assert choose_compile("auto", CUDA, 5, KIND) == CompileChoice(True)  # a GPU compiles, and says nothing
    assert choose_compile("on", CPU, 5, KIND) == CompileChoice(True, cache="empty")  # measured all the same
    assert choose_compile("off", CPU, 5, KIND) == CompileChoice(False)
    assert choose_compile("auto", CPU, None, KIND) == CompileChoice(False)  # a `steps` run
    assert all(compile_line(choose_compile(flag, CPU, 5, KIND)) is None for flag in ("on", "off"))
    keep_cache(tmp_path)
    assert choose_compile("on", CPU, 5, KIND).way == compiled_way("kept")
    monkeypatch.setattr(runtime, "has_cxx_compiler", lambda: False)
    choice = choose_compile("auto", CPU, 5, KIND)
    assert not choice.compiles
    assert compile_line(choice) == "not compiling: no C++ compiler found ($CXX, g++, c++ or clang++)"
    with pytest.raises(TinyDiTError, match="`compile` must be auto, on or off"):
        choose_compile("sometimes", CPU, 5, KIND)


def test_a_run_with_a_recorded_loss_does_not_compile(record, tmp_path):
    """Before the record, `auto` compiled every CPU run of three minutes or more, however it measured."""
    record.write_text(
        json.dumps(
            {
                machine.identity(): {
                    "runs": {
                        FAST_KIND: {
                            "eager": {"first_step_s": 2.0, "steps_per_s": 50.0, "runs": 1},
                            "compiled, empty cache": {"first_step_s": 40.0, "steps_per_s": 51.0, "runs": 1},
                        }
                    }
                }
            }
        )
    )
    trainer = Trainer(fast_config(tmp_path / "run", minutes=5.0), progress=False)
    trainer.close()
    assert trainer.compiled is False


def test_the_kind_of_run_names_what_its_steps_cost():
    cfg = resolve(fast_config("x", minutes=5.0))
    assert speed_key(cfg, cfg.preset, "fp32", 1) == FAST_KIND
    cfg = resolve(fast_config("x", minutes=5.0, repa=0.5, preset="dit-1.4m", mlp="swiglu", objective="meanflow"))
    words = "dit dit-1.4m, shapes class, mlp swiglu, meanflow, repa, bf16, batch 16, 2 processes"
    assert speed_key(cfg, "dit-1.4m", "bf16", 2) == words


def test_the_pace_is_the_first_steps_seconds_and_the_rate_after_it():
    cfg = resolve(fast_config("x", minutes=5.0))
    budget = Budget(cfg)
    assert budget.pace() is None
    budget.tick(1, 4.0)
    assert budget.pace() is None  # one step: no rate yet
    budget.tick(2, 4.5)
    budget.tick(11, 6.0)
    assert budget.pace() == (4.0, 5.0)
    budget = Budget(cfg, step=100, seconds=50.0)  # a continuation: its own process's start-up
    budget.tick(101, 53.0)
    budget.tick(111, 55.0)
    assert budget.pace() == (3.0, 5.0)


def test_the_record_keeps_the_best_of_each_measurement_and_the_probes_beside_it(record):
    eager = CompileChoice(False)
    record_run(KIND, eager, 6.004, 4.9)
    record_run(KIND, eager, 5.0, 4.7)  # a quicker start on a busier machine
    assert machine.runs(KIND) == {EAGER: {"first_step_s": 5.0, "steps_per_s": 4.9, "runs": 2}}
    assert machine.answer("probe", lambda: True) is True  # a record with runs is a record: read, not replaced
    assert machine.runs(KIND)[EAGER]["runs"] == 2 and machine.runs("another kind") == {}
    assert json.loads(record.read_text())[machine.identity()]["probe"] is True


def test_a_run_records_its_pace_and_a_continuation_keeps_its_choice_whatever_the_record_says_now(
    record, tmp_path, clock, capsys
):
    kw = dict(steps=None, batch_size=8, limit=20, warmup=2, log_every=5, val_every=10**6, sample_every=10**6)
    run = tmp_path / "run"
    Trainer(fast_config(run, minutes=0.02, **kw), progress=False).fit()
    assert "not compiling: a 0.02-minute run is too short" in capsys.readouterr().err
    assert load_checkpoint(run / "checkpoint.pt").kernels["compiled"] is False
    kind = "dit dit-0.2m, shapes class, fp32, batch 8"
    (pace,) = machine.runs(kind).values()
    assert machine.runs(kind).keys() == {EAGER} and pace.keys() == {"first_step_s", "steps_per_s", "runs"}
    assert pace["runs"] == 1 and 0 < pace["first_step_s"] < 1 and pace["steps_per_s"] > 0
    # Now the record says compiling wins by far: a new run compiles; the eager run, continued, does not.
    machine.keep_run(kind, compiled_way("empty"), lambda _: {**pace, "steps_per_s": 100 * pace["steps_per_s"]})
    new = Trainer(fast_config(tmp_path / "new", minutes=0.04, **kw), progress=False)
    new.close()
    assert new.compiled is True and new.compile_choice.why.startswith("compiling the model's blocks: on this machine")
    continued = Trainer(fast_config(run, minutes=0.04, **kw), progress=False)  # a finished run given more time
    continued.close()
    assert continued.compiled is False
    said = compile_line(continued.compile_choice)
    assert said == "not compiling, as this run did when it began: the two round differently"


def test_a_continuation_keeps_whether_it_compiled_on_the_same_device_and_precision(record):
    def ckpt(**kernels):
        return types.SimpleNamespace(kernels={"device": "cpu", "precision": "fp32", **kernels})

    assert began_compiled(None, CPU, "fp32", 5) is None  # a new run
    assert began_compiled(ckpt(compiled=True), CPU, "fp32", 1) is True
    assert began_compiled(ckpt(compiled=False), CPU, "fp32", 5) is False
    assert began_compiled(ckpt(compiled=True), CPU, "bf16", 5) is None  # it rounds differently anyway
    assert began_compiled(ckpt(compiled=True), CUDA, "fp32", 5) is None
    # written before it was kept: what `auto` chose then, by the budget alone
    assert began_compiled(ckpt(), CPU, "fp32", 5) is True
    assert began_compiled(ckpt(), CPU, "fp32", 1) is False
    choice = choose_compile("auto", CPU, 5, KIND, began=True)
    assert choice.compiles and choice.why.endswith("blocks, as this run did when it began: the two round differently")
    assert choose_compile("off", CPU, 5, KIND, began=True) == CompileChoice(False)  # a flag still decides
