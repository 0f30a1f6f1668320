"""tinydit.api is what the CLI calls: everything a command does is one call from Python, a user's own
Dataset trains like a built-in one, and the train flags come from TrainConfig itself."""

import argparse
from dataclasses import dataclass, field, fields

import pytest
import torch
from conftest import FAST
from torch.utils.data import Dataset

from tinydit import api
from tinydit.checkpoints.checkpoint import load_checkpoint
from tinydit.cli import build_parser, main
from tinydit.config import TrainConfig
from tinydit.errors import TinyDiTError
from tinydit.flags import add_config_flags, as_flags, field_comments, flags_of


class Stripes(Dataset):
    """A user's own map-style dataset: 1x16x16 images in [-1, 1], vertical (0) or horizontal (1) stripes."""

    classes = ["vertical", "horizontal"]

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        label = i % 2
        stripes = (torch.arange(16) // 2 % 2).float() * 2 - 1  # (16,) in {-1, 1}
        x = stripes.view(1, 1, 16).expand(1, 16, 16) if label == 0 else stripes.view(1, 16, 1).expand(1, 16, 16)
        return x.clone(), label


def test_a_users_dataset_trains_samples_and_resumes(tmp_path):
    config = TrainConfig(out=str(tmp_path / "run"), **{**FAST, "limit": None}, steps=4)
    result = api.train(config, dataset=Stripes(60))
    state = load_checkpoint(result.checkpoint)
    assert result.step == 4 and state.data.name == "dataset:Stripes"
    assert state.data.classes == ("vertical", "horizontal") and state.config.img_size == 16
    assert (
        api.train(TrainConfig(out=str(tmp_path / "run"), **{**FAST, "limit": None}, steps=6), dataset=Stripes(60)).step
        == 6
    )  # the same command continues it
    grid = api.sample(result.checkpoint, n=4, classes=["horizontal"], steps=2, out=tmp_path / "s.png")
    assert grid.x.shape == (4, 1, 16, 16) and grid.labels.tolist() == [1, 1, 1, 1] and grid.path.exists()
    with pytest.raises(TinyDiTError, match="holds a run with other settings.*data: 'dataset:Stripes' -> 'shapes'"):
        api.train(TrainConfig(out=str(tmp_path / "run"), **FAST, steps=8))


def test_a_dataset_of_the_wrong_form_is_refused(tmp_path):
    class Flat(Stripes):
        def __getitem__(self, i):
            return torch.zeros(256), 0

    with pytest.raises(TinyDiTError, match=r"float tensor \(C, H, W\), H = W"):
        api.train(TrainConfig(out=str(tmp_path), **FAST, steps=1), dataset=Flat(10))


def test_sample_from_python_equals_the_cli(tiny_run, tmp_path, capsys):
    ckpt = tiny_run[0] / "checkpoint.pt"
    res = api.sample(ckpt, n=6, sampler="heun", steps=3, cfg_scale=1.5, seed=3, out=tmp_path / "a.npz")
    assert (
        main(
            [
                "sample",
                "--checkpoint",
                ckpt,
                "--n",
                6,
                "--sampler",
                "heun",
                "--steps",
                3,
                "--cfg",
                1.5,
                "--seed",
                3,
                "--out",
                tmp_path / "b.npz",
            ]
        )
        == 0
    )
    import numpy as np

    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    assert np.array_equal(a["images"], b["images"]) and np.array_equal(a["labels"], b["labels"])
    assert res.nfe == 2 * (2 * 3 - 1)  # Heun: 2 per step, 1 for the last; guided: x2


def test_every_trainconfig_field_is_a_train_flag_with_its_default_and_comment():
    parser = build_parser()
    flags = flags_of(parser, "train")
    comments = field_comments(TrainConfig)
    for f in fields(TrainConfig):
        switched_off = f.type == "bool" and f.default is True  # a switch that is on: --no-name turns it off
        assert flags[f.name] == ("--no-" if switched_off else "--") + f.name.replace("_", "-")
        assert comments[f.name], f"TrainConfig.{f.name} needs a comment: it is the flag's help"
    args = parser.parse_args(["train"])
    assert TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)}) == TrainConfig()
    args = parser.parse_args(["train", "--qk-norm", "on", "--teacher-cfg-interval", "0.2", "0.7", "--lr", "2e-3"])
    assert args.qk_norm is True and args.teacher_cfg_interval == [0.2, 0.7] and args.lr == 2e-3


def test_a_new_config_field_is_a_new_flag():
    """One edit per option: a field with a comment is all a flag needs."""

    @dataclass
    class Extended:
        warmup: int = 100  # linear learning-rate warm-up, in steps
        dropout: float = 0.0  # a new option
        # a comment above a field is its help too
        tag: str | None = None
        sizes: tuple[float, float] = field(default=(0.1, 0.8))  # two numbers

    p = argparse.ArgumentParser()
    add_config_flags(p, Extended, {"tag": ("a", "b")}, {})
    args = p.parse_args(["--dropout", "0.5", "--tag", "b", "--sizes", "0.3", "0.4"])
    assert (args.warmup, args.dropout, args.tag, args.sizes) == (100, 0.5, "b", [0.3, 0.4])
    helps = {a.dest: a.help for a in p._actions}
    assert helps["dropout"] == "a new option" and helps["tag"] == "a comment above a field is its help too"
    with pytest.raises(SystemExit):
        p.parse_args(["--tag", "c"])  # choices come from the table given


def test_library_errors_name_parameters_and_the_cli_prints_flags(tmp_path, capsys):
    with pytest.raises(TinyDiTError, match="`steps` must be >= 1"):
        TrainConfig(steps=0)
    flags = flags_of(build_parser(), "sample")
    message = "`cfg_scale` must be >= 0; `n` too; `dataset` has none"
    assert as_flags(message, flags) == "--cfg-scale must be >= 0; --n too; dataset has none"
    assert main(["train", "--steps", 0, "--out", tmp_path]) == 2
    assert "tinydit train: error: --steps must be >= 1, got 0" in capsys.readouterr().err


def test_presets_from_python_list_every_preset():
    rows = api.presets()
    names = {r["preset"] for r in rows}
    assert {"dit-0.2m", "dit-1.9m", "mmdit-2.3m"} <= names
    assert sum(r["default"] for r in rows) == 2  # one default per model type
    dit = next(r for r in rows if r["preset"] == "dit-1.9m")
    assert dit["switches"] == {"mlp": "swiglu", "pred": "x"} and round(dit["params"] / 1e6, 1) == 1.9
    shapes = next(r for r in rows if r["preset"] == "dit-1.4m")  # the pixel convolutions and skips are shown too
    assert shapes["switches"] == {
        "qk_norm": True,
        "mlp": "swiglu",
        "pred": "x",
        "stem": "conv",
        "head": "conv",
        "skips": True,
    }
