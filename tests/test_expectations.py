"""scripts/expectations.py keeps every measured run as a record in docs/expectations.json and makes the pages
from it: README.md's "What to expect" table (chosen by a stated rule), docs/index.md (README.md for the
site) and docs/expectations.md (every run).

The run and the evaluation are written here in the layout `tinydit train` and `tinydit eval --out` use
(config.json, metrics.jsonl; metrics.json), so nothing is trained or sampled.
"""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from tinydit.config import TrainConfig
from tinydit.train.resolve import resolve

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "expectations.py"


@pytest.fixture(scope="module")
def expectations():
    spec = importlib.util.spec_from_file_location("expectations", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_run(root: Path, metrics: dict, compile: bool = True, **train) -> tuple[Path, Path]:
    cfg = resolve(TrainConfig(**train))  # as the trainer writes it
    run, evaluation = root / "run", root / "eval"
    run.mkdir()
    evaluation.mkdir()
    config = {
        "train": {**cfg.to_dict(), "preset": cfg.preset},
        "data": {"name": cfg.data},
        "precision": "bf16",
        "compile": compile,
        "torch_version": "2.14.1+cpu",
    }
    (run / "config.json").write_text(json.dumps(config))
    lines = [{"step": 50, "loss": 0.3}, {"step": 1555, "val_loss": 0.2, "val_loss_ema": 0.19}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    (evaluation / "metrics.json").write_text(json.dumps(metrics))
    return run, evaluation


EVAL_SHAPES = "tinydit eval --checkpoint runs/shapes/checkpoint.pt --n 1000 --out eval/shapes"
SHAPES_METRICS = {
    "shape_strict": 0.534,
    "shape_strict_circle": 0.67,
    "shape_strict_square": 0.7,
    "shape_strict_triangle": 0.76,
    "shape_strict_cross": 0.004,
    "n_samples": 1000,
    "command": EVAL_SHAPES,
}


def test_a_shapes_run_is_recorded_as_fields(expectations, tmp_path):
    run, evaluation = write_run(tmp_path, SHAPES_METRICS, data="shapes", minutes=5, out="runs/shapes")
    got = expectations.record(run, evaluation, "cpu-amx", "2-core Xeon", "empty", "2026-12-02")
    assert got == {
        "data": "shapes",
        "class": "cpu-amx",
        "machine": "2-core Xeon",
        "precision": "bf16",
        "compile": "empty cache",
        "torch": "2.14.1",
        "date": "2026-12-02",
        "seed": 0,
        "budget": {"minutes": 5},
        "steps": 1555,
        "samples": 1000,
        "scores": {"shape_strict": 0.534, "circle": 0.67, "square": 0.7, "triangle": 0.76, "cross": 0.004},
        "train": "tinydit train --data shapes --minutes 5 --out runs/shapes",
        "eval": EVAL_SHAPES,
    }


def test_an_eager_run_records_compile_off_whatever_the_cache(expectations, tmp_path):
    run, evaluation = write_run(tmp_path, SHAPES_METRICS, compile=False, data="shapes", steps=100, out="r")
    got = expectations.record(run, evaluation, "cpu-amx", "m", "kept", "d")
    assert got["compile"] == "off" and got["budget"] == {"steps": 100}


def test_the_train_command_names_only_what_differs_from_the_defaults(expectations, tmp_path):
    run, evaluation = write_run(
        tmp_path,
        SHAPES_METRICS,
        data="shapes",
        minutes=5,
        seed=1,
        lr=3e-3,
        preset="dit-1.3m",
        tensorboard=True,
        qk_norm=True,
        out="runs/s1",
    )
    got = expectations.record(run, evaluation, "cpu-amx", "m", None, "d")
    assert got["train"] == (
        "tinydit train --data shapes --minutes 5 --preset dit-1.3m --qk-norm on --lr 0.003 --seed 1 "
        "--tensorboard --out runs/s1"
    )
    assert got["seed"] == 1


def test_a_fashion_mnist_run_keeps_fid_recall_and_class_consistency(expectations, tmp_path, capsys):
    metrics = {
        "fid_fmnist_cnn": 1.0021,
        "recall_fmnist_cnn": 0.5,
        "class_consistency_fmnist_cnn": 0.9,
        "n_samples": 2000,
        "command": "tinydit eval --checkpoint c --n 2000 --out e",
    }
    run, evaluation = write_run(tmp_path, metrics, data="fashion-mnist", minutes=15, out="runs/fm")
    expectations.main([f"{run}:{evaluation}", "--class", "cpu-amx", "--machine", "x", "--date", "2026-12-02"])
    printed = json.loads(capsys.readouterr().out)
    assert printed["scores"] == {"fid_fmnist_cnn": 1.0021, "recall": 0.5, "class_consistency": 0.9}
    assert printed["train"] == "tinydit train --data fashion-mnist --minutes 15 --out runs/fm"


def test_a_run_of_another_data_set_or_an_unknown_class_is_refused(expectations, tmp_path):
    run, evaluation = write_run(tmp_path, {"fid_cifar": 1.0}, data="cifar10", steps=10, out="runs/c")
    with pytest.raises(SystemExit, match="no place in the record"):
        expectations.record(run, evaluation, "cpu-amx", "m", None, "d")
    with pytest.raises(SystemExit):
        expectations.main([f"{run}:{evaluation}", "--class", "a-laptop"])


def shapes_run(steps: int, kinds: tuple, date: str = "2026-12-06", hardware: str = "cpu-amx", **extra) -> dict:
    scores = dict(zip(expectations_kinds(), kinds, strict=True))
    strict = sum(k for k in kinds if k is not None) / 4
    return {
        "data": "shapes",
        "class": hardware,
        "machine": "m",
        "precision": "bf16",
        "compile": "kept cache",
        "torch": "2.14.1",
        "date": date,
        "seed": 0,
        "budget": {"minutes": 5},
        "steps": steps,
        "samples": 1000,
        "scores": {"shape_strict": strict, **scores},
        "train": "tinydit train --data shapes --minutes 5 --out r",
        "eval": "tinydit eval --checkpoint r/checkpoint.pt --n 1000 --out e",
        **extra,
    }


def expectations_kinds() -> tuple:
    return ("circle", "square", "triangle", "cross")


def test_the_front_row_is_the_range_over_the_runs_the_rule_picks(expectations):
    entry = {
        "hardware": "a Xeon",
        "command": "tinydit train --data shapes --minutes 5",
        "takes": "5 min",
        "class": "cpu-amx",
        "data": "shapes",
        "budget": {"minutes": 5},
        "precision": "bf16",
        "since": "2026-12-06",
    }
    runs = [
        shapes_run(2000, (1, 0.9, 1, 0.3)),
        shapes_run(3000, (1, 0.8, 1, 0.9)),
        shapes_run(900, (0, 0, 0, 0), date="2026-12-05"),  # before the entry's defaults: left out
        shapes_run(500, (0, 0, 0, 0), hardware="gpu"),  # another class: left out
        shapes_run(4500, (1, 1, 1, 1), shipped="shapes"),
    ]
    shipped = {"hardware": "any", "command": "tinydit sample --pretrained shapes", "takes": "s", "shipped": "shapes"}
    rows = expectations.front_rows({"runs": runs, "front": [entry, shipped]})
    assert rows[0] == [
        "a Xeon",
        "`tinydit train --data shapes --minutes 5`",
        "5 min",
        "2,000–4,500",
        "0.80–1.00",
        "circles and triangles in every run; squares in 2 of 3; crosses in 2 of 3",
    ]
    assert rows[1][3:] == ["4,500", "1.00", "every shape"]
    with pytest.raises(SystemExit, match="matches no run"):
        expectations.front_rows({"runs": runs, "front": [{**entry, "since": "2027-01-01"}]})
    # an entry that names its compile states leaves out the runs of another (a --compile off run)
    compiled = {**entry, "compile": ["empty cache", "kept cache"]}
    eager = [*runs, shapes_run(9000, (1, 1, 1, 1), compile="off")]
    assert expectations.front_rows({"runs": eager, "front": [compiled]}) == rows[:1]
    with pytest.raises(SystemExit, match="matches no run"):
        expectations.front_rows({"runs": runs, "front": [{**entry, "compile": ["empty cache"]}]})


def test_what_runs_draw_is_said_per_kind(expectations):
    drawn = expectations.drawn
    assert drawn([shapes_run(1, (1, 1, 1, 1)), shapes_run(1, (0.9, 0.9, 0.9, 0.9))]) == "every shape in every run"
    assert drawn([shapes_run(1, (0.9, 0.5, 0.9, 0.1))]) == "circles and triangles in every run; no squares; no crosses"
    assert drawn([shapes_run(1, (None, None, None, 0.0))]) == "no crosses; other kinds not recorded"


def test_the_pages_are_the_record_and_a_changed_cell_is_caught(expectations, tmp_path, monkeypatch):
    expectations.main(["--check"])  # README.md, docs/index.md and docs/expectations.md are made from the record
    copies = {}
    for name in ("README", "HOME", "PAGE"):
        copies[name] = tmp_path / getattr(expectations, name).name
        shutil.copy(getattr(expectations, name), copies[name])
        monkeypatch.setattr(expectations, name, copies[name])
    monkeypatch.setattr(expectations, "ROOT", tmp_path)
    readme = copies["README"].read_text()
    front = expectations.front(expectations.load())
    assert front in readme and front in copies["PAGE"].read_text()
    first = front.splitlines()[2]
    copies["README"].write_text(readme.replace(first, first.replace("5 min", "4 min")))
    copies["HOME"].write_text(copies["HOME"].read_text() + "an edit by hand\n")
    assert expectations.write(expectations.load(), check=True) == ["README.md", "index.md"]
    expectations.write(expectations.load())  # --write puts the record back
    assert copies["README"].read_text() == readme
    assert expectations.write(expectations.load(), check=True) == []


def test_the_guide_home_is_the_readme_with_links_into_docs(expectations):
    readme = "# T\n\n[Data](docs/data.md#x) · [ex](examples/a.py) · [site](https://example.org) · [s](#y)\n"
    home = expectations.home(readme)
    assert "[Data](data.md#x)" in home and "[site](https://example.org)" in home and "[s](#y)" in home
    assert "/blob/main/examples/a.py)" in home and "(examples/a.py)" not in home
    assert home.startswith("# T\n\n<!-- Written by")


def test_add_appends_the_run_and_writes_every_page(expectations, tmp_path, monkeypatch):
    data = tmp_path / "expectations.json"
    data.write_text(expectations.DATA.read_text())
    for name in ("README", "HOME", "PAGE"):
        copy = tmp_path / getattr(expectations, name).name
        shutil.copy(getattr(expectations, name), copy)
        monkeypatch.setattr(expectations, name, copy)
    monkeypatch.setattr(expectations, "DATA", data)
    monkeypatch.setattr(expectations, "ROOT", tmp_path)
    (tmp_path / "r").mkdir()
    run, evaluation = write_run(tmp_path / "r", SHAPES_METRICS, data="shapes", minutes=5, seed=7, out="runs/s7")
    before = len(expectations.load()["runs"])
    argv = [f"{run}:{evaluation}", "--class", "cpu-amx", "--machine", "m", "--cache", "kept", "--date", "2030-01-01"]
    expectations.main([*argv, "--add"])
    runs = expectations.load()["runs"]
    assert len(runs) == before + 1 and runs[-1]["seed"] == 7 and runs[-1]["date"] == "2030-01-01"
    assert "runs/s7" in expectations.PAGE.read_text()
    # the new run falls under the Xeon's five-minute entry, so the front row's range now reaches 1,555 steps
    assert "| 1,555–" in expectations.README.read_text()
    assert expectations.write(expectations.load(), check=True) == []


def test_a_budget_of_whole_minutes_is_recorded_as_written(expectations, tmp_path):
    run, evaluation = write_run(tmp_path, SHAPES_METRICS, data="shapes", minutes=5.0, out="r")
    budget = expectations.record(run, evaluation, "cpu-amx", "m", "kept", "d")["budget"]
    assert budget == {"minutes": 5} and isinstance(budget["minutes"], int)
    assert expectations.budget_words(budget) == "5 min"
