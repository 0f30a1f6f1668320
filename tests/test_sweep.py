import csv
import json

import pytest
from PIL import Image

from tinydit.cli import main
from tinydit.errors import TinyDiTError
from tinydit.eval.plot import line_plot
from tinydit.eval.sweep import sweep_points
from tinydit.flags import parse_list


def test_points_cover_every_combination_and_dopri5_runs_over_tolerances():
    points = sweep_points(["heun", "dopri5", "heun"], [4, 8], [1.0, 2.0], [1e-2])
    assert [(p["sampler"], p["steps"], p["tol"], p["cfg_scale"]) for p in points] == [
        ("heun", 4, None, 1.0),
        ("heun", 8, None, 1.0),
        ("heun", 4, None, 2.0),
        ("heun", 8, None, 2.0),
        ("dopri5", None, 1e-2, 1.0),
        ("dopri5", None, 1e-2, 2.0),
    ]
    assert parse_list("4, 8,16", int, "--steps") == [4, 8, 16] and parse_list("1e-2", float, "--tols") == [0.01]
    with pytest.raises(TinyDiTError, match="--steps takes a comma-separated list such as 4,8,16, got '4,x'"):
        parse_list("4,x", int, "--steps")
    with pytest.raises(TinyDiTError, match="unknown sampler 'rk4' in `samplers`"):
        sweep_points(["euler", "rk4"], [4], [1.0], [1e-2])


def test_line_plot_draws_every_series(tmp_path):
    path = line_plot(
        [("a", [4, 8, 16], [30.0, 10.0, 5.0]), ("b", [8, 16], [2.0, float("nan")])],
        tmp_path / "p.png",
        title="t",
        xlabel="nfe",
        ylabel="fid",
    )
    img = Image.open(path).convert("RGB")
    colors = {c for _, c in img.getcolors(1 << 20)}
    assert img.size == (960, 600) and (31, 119, 180) in colors and (255, 127, 14) in colors  # both series


def test_plot_lines_run_in_order_of_evaluations_and_the_table_in_sweep_order(tmp_path, monkeypatch):
    import tinydit.eval.sweep as sweep

    drawn = []
    monkeypatch.setattr(sweep, "line_plot", lambda series, path, **kw: drawn.extend(series))
    # with a guidance interval 11 steps can cost fewer evaluations than 10
    rows = [
        {
            "sampler": "euler",
            "steps": s,
            "tol": None,
            "cfg_scale": 3.0,
            "nfe": nfe,
            "fid_fmnist_cnn": fid,
            "feature_net": "fmnist_cnn",
        }
        for s, nfe, fid in ((10, 21, 2.0), (11, 20, 1.4), (12, 22, 1.5))
    ]
    sweep.write_sweep(tmp_path, {"data": "fashion-mnist", "split": "test", "n": 1000}, rows)
    assert drawn == [("euler, cfg 3", [20, 21, 22], [1.4, 2.0, 1.5])]
    table = [line for line in (tmp_path / "sweep.md").read_text().splitlines() if line.startswith("| euler")]
    assert [line.split(" | ")[1] for line in table] == ["10", "11", "12"]
    # the protocol the rows share is stated above the table: feature net, reference, sample count, precision
    assert (
        "Every row: fmnist_cnn features; reference fashion-mnist test, ? images; 1,000 samples; fp32"
        in (tmp_path / "sweep.md").read_text()
    )


def test_sweep_cli_writes_the_table_and_the_plot_and_continues(tiny_run, tmp_path, capsys, eval_cache):
    out = tmp_path / "sweep"
    args = [
        "sweep",
        "--checkpoint",
        tiny_run[0] / "checkpoint.pt",
        "--samplers",
        "euler,dopri5",
        "--steps",
        "1,2",
        "--cfg",
        "1,2",
        "--tols",
        "0.1",
        "--n",
        10,
        "--out",
        out,
        "--cache-dir",
        eval_cache,
        "--device",
        "cpu",
        "--no-progress",
    ]
    assert main([str(a) for a in args]) == 0, capsys.readouterr().err
    assert "| euler | 2 | - | 2 | 4 |" in capsys.readouterr().out  # the markdown table, printed
    with open(out / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["sampler"], r["steps"], r["tol"], r["cfg_scale"]) for r in rows] == [
        ("euler", "1", "", "1.0"),
        ("euler", "2", "", "1.0"),
        ("euler", "1", "", "2.0"),
        ("euler", "2", "", "2.0"),
        ("dopri5", "", "0.1", "1.0"),
        ("dopri5", "", "0.1", "2.0"),
    ]
    assert [r["nfe"] for r in rows[:4]] == ["1", "2", "2", "4"]  # guidance doubles the evaluations
    dopri = [int(r["nfe"]) for r in rows[4:]]
    # FSAL: 1 + 6 per attempted step, and (this run predicts x) 1 for the Euler step below its clip of t;
    # x2 when guided
    assert (dopri[0] - 2) % 6 == 0 and dopri[1] % 2 == 0
    assert all(float(r["fid_shapes_cnn"]) > 0 for r in rows)
    saved = json.loads((out / "sweep.json").read_text())
    assert saved["settings"]["n"] == 10 and len(saved["rows"]) == 6
    assert saved["rows"][4]["sampler_settings"]["rtol"] == 0.1 and saved["command"].startswith("tinydit sweep")
    assert "![fid_shapes_cnn against nfe](sweep.png)" in (out / "sweep.md").read_text()
    assert Image.open(out / "sweep.png").size == (960, 600)

    # the same command again reuses every row
    assert main([str(a) for a in args]) == 0
    assert "6 of 6 settings are done" in capsys.readouterr().err
    assert json.loads((out / "sweep.json").read_text())["rows"] == saved["rows"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--steps", "4,x"], "--steps takes a comma-separated list"),
        (["--samplers", "euler,rk4"], "unknown sampler 'rk4'"),
        (["--n", "5"], "--n 5 is too few samples"),
        (["--cfg", "-1"], "--cfg-scale (the guidance scale) must be >= 0"),
        (["--samplers", "dopri5", "--tols", "0"], "--tols must be positive"),
        (["--cfg-interval", "0.5", "0.2"], "needs 0 <= LO <= HI <= 1"),
        (["--shift", "2"], "--shift applies to the shifted grid only"),
    ],
)
def test_sweep_bad_input_is_one_clear_line(tiny_run, tmp_path, capsys, extra, message):
    args = ["sweep", "--checkpoint", str(tiny_run[0] / "checkpoint.pt"), "--out", str(tmp_path / "s"), *extra]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count(": error: ") == 1 and message in err, err
