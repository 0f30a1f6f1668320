"""Bad input tried by the thousand (Hypothesis): generated config.json values, tensor sets, checkpoint records and
command lines, against ``from_pretrained``, ``Checkpoint.load`` and the CLI in-process.

The property is the same everywhere: the outcome is the model the files describe (its config as stored, its
weights as stored, class names that agree with its labels) or one ``TinyDiTError`` line (the CLI: exit 2 and
one line on stderr), never another exception; and no file a command reads, and no shipped model, is changed.

The examples are a fixed, bounded set (``derandomize``, no example database written into the repository), so
the file takes seconds and fails the same way on every machine; the base folder and run are built once per
module from the fixture checkpoint, without training.
"""

import contextlib
import copy
import hashlib
import io
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from PIL import Image
from safetensors.torch import load_file, save_file

import tinydit
from tinydit import api
from tinydit.checkpoints.checkpoint import Checkpoint, load_model
from tinydit.checkpoints.pretrained import CONFIG, WEIGHTS
from tinydit.cli import main
from tinydit.errors import TinyDiTError
from tinydit.paths import SHIPPED

FIXTURE = Path(__file__).parent / "fixtures" / "dit-0.2m.pt"


def examples(n: int):
    # derandomize: the same examples on every run (a suite that passes today passes tomorrow); the autouse
    # `offline` fixture only sets an environment variable, which every example may share
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


def digest(*folders: Path) -> dict[str, str]:
    """Every file under ``folders``, hidden ones too: its bytes' hash."""
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest()
        for folder in folders
        for p in sorted(Path(folder).rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict:
    """Built once: a pretrained folder exported from the fixture checkpoint, a run directory holding a copy of
    it, and what both hold."""
    root = tmp_path_factory.mktemp("bad-input")
    folder = api.export(FIXTURE, "safetensors", root / "folder")
    run = root / "run"
    run.mkdir()
    shutil.copyfile(FIXTURE, run / "checkpoint.pt")
    (run / "metrics.jsonl").write_text('{"step": 60}\n')
    Image.new("RGB", (34, 34)).save(run / "samples.png")  # a run's own grid, for a command to write over
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")  # an owner/name that is no folder is tried as a Hub id: never online
        yield {
            "folder": folder,
            "run": run,
            "config": json.loads((folder / CONFIG).read_text()),
            "weights": load_file(folder / WEIGHTS),
            "state": torch.load(FIXTURE, weights_only=True),
        }


# -- values: every JSON type, numbers at and beyond the ranges, the right value in the wrong type ------------------

NUMBERS = st.one_of(
    st.integers(-3, 70),
    st.sampled_from([2**31, 2**63, 10**30, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True),
)
LEAVES = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=6))
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


def retyped(value):
    """The stored value near itself and in other types: what a hand-edited file holds."""
    near = [[value], {"value": value}, str(value), json.dumps(value), None]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        near += [value + 1, value - 1, 0, -value, value * 2, float(value), value / 3, math.nan, math.inf]
    elif isinstance(value, str):
        near += ["", " ", value.upper(), value + "x", 1]
    elif isinstance(value, list):  # one item fewer or more: five class names for four classes
        near += [value[:-1], value + ["surplus"], value + value[-1:], list(reversed(value)), []]
    elif isinstance(value, dict):
        near += [{}, list(value)]
    return st.sampled_from(near)


def edit(record: dict, sections: tuple[str, ...]):
    """An edit of ``record``: one key set to its own value changed a little or retyped, or to any value; a key
    deleted; or a key added. The section is drawn first (those that make the model more often: ``sections``
    may name one twice), then a key in it, so that a record's few model-defining keys are not lost among
    the training config's many."""
    groups = [g for g in (None, *sections) if g is None or isinstance(record.get(g), dict)]
    keys = {g: [(k,) if g is None else (g, k) for k in (record if g is None else record[g])] for g in set(groups)}
    paths = st.sampled_from(groups).flatmap(lambda g: st.sampled_from(keys[g]))

    def stored(path):
        node = record
        for key in path:
            node = node[key]
        return node

    near = paths.flatmap(lambda p: st.tuples(st.just("set"), st.just(p), retyped(stored(p))))
    anything = paths.flatmap(lambda p: st.tuples(st.just("set"), st.just(p), VALUES))
    drop = st.tuples(st.just("drop"), paths, st.none())
    added = st.sampled_from(groups).map(lambda g: (g, "surplus") if g else ("surplus",))
    add = st.tuples(st.just("add"), added, VALUES)
    return st.one_of(near, near, near, anything, drop, add)


def applied(record: dict, change) -> dict:
    what, path, value = change
    record = copy.deepcopy(record)
    node = record
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            return record
        node = node[key]
    if what == "drop":
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return record


def assert_the_model_the_files_describe(model, config: dict, weights: dict) -> None:
    """The model is what the files say: its config as stored, its weights as stored, a label per class name."""
    assert model.config == type(model.config).from_dict(config["model_config"])
    state = model.state_dict()
    assert set(state) == set(weights)
    assert all(torch.equal(state[k], weights[k].to(state[k].dtype)) for k in state)
    data = config["data"]
    if model.config.cond == "class":
        assert len(data["classes"]) == model.config.n_classes
    assert data.get("img_size") in (None, model.config.img_size)  # None: a file from before it was recorded
    assert data.get("channels") in (None, model.config.in_channels)


def one_line(err: TinyDiTError) -> None:
    assert str(err) and "\n" not in str(err), repr(str(err))


FOLDER_SECTIONS = ("model_config", "model_config", "data", "data", "sampling", "train_config", "weights")


@examples(80)
@given(data=st.data())
def test_any_config_json_is_the_model_it_describes_or_one_line(base, data):
    change = data.draw(edit(base["config"], FOLDER_SECTIONS), label="change")
    config = applied(base["config"], change)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shutil.copyfile(base["folder"] / WEIGHTS, folder / WEIGHTS)
        (folder / CONFIG).write_text(json.dumps(config))
        before = digest(folder)
        try:
            model = tinydit.from_pretrained(folder)
        except TinyDiTError as err:
            one_line(err)
            event("refused")
            with pytest.raises(TinyDiTError):  # the API and the reader agree
                Checkpoint.load(folder)
        else:
            assert_the_model_the_files_describe(model, config, base["weights"])
            try:
                samples = api.sample(folder, 2, steps=1, device="cpu", precision="fp32", compile="off")
            except TinyDiTError as err:
                one_line(err)  # the recorded sampler settings, read where they are used
                event("a model; its sampler settings refused")
            else:
                assert torch.isfinite(samples.x).all() and samples.names[:4] == list(config["data"]["classes"])[:4]
                event("a model, sampled")
        assert digest(folder) == before


TENSOR_DTYPES = [torch.int64, torch.int32, torch.uint8, torch.bool, torch.float16, torch.bfloat16, torch.float64]


def tensor_edits(names: list[str]):
    shape = st.lists(st.integers(0, 5), max_size=3)
    one = st.one_of(
        st.tuples(st.just("drop"), st.sampled_from(names), st.none()),
        st.tuples(st.just("add"), st.text("abcxyz._0", min_size=1, max_size=10), shape),
        st.tuples(st.just("shape"), st.sampled_from(names), shape),
        st.tuples(st.just("dtype"), st.sampled_from(names), st.sampled_from(TENSOR_DTYPES)),
        st.tuples(st.just("value"), st.sampled_from(names), st.sampled_from([math.nan, math.inf, -math.inf, 1e38])),
    )
    return st.lists(one, min_size=1, max_size=3)


def tensors_after(weights: dict, changes) -> dict:
    weights = dict(weights)
    for what, name, arg in changes:
        if what == "drop":
            weights.pop(name, None)
        elif what in ("add", "shape"):
            weights[name] = torch.zeros(arg)
        elif what == "dtype" and name in weights:
            weights[name] = weights[name].to(arg)
        elif what == "value" and name in weights and weights[name].is_floating_point() and weights[name].numel():
            weights[name] = weights[name].clone().flatten().index_fill(0, torch.tensor([0]), arg).view_as(weights[name])
    return weights


@examples(80)
@given(data=st.data())
def test_any_set_of_tensors_is_the_model_or_one_line(base, data):
    changes = data.draw(tensor_edits(sorted(base["weights"])), label="changes")
    weights = tensors_after(base["weights"], changes)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        save_file({k: v.contiguous() for k, v in weights.items()}, folder / WEIGHTS)
        shutil.copyfile(base["folder"] / CONFIG, folder / CONFIG)
        before = digest(folder)
        try:
            model = tinydit.from_pretrained(folder)
        except TinyDiTError as err:
            one_line(err)
            event("refused")
        else:
            assert_the_model_the_files_describe(model, base["config"], weights)
            assert all(torch.isfinite(p).all() for p in model.parameters())
            event("a model")
        assert digest(folder) == before


CHECKPOINT_SECTIONS = ("model_config", "model_config", "data", "data", "train_config", "kernels")


@examples(60)
@given(data=st.data())
def test_any_checkpoint_record_is_the_checkpoint_or_one_line(base, data):
    records = {k: v for k, v in base["state"].items() if k not in ("model", "ema", "optimizer", "rng")}
    change = data.draw(edit(records, CHECKPOINT_SECTIONS), label="change")
    state = {**base["state"], **applied(records, change)}
    if change[0] == "drop" and len(change[1]) == 1:
        state.pop(change[1][0], None)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "checkpoint.pt"
        torch.save(state, path)
        before = digest(Path(tmp))
        try:
            ckpt = Checkpoint.load(path)
            model, _ = load_model(ckpt)
            settings_ = ckpt.sampling_settings()
        except TinyDiTError as err:
            one_line(err)
            event("refused")
        else:
            event("a checkpoint")
            stored = {"model_config": state["model_config"], "data": state["data"]}
            assert_the_model_the_files_describe(model, stored, state["ema"])
            assert settings_.steps >= 1
        assert digest(Path(tmp)) == before


# -- command lines: paths and names a user may type, real ones and generated ones ---------------------------------

TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00/\\"), max_size=10)  # see below
GOOD_CHECKPOINTS = ["FOLDER", "FOLDER/model.safetensors", "FOLDER/config.json", "RUN", "RUN/checkpoint.pt"]
GOOD_CHECKPOINTS += ["SHIPPED/shapes", "SHIPPED/shapes/model.safetensors"]
CHECKPOINTS = st.one_of(
    st.sampled_from(GOOD_CHECKPOINTS),
    st.sampled_from(["", " ", "missing.pt", "owner/name", "RUN/missing.pt", "FOLDER/README.md", "SHIPPED"]),
    TEXT,
)
GOOD_OUTS = st.sampled_from(["x.png", "x.npz", "new", "new/x.png", "RUN/sub", "RUN/x.png", "a b.png"])
OUTS = st.one_of(
    GOOD_OUTS,
    st.sampled_from(["FOLDER", "FOLDER/x.png", "FOLDER/model.safetensors", "FOLDER/sub", "RUN", "RUN/samples.png"]),
    st.sampled_from(["RUN/checkpoint.pt", "SHIPPED/shapes", "SHIPPED/shapes/x.png", "", " ", "x.txt", ".png"]),
    TEXT,
)


def placed(text: str, base: dict) -> str:
    for name, path in (("FOLDER", base["folder"]), ("RUN", base["run"]), ("SHIPPED", SHIPPED)):
        if text.startswith(name):
            return str(path) + text[len(name) :]
    return text


def run_cli(args: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(args)
        except SystemExit as exit_:  # argparse's own refusals
            code = exit_.code
    return code, err.getvalue()


def in_a_fresh_folder(base, command):
    """Run ``command`` in a new current folder. A refusal changes nothing in the folder, the run and the shipped
    models; a success may add files to the run (a new file or subfolder in it is the user's), never to the
    pretrained folder or a shipped model, and changes none that were there. What it added is removed again,
    for the next example."""
    watched = (base["folder"], base["run"], SHIPPED)
    before, paths = digest(*watched), {p for w in watched for p in Path(w).rglob("*")}
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            code, err = run_cli(command)
        finally:
            os.chdir(here)
    assert code in (0, 2), (command, code, err)
    after = digest(*watched)
    if code == 2:
        assert err.count("\n") == 1 and ": error: " in err, (command, err)
        assert after == before, command
    assert {k: after.get(k) for k in before} == before, command  # nothing there before was changed or removed
    added = sorted((p for w in watched for p in Path(w).rglob("*") if p not in paths), reverse=True)
    assert not [p for p in added if base["run"] not in p.parents], command
    for p in added:  # deepest first
        p.rmdir() if p.is_dir() else p.unlink()
    event(f"exit {code}")
    return code


# Generated names hold no path separator: a "../x" would write outside the fresh current folder. Real command
# lines hold no lone surrogate or NUL (the operating system passes neither), so neither is generated.


CLASSES = st.one_of(st.none(), TEXT, st.sampled_from(["circle", "3", "9", "circle,,square", "dragon"]))


@examples(40)
@given(
    case=st.one_of(
        st.tuples(st.sampled_from(GOOD_CHECKPOINTS), GOOD_OUTS, st.sampled_from([None, "circle", "3"])),  # draws
        st.tuples(st.sampled_from(GOOD_CHECKPOINTS), OUTS, st.none()),  # draws, or refuses where it may not write
        st.tuples(CHECKPOINTS, OUTS, CLASSES),
    )
)
def test_sample_with_any_paths_and_names_draws_or_refuses_in_one_line(base, case):
    checkpoint, out, classes = case
    command = ["sample", f"--checkpoint={placed(checkpoint, base)}", f"--out={placed(out, base)}", "--n", "2"]
    command += ["--steps", "1", "--device", "cpu", "--precision", "fp32", "--compile", "off"]
    command += [f"--class={classes}"] if classes is not None else []
    in_a_fresh_folder(base, command)


@examples(30)
@given(
    case=st.one_of(
        st.tuples(st.sampled_from(GOOD_CHECKPOINTS), OUTS, st.just("safetensors")),  # a real export, anywhere
        st.tuples(CHECKPOINTS, OUTS, st.one_of(st.sampled_from(["safetensors", "web"]), TEXT)),
    ),
    overwrite=st.booleans(),
)
def test_export_with_any_paths_writes_a_new_export_or_refuses_in_one_line(base, case, overwrite):
    checkpoint, out, fmt = case
    command = ["export", f"--checkpoint={placed(checkpoint, base)}", f"--format={fmt}", f"--out={placed(out, base)}"]
    in_a_fresh_folder(base, command + (["--overwrite"] if overwrite else []))


@examples(80)
@given(path=st.one_of(CHECKPOINTS, TEXT))
def test_from_pretrained_with_any_path_is_a_model_or_one_line(base, path):
    try:
        model = tinydit.from_pretrained(placed(path, base))
    except TinyDiTError as err:
        one_line(err)
        event("refused")
    else:
        assert not model.training
        event("a model")
