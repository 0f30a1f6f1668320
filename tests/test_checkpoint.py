"""The checkpoint as a type: what older releases wrote is upgraded in one place, what is written reads back
the same, and a damaged file is refused by name."""

from pathlib import Path

import pytest
import torch

from tinydit.checkpoints.checkpoint import Checkpoint, load_model
from tinydit.checkpoints.pretrained import reference_folder
from tinydit.errors import TinyDiTError
from tinydit.flow.settings import recommended_sampling

FIXTURE = Path(__file__).parent / "fixtures" / "dit-0.2m.pt"  # written by an earlier release: no sampling, no repa


def _older(tmp_path: Path, **changes) -> Path:
    """The fixture as a still older release wrote it: no model type (every model was a DiT), no image shape,
    no kernels; ``changes`` edit the dict further (None deletes a key)."""
    state = torch.load(FIXTURE, weights_only=True)
    del state["model_type"], state["kernels"], state["data"]["channels"], state["data"]["img_size"]
    for key, value in changes.items():
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    path = tmp_path / "older.pt"
    torch.save(state, path)
    return path


def test_an_older_file_is_upgraded_where_it_is_read(tmp_path):
    ckpt = Checkpoint.load(_older(tmp_path))
    assert ckpt.model_type == "dit" and ckpt.config.cond == "class" and ckpt.preset == "dit-0.2m"
    assert ckpt.data.name == "shapes" and ckpt.data.channels is None and ckpt.data.prompts is None
    assert ckpt.train().repa == 0.0  # stored before the alignment existed: it trained without it
    assert ckpt.train().flip is True  # stored before `flip` existed: every data set flipped
    assert ckpt.sampling is None and ckpt.kernels is None and ckpt.objective == "flow"
    # what it would record now, from the measured records
    assert ckpt.sampling_settings() == recommended_sampling("shapes", "dit-0.2m", "class", "flow")
    model, _ = load_model(ckpt)
    assert type(model).__name__ == "DiT" and ckpt.missing_to_continue == [] and ckpt.optimizer_fused


def test_written_back_it_holds_the_upgrade_and_keeps_what_it_does_not_know(tmp_path):
    raw = torch.load(FIXTURE, weights_only=True)
    ckpt = Checkpoint.load(_older(tmp_path, note_from_a_newer_release={"kept": [1, 2]}))
    ckpt.save(tmp_path / "again.pt")
    again = torch.load(tmp_path / "again.pt", weights_only=True)
    assert again["model_type"] == "dit" and again["train_config"]["repa"] == 0.0
    assert again["note_from_a_newer_release"] == {"kept": [1, 2]}
    assert again["data"] == {"name": "shapes", "classes": ["circle", "square", "triangle", "cross"]}
    # the model config gains the fields added since, at the values the file was read with
    assert again["model_config"] == ckpt.config.to_dict() and again["step"] == raw["step"]
    assert {k: again["model_config"][k] for k in raw["model_config"]} == raw["model_config"]
    for key in ("model", "ema"):
        assert all(torch.equal(again[key][k], raw[key][k]) for k in raw[key]), key
    assert Checkpoint.load(tmp_path / "again.pt").train().to_dict() == ckpt.train().to_dict()


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(data={"name": "shapes"}), "lacks data.classes"),
        (dict(model=None, ema=None), "lacks model"),
        (dict(step=None), "lacks step"),
        (dict(model_config={"dim": 64, "wings": 2}), "unknown DiT config keys \\['wings'\\]"),
        # a wrong type is named with its key and value, not a TypeError from where it is used
        (dict(model_config={"dim": "64"}), "older.pt: model_config.dim must be an integer, got '64'"),
        (dict(data={"name": "shapes", "classes": 4}), "older.pt: data.classes must be a list of strings, got 4"),
        (dict(step="60"), "older.pt: step must be an integer, got '60'"),
        (dict(train_config={"steps": 0}), "older.pt: train_config.steps must be >= 1, got 0"),
        (dict(model_type="vit"), "older.pt: model_type: unknown model 'vit'"),
        # the records against each other: five names for four classes would draw the null label as "dragon"
        (
            dict(data={"name": "shapes", "classes": ["circle", "square", "triangle", "cross", "dragon"]}),
            "data.classes names 5 classes .* for a model of model_config.n_classes 4",
        ),
        (dict(data={"name": "shapes", "classes": ["a", "b", "c", "d"], "img_size": 28}), "data.img_size 28 disagrees"),
        (dict(tokenizer={"vocab": ["a"], "max_len": 2}), "tokenizer is given for a model of model_config.cond class"),
    ],
)
def test_a_damaged_file_is_refused_by_name(tmp_path, changes, message):
    path = _older(tmp_path, **changes)
    with pytest.raises(TinyDiTError, match=message):
        Checkpoint.load(path)


def test_a_pretrained_folder_reads_as_a_checkpoint_that_cannot_be_continued():
    ckpt = Checkpoint.load(reference_folder("shapes"))
    assert ckpt.source.endswith("model.safetensors") and ckpt.data.name == "shapes"
    assert ckpt.sampling is not None and ckpt.weights(ema=True) is ckpt.ema
    assert ckpt.missing_to_continue == ["optimizer", "rng"]  # sampling's part only


def test_weights_of_another_type_or_not_finite_are_refused_where_they_are_read(tmp_path):
    raw = torch.load(FIXTURE, weights_only=True)
    name = next(k for k, v in raw["ema"].items() if v.dim() == 2)
    for tensor, message in (
        (torch.full_like(raw["ema"][name], float("nan")), f"hold NaN or infinite values \\({name}\\)"),
        (raw["ema"][name].to(torch.int64), f"wrong type {name} int64"),
        ([0.0], f"not a tensor {name}"),
    ):
        path = _older(tmp_path, ema={**raw["ema"], name: tensor})
        with pytest.raises(TinyDiTError, match=f"the weights in {path} do not fit|the weights in {path} hold"):
            Checkpoint.load(path)
        with pytest.raises(TinyDiTError, match=message):
            Checkpoint.load(path)
    # a config edited to a huge width is refused without allocating it (the shapes come from the meta device)
    for dim, message in ((2**20, "wrong shape"), (2**40, "too large to exist")):
        path = _older(tmp_path, model_config={**raw["model_config"], "dim": dim, "n_heads": 2})
        with pytest.raises(TinyDiTError, match=message):
            Checkpoint.load(path)


@pytest.mark.parametrize("name", ["checkpoint", "pretrained"])
def test_the_old_import_paths_warn_and_give_the_same_objects(name):
    """``tinydit.models.checkpoint`` and ``.pretrained`` (named by older code and notebooks) still import, with
    a DeprecationWarning naming the new home, and hand on the very same objects."""
    import importlib
    import sys

    new = importlib.import_module(f"tinydit.checkpoints.{name}")
    sys.modules.pop(f"tinydit.models.{name}", None)  # a module warns once, when it is first imported
    with pytest.warns(DeprecationWarning, match=f"tinydit.checkpoints.{name}"):
        old = importlib.import_module(f"tinydit.models.{name}")
    assert new.__all__ and all(getattr(old, n) is getattr(new, n) for n in new.__all__)
