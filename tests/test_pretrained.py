"""Pretrained folders (safetensors weights, config.json, a model card): they sample what their checkpoint
samples, load without unpickling, and every bad input is one line naming the file, exit 2, nothing written."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import tinydit
from tinydit import api
from tinydit.checkpoints.checkpoint import load_checkpoint, load_model
from tinydit.checkpoints.pretrained import CARD, CONFIG, WEIGHTS
from tinydit.cli import main
from tinydit.errors import TinyDiTError

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each fixture checkpoint exported once, in float32: {name: folder}."""
    root = tmp_path_factory.mktemp("pretrained")
    names = ("dit-0.2m", "mmdit-0.2m")
    return {name: api.export(FIXTURES / f"{name}.pt", "safetensors", root / name) for name in names}


@pytest.mark.parametrize("name", ["dit-0.2m", "mmdit-0.2m"])
def test_a_pretrained_folder_samples_what_its_checkpoint_samples(name, folders, monkeypatch):
    folder = folders[name]
    assert sorted(p.name for p in folder.iterdir()) == sorted([WEIGHTS, CONFIG, CARD])
    expected = api.sample(FIXTURES / f"{name}.pt", 8, seed=3)

    def no_pickle(*args, **kwargs):
        raise AssertionError("a pretrained folder is read without torch.load")

    monkeypatch.setattr(torch, "load", no_pickle)
    got = api.sample(folder, 8, seed=3)
    assert torch.equal(got.x, expected.x) and got.settings == expected.settings and got.names == expected.names
    model = tinydit.from_pretrained(folder)
    monkeypatch.undo()
    reference, state = load_model(FIXTURES / f"{name}.pt")
    assert not model.training and model.config == reference.config
    for (k, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    assert set(load_file(folder / WEIGHTS)) == set(state.ema)  # the EMA weights, nothing else


def test_the_config_and_the_card_say_what_the_model_is_and_how_to_use_it(folders):
    config = json.loads((folders["dit-0.2m"] / CONFIG).read_text())
    state = load_checkpoint(FIXTURES / "dit-0.2m.pt")
    assert config["format"] == "tinydit-pretrained" and config["model_type"] == "dit"
    assert config["model_config"] == state.config.to_dict() and config["data"] == state.data.to_dict()
    assert config["sampling"] == state.sampling_settings().to_json() and config["sampling"]["source"]
    assert "t = 1 is Gaussian noise" in config["time"]
    assert config["weights"] == {"ema": True, "dtype": "float32"} and config["step"] == state.step
    card = (folders["dit-0.2m"] / CARD).read_text()
    assert "tinydit sample --checkpoint THIS_FOLDER" in card and "from_pretrained" in card
    assert state.data.name in card and f"{state.step} optimizer steps" in card
    assert "Not measured for this card" in card  # the fixture run made no evaluation


def test_bf16_weights_halve_the_file_and_still_sample_the_same_shapes(folders, tmp_path):
    half = api.export(FIXTURES / "dit-0.2m.pt", "safetensors", tmp_path / "bf16", dtype="bfloat16")
    size, full = (half / WEIGHTS).stat().st_size, (folders["dit-0.2m"] / WEIGHTS).stat().st_size
    assert 0.45 < size / full < 0.6
    assert all(t.dtype == torch.bfloat16 for t in load_file(half / WEIGHTS).values())
    assert json.loads((half / CONFIG).read_text())["weights"]["dtype"] == "bfloat16"
    a, b = api.sample(folders["dit-0.2m"], 8, seed=0).x, api.sample(half, 8, seed=0).x
    assert not torch.equal(a, b) and (a - b).abs().mean() < 0.05  # rounded weights, the same pictures


def test_a_model_card_shows_the_metrics_it_is_given(tmp_path):
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps({"fid_shapes_cnn": 0.4321, "shape_strict": 0.61, "sampler_note": "text"}))
    folder = api.export(FIXTURES / "dit-0.2m.pt", "safetensors", tmp_path / "m", metrics=metrics)
    card = (folder / CARD).read_text()
    assert "| fid_shapes_cnn | 0.4321 |" in card and "| shape_strict | 0.61 |" in card and "sampler_note" not in card


def test_the_cli_exports_a_folder_that_sample_takes(tmp_path, capsys):
    folder = tmp_path / "shared"
    assert (
        main(["export", "--checkpoint", str(FIXTURES / "dit-0.2m.pt"), "--format", "safetensors", "--out", str(folder)])
        == 0
    )
    assert main(["sample", "--checkpoint", str(folder), "--n", "4", "--out", str(tmp_path / "s.png")]) == 0
    assert (tmp_path / "s.png").is_file() and f"wrote {folder}" in capsys.readouterr().err


def _broken(folder: Path, kind: str, tmp_path: Path) -> Path:
    """A copy of ``folder`` damaged in one way."""
    bad = tmp_path / kind
    bad.mkdir()
    config, weights = json.loads((folder / CONFIG).read_text()), load_file(folder / WEIGHTS)
    if kind == "extra":
        weights["surplus.weight"] = torch.zeros(3)
    elif kind == "missing":
        weights.pop(next(iter(weights)))
    elif kind == "shape":
        key = next(k for k, v in weights.items() if v.dim() == 2)
        weights[key] = torch.zeros(weights[key].shape[0] + 1, weights[key].shape[1])
    if kind != "no-weights":
        save_file(weights, bad / WEIGHTS)
    if kind == "not-json":
        (bad / CONFIG).write_text("{ not json")
    elif kind == "other-format":
        (bad / CONFIG).write_text(json.dumps({"architectures": ["BertModel"]}))  # a transformers config.json
    elif kind == "not-safetensors":
        (bad / CONFIG).write_text(json.dumps(config))
        (bad / WEIGHTS).write_bytes(b"\x00" * 64)
    elif kind != "no-config":
        (bad / CONFIG).write_text(json.dumps(config))
    return bad


@pytest.mark.parametrize(
    "kind, message",
    [
        ("no-config", "has no config.json: a pretrained folder holds config.json and model.safetensors"),
        ("no-weights", "has no model.safetensors"),
        ("not-json", "config.json is not readable JSON"),
        ("other-format", "is not a TinyDiT pretrained config"),
        ("not-safetensors", "model.safetensors is not a readable safetensors file"),
        ("extra", "do not fit its model config (unexpected surplus.weight)"),
        ("missing", "do not fit its model config (missing "),
        ("shape", "do not fit its model config (wrong shape "),
    ],
)
def test_a_bad_folder_is_one_line_naming_the_file_exit_2_and_nothing_written(kind, message, folders, tmp_path, capsys):
    bad = _broken(folders["dit-0.2m"], kind, tmp_path)
    out = tmp_path / "out"
    for args in (
        ["sample", "--checkpoint", str(bad), "--n", "2", "--out", str(out / "s.png")],
        ["export", "--checkpoint", str(bad), "--format", "safetensors", "--out", str(out / "again")],
    ):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.count(": error: ") == 1 and message in err and str(bad) in err and "Traceback" not in err, err
    assert not out.exists()


def test_a_hub_id_without_a_network_and_a_bad_out_are_clear_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TinyDiTError, match="does not exist: .* as a Hugging Face Hub id it could not be fetched"):
        tinydit.from_pretrained("tinydit-nobody/no-such-model")
    with pytest.raises(TinyDiTError, match="a safetensors export is a folder"):
        api.export(FIXTURES / "dit-0.2m.pt", "safetensors", tmp_path / "m.safetensors")
    with pytest.raises(TinyDiTError, match="`dtype` must be one of float32, bfloat16, float16"):
        api.export(FIXTURES / "dit-0.2m.pt", "safetensors", tmp_path / "m", dtype="int8")
    assert not (tmp_path / "m").exists()


def test_a_run_directory_stands_for_its_checkpoint(tiny_run):
    out, _ = tiny_run
    a, b = api.sample(out, 4, seed=0).x, api.sample(out / "checkpoint.pt", 4, seed=0).x
    assert torch.equal(a, b)


def _edited(folder: Path, tmp_path: Path, edit) -> Path:
    """A copy of ``folder`` whose config.json ``edit`` changed in place (the weights as exported)."""
    copy = tmp_path / "edited"
    shutil.copytree(folder, copy)
    config = json.loads((copy / CONFIG).read_text())
    edit(config)
    (copy / CONFIG).write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c["model_config"].update(dim="64"), "model_config.dim must be an integer, got '64'"),
        (lambda c: c["data"].update(classes=4), "data.classes must be a list of strings, got 4"),
        (lambda c: c["model_config"].update(mlp_ratio=float("nan")), "model_config.mlp_ratio must be a finite number"),
        (lambda c: c["weights"].update(dtype="bfloat16"), "weights.dtype says 'bfloat16', and model.safetensors holds"),
        # the sampler settings are read where they are used (tinydit.flow.settings): the model itself loads
        (lambda c: c["sampling"].update(steps="8"), "sampling.steps must be an integer, got '8'"),
    ],
)
def test_a_wrongly_typed_value_in_config_json_is_one_line_naming_the_file_key_and_value(
    edit, message, folders, tmp_path, capsys
):
    bad = _edited(folders["dit-0.2m"], tmp_path, edit)
    expected = f"{bad / CONFIG}: {message}"
    loads = (tinydit.from_pretrained, load_checkpoint) if not message.startswith("sampling") else ()
    for load in (*loads, lambda p: api.sample(p, 2, steps=1)):
        with pytest.raises(TinyDiTError, match=re.escape(expected)):
            load(bad)
    out = tmp_path / "x.png"
    assert main(["sample", "--checkpoint", str(bad), "--n", "4", "--steps", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and "; fix it, or " in err, err
    assert not out.exists()


def test_class_names_that_disagree_with_the_weights_are_refused_not_drawn(folders, tmp_path, capsys):
    # Five names for weights of four classes: "dragon" was label 4, the null label, and drew what
    # --unconditional draws; --unconditional itself passed label 5 to an embedding of five rows.
    bad = _edited(folders["dit-0.2m"], tmp_path, lambda c: c["data"]["classes"].append("dragon"))
    message = "data.classes names 5 classes (circle, square, triangle, cross, dragon) for a model of "
    message += "model_config.n_classes 4"
    for args in (["--class", "dragon"], ["--unconditional"], []):
        out = tmp_path / "x.png"
        assert main(["sample", "--checkpoint", str(bad), *args, "--n", "4", "--steps", "2", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and str(bad / CONFIG) in err, err
        assert not out.exists()
    with pytest.raises(TinyDiTError, match=re.escape(message)):
        tinydit.from_pretrained(bad)
