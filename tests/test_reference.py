"""The reference models shipped in the package: `tinydit sample --pretrained NAME` draws without training, and
each model still measures what its card says (the check its config.json records, drawn again here)."""

import json
from pathlib import Path

import pytest
import torch

import tinydit
from tinydit import api
from tinydit.checkpoints.pretrained import CARD, CONFIG, reference_folder, reference_models
from tinydit.cli import main
from tinydit.eval.check import check_model

# fp32 sampling on different CPUs differs by rounding, so a few of the same samples may flip between pass and
# fail: three in a hundred are allowed (docs/export.md says what has been measured of that spread).
TOLERANCE = 0.03


def test_the_package_ships_the_shapes_reference_model():
    assert "shapes" in reference_models()


# The headline metric each reference model's card must show.
HEADLINE = {"shapes": "shape_strict", "fashion-mnist": "fid_fmnist_cnn", "shapes-text": "adherence_all_seen"}


def test_the_package_ships_the_fashion_mnist_reference_model():
    assert "fashion-mnist" in reference_models()


def test_the_package_ships_the_text_to_image_reference_model():
    assert "shapes-text" in reference_models()


@pytest.mark.parametrize("name", reference_models())
def test_a_reference_model_measures_what_its_card_says(name):
    folder = reference_folder(name)
    config = json.loads((folder / CONFIG).read_text())
    check, metrics = config["check"], config["metrics"]
    card = (folder / CARD).read_text()
    assert f"| {HEADLINE[name]} | {metrics[HEADLINE[name]]:.4g} |" in card and config["about"] in card
    assert check["precision"] == "fp32"
    scores = check_model(folder, check["n"], seed=check["seed"], steps=check.get("steps"))
    expected = {k: v for k, v in check.items() if k not in ("n", "seed", "precision", "steps")}
    assert expected and expected.keys() == scores.keys(), (expected, scores)
    for key, value in expected.items():
        assert abs(scores[key] - value) <= TOLERANCE, (key, scores, check)


def test_sample_pretrained_draws_without_training_and_an_unknown_name_is_exit_2(tmp_path, capsys):
    out = tmp_path / "s.png"
    assert main(["sample", "--pretrained", "shapes", "--n", "4", "--steps", "4", "--out", str(out)]) == 0
    assert out.is_file()
    assert main(["sample", "--pretrained", "cifar-giant", "--n", "4", "--out", str(tmp_path / "t.png")]) == 2
    err = capsys.readouterr().err
    assert "unknown --pretrained model 'cifar-giant': this tinydit ships fashion-mnist, shapes, shapes-text" in err
    assert not (tmp_path / "t.png").exists()
    model = api.from_pretrained(reference_folder("shapes"))
    assert not model.training and next(model.parameters()).dtype == torch.float32  # bf16 weights, loaded as fp32


def test_pretrained_shapes_says_its_settings_in_one_short_line():
    assert api.sampling_note(reference_folder("shapes")) == (
        "sampling with ancestral, 64 steps, guidance 10 on t in [0.8, 1], eta 1: the checkpoint's recorded settings "
        "(chosen by precision and recall together, both above guidance 50's in shapes_cnn)"
    )


def test_no_shipped_file_cites_the_experiments_folder_which_is_not_shipped():
    """What the package ships (code, records, reference models and their cards) cites only commands a user of the
    installed package can run; the experiments live in the repository and the guide."""
    package = Path(tinydit.__file__).parent
    shipped = [p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert any(p.name == "sampling_records.json" for p in shipped) and any(p.suffix == ".safetensors" for p in shipped)
    assert [str(p.relative_to(package)) for p in shipped if b"experiments/" in p.read_bytes()] == []
