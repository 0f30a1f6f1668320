"""scripts/expectations.py writes a "What to expect" row from a run directory and its evaluation folder, keeps
the rows in docs/expectations.json and writes the front door's tables from them.

The run and the evaluation are written here in the layout `tinydit train` and `tinydit eval --out` use
(config.json, metrics.jsonl; metrics.json), so nothing is trained or sampled.
"""

import importlib.util
import json
from pathlib import Path

import pytest

from tinydit.config import TrainConfig
from tinydit.train.resolve import resolve

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "expectations.py"


@pytest.fixture(scope="module")
def expectations():
    spec = importlib.util.spec_from_file_location("expectations", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_run(root: Path, metrics: dict, **train) -> tuple[Path, Path]:
    cfg = resolve(TrainConfig(**train))  # as the trainer writes it
    run, evaluation = root / "run", root / "eval"
    run.mkdir()
    evaluation.mkdir()
    config = {
        "train": {**cfg.to_dict(), "preset": cfg.preset},
        "data": {"name": cfg.data},
        "precision": "bf16",
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


def test_a_shapes_run_gives_a_row_of_the_shapes_table(expectations, tmp_path):
    run, evaluation = write_run(tmp_path, SHAPES_METRICS, data="shapes", minutes=5, out="runs/shapes")
    table, cells = expectations.row(run, evaluation, "2-core AMD EPYC", "2026-12-02")
    assert table == "shapes"
    assert expectations.markdown(cells) == (
        "| 2-core AMD EPYC | bf16 | 2.14.1 | 2026-12-02 | 0 | 1,555 | **0.534** | 0.67 / 0.7 / 0.76 / "
        "0.004 | `tinydit train --data shapes --minutes 5 --out runs/shapes`, then `tinydit eval "
        "--checkpoint runs/shapes/checkpoint.pt --n 1000 --out eval/shapes` |"
    )


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
    _, cells = expectations.row(run, evaluation, "m", "d")
    row = expectations.markdown(cells)
    assert (
        "`tinydit train --data shapes --minutes 5 --preset dit-1.3m --qk-norm on --lr 0.003 --seed 1 "
        "--tensorboard --out runs/s1`"
    ) in row
    assert "| 1 | 1,555 |" in row


def test_a_fashion_mnist_run_gives_a_row_of_its_table_and_the_printout_has_the_header(expectations, tmp_path, capsys):
    metrics = {"fid_fmnist_cnn": 1.0021, "n_samples": 2000, "command": "tinydit eval --checkpoint c --n 2000 --out e"}
    run, evaluation = write_run(tmp_path, metrics, data="fashion-mnist", minutes=15, out="runs/fm")
    expectations.main([f"{run}:{evaluation}", "--machine", "2-core Intel Xeon with AMX", "--date", "2026-12-02"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| machine | precision | torch | date | seed | steps | `fid_fmnist_cnn` |")
    assert out[2].startswith(
        "| 2-core Intel Xeon with AMX | bf16 | 2.14.1 | 2026-12-02 | 0 | 1,555 | **1.002** "
        "| 2,000 | `tinydit train --data fashion-mnist --minutes 15 --out runs/fm`"
    )


def test_a_run_of_another_data_set_is_refused(expectations, tmp_path):
    run, evaluation = write_run(tmp_path, {"fid_cifar": 1.0}, data="cifar10", steps=10, out="runs/c")
    with pytest.raises(SystemExit, match="no row in the tables"):
        expectations.row(run, evaluation, "m", "d")


def test_the_front_door_tables_are_the_data_and_a_changed_cell_is_caught(expectations, tmp_path):
    expectations.main(["--check"])  # README.md and docs/index.md hold the tables of docs/expectations.json
    tables = expectations.load()
    assert {"shapes", "fashion-mnist"} <= set(tables)
    page = tmp_path / "README.md"
    page.write_text(expectations.PAGES[0].read_text().replace("**0.993**", "**0.999**", 1))
    assert expectations.write_pages(tables, pages=[page], check=True) == [f"{page}: shapes"]
    expectations.write_pages(tables, pages=[page])  # --write puts the data back
    assert page.read_text() == expectations.PAGES[0].read_text()


def test_add_appends_the_row_to_the_data_and_to_every_page(expectations, tmp_path, monkeypatch):
    data, pages = tmp_path / "expectations.json", [tmp_path / "a.md", tmp_path / "b.md"]
    data.write_text(expectations.DATA.read_text())
    for page in pages:
        page.write_text(expectations.PAGES[0].read_text())
    monkeypatch.setattr(expectations, "DATA", data)
    monkeypatch.setattr(expectations, "PAGES", pages)
    run, evaluation = write_run(tmp_path, SHAPES_METRICS, data="shapes", minutes=5, seed=7, out="runs/s7")
    before = len(expectations.load()["shapes"]["rows"])
    expectations.main([f"{run}:{evaluation}", "--machine", "m", "--date", "2026-12-04", "--add"])
    rows = expectations.load()["shapes"]["rows"]
    assert len(rows) == before + 1 and rows[-1][:6] == ["m", "bf16", "2.14.1", "2026-12-04", "7", "1,555"]
    for page in pages:
        assert expectations.markdown(rows[-1]) in page.read_text()
    expectations.main(["--check"])
