"""The CLI on text-to-image runs: train --model mmdit, sample --prompt, eval with prompt adherence,
sweep, and the errors for mixing up class and text models."""

import json

import numpy as np
import pytest
from conftest import built_once
from PIL import Image

from tinydit.cli import main

FAST_TEXT = (
    "--model mmdit --preset mmdit-0.2m --batch-size 16 --limit 64 --steps 3 --log-every 2 "
    "--val-every 3 --sample-every 3 --sample-steps 2 --warmup 2 --no-progress"
).split()


def run(args, capsys):
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    def build(out):
        assert main(["train", "--data", "shapes", "--out", str(out), *FAST_TEXT]) == 0

    return built_once(tmp_path_factory, "text-run", build) / "checkpoint.pt"


def test_sample_prompts_make_rows_of_a_grid(text_run, tmp_path, capsys):
    red, blue = "a red circle on a blue background", "a blue square on a white background"
    code, err = run(
        [
            "sample",
            "--checkpoint",
            text_run,
            "--prompt",
            red,
            "--prompt",
            blue,
            "--n",
            3,
            "--steps",
            2,
            "--out",
            tmp_path / "g.png",
        ],
        capsys,
    )
    assert code == 0 and "wrote 6 samples" in err and "4 model evaluations per image" in err, err
    assert Image.open(tmp_path / "g.png").size == (3 * 34 + 2, 2 * 34 + 2)  # 2 rows of 3
    code, err = run(
        [
            "sample",
            "--checkpoint",
            text_run,
            "--prompt",
            red,
            "--prompt",
            blue,
            "--n",
            2,
            "--steps",
            1,
            "--out",
            tmp_path / "d",
        ],
        capsys,
    )
    assert code == 0, err
    names = sorted(p.name for p in (tmp_path / "d").iterdir())
    assert names == [
        "00000_a-red-circle-on-a-blue-background.png",
        "00001_a-red-circle-on-a-blue-background.png",
        "00002_a-blue-square-on-a-white-background.png",
        "00003_a-blue-square-on-a-white-background.png",
    ]
    code, err = run(["sample", "--checkpoint", text_run, "--steps", 1, "--out", tmp_path / "s.npz"], capsys)
    assert code == 0  # without --prompt: the run's 8 grid prompts, 8 images each
    data = np.load(tmp_path / "s.npz")
    assert data["images"].shape == (64, 3, 32, 32) and data["labels"].tolist() == [i // 8 for i in range(64)]


def test_an_unknown_word_is_one_warning_line_naming_it(text_run, tmp_path, capsys):
    code, err = run(
        [
            "sample",
            "--checkpoint",
            text_run,
            "--prompt",
            "a purple circle on a red background",
            "--n",
            1,
            "--steps",
            1,
            "--out",
            tmp_path / "x.png",
        ],
        capsys,
    )
    assert code == 0
    warning = [line for line in err.splitlines() if line.startswith("tinydit: warning:")]
    assert len(warning) == 1 and "unknown word 'purple'" in warning[0] and "<unk>" in warning[0], err


def test_class_and_text_options_on_the_wrong_model_are_clear_errors(text_run, tiny_run, tmp_path, capsys):
    code, err = run(["sample", "--checkpoint", text_run, "--class", "circle", "--out", tmp_path / "x.png"], capsys)
    assert code == 2 and "is a text-to-image model: use --prompt, not --class" in err
    code, err = run(
        [
            "sample",
            "--checkpoint",
            tiny_run[0] / "checkpoint.pt",
            "--prompt",
            "a red circle",
            "--out",
            tmp_path / "x.png",
        ],
        capsys,
    )
    assert code == 2 and "is class-conditional (classes: circle, square, triangle, cross): use --class" in err
    code, err = run(["train", "--model", "mmdit", "--cond", "class", "--out", tmp_path / "r"], capsys)
    assert code == 2 and "--model mmdit takes --cond text" in err
    code, err = run(
        ["sample", "--checkpoint", text_run, "--prompt", "a red circle", "--n", 0, "--out", tmp_path / "x.png"], capsys
    )
    assert code == 2 and "--n must be >= 1" in err


def test_eval_reports_prompt_adherence_seen_and_held_out(text_run, tmp_path, capsys, eval_cache):
    code, err = run(
        [
            "eval",
            "--checkpoint",
            text_run,
            "--n",
            64,
            "--steps",
            2,
            "--out",
            tmp_path / "ev",
            "--cache-dir",
            eval_cache,
        ],
        capsys,
    )
    assert code == 0, err
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    # 64 prompts: the 24 (colour, shape) pairs in turn, 2 or 3 times each; red triangles and blue circles 3 times.
    assert metrics["adherence_n_held_out"] == 6 and metrics["adherence_n_seen"] == 58
    assert metrics["adherence_holdout"] == "red triangle,blue circle"
    for group in ("seen", "held_out", "all"):
        for attr in ("shape", "color", "background", "all"):
            assert 0.0 <= metrics[f"adherence_{attr}_{group}"] <= 1.0
    assert "class_consistency_shapes_cnn" in metrics  # the prompts' shapes are the samples' classes
    assert "adherence_all_held_out" in (tmp_path / "ev" / "report.md").read_text()


def test_sweep_runs_on_a_text_checkpoint(text_run, tmp_path, capsys, eval_cache):
    args = [
        "sweep",
        "--checkpoint",
        text_run,
        "--samplers",
        "euler",
        "--steps",
        "1",
        "--cfg",
        "2",
        "--n",
        10,
        "--out",
        tmp_path / "sw",
        "--cache-dir",
        eval_cache,
        "--no-progress",
    ]
    code, err = run(args, capsys)
    assert code == 0, err
    assert len(json.loads((tmp_path / "sw" / "sweep.json").read_text())["rows"]) == 1


def test_an_empty_prompt_is_refused_unless_unconditional_samples_are_asked_for(text_run, tiny_run, tmp_path, capsys):
    for prompt in ("", "   "):
        code, err = run(["sample", "--checkpoint", text_run, "--prompt", prompt, "--out", tmp_path / "x.png"], capsys)
        assert code == 2 and "an empty prompt would sample with no caption at all" in err and "--unconditional" in err
    assert not (tmp_path / "x.png").exists()
    code, err = run(
        ["sample", "--checkpoint", text_run, "--unconditional", "--n", 3, "--steps", 1, "--out", tmp_path / "u.npz"],
        capsys,
    )
    assert code == 0, err
    assert np.load(tmp_path / "u.npz")["images"].shape == (3, 3, 32, 32)
    code, err = run(
        [
            "sample",
            "--checkpoint",
            tiny_run[0] / "checkpoint.pt",
            "--unconditional",
            "--n",
            4,
            "--steps",
            1,
            "--out",
            tmp_path / "c",
        ],
        capsys,
    )
    assert code == 0, err  # a class model: the null label, written as the class "unconditional"
    assert sorted(p.name for p in (tmp_path / "c").iterdir())[0] == "00000_unconditional.png"
