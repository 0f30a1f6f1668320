import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import fashion_mnist_available

from tinydit.cli import main
from tinydit.data import load_dataset
from tinydit.data.samples import load_samples
from tinydit.errors import TinyDiTError
from tinydit.eval.evaluate import (
    _OfflineExtractor,
    add_noise,
    blur,
    evaluate,
    reference_features,
    to_eval_images,
)
from tinydit.eval.features import extract, load_feature_net

HAS_FMNIST = fashion_mnist_available()


@pytest.mark.parametrize(
    "data, name, floor, dim",
    [
        ("shapes", "shapes_cnn", 0.99, 128),
        ("shapes", "shapes_judge", 0.99, 256),  # the independent judge: twice as wide, other training images
        pytest.param(
            "fashion-mnist",
            "fmnist_cnn",
            0.88,
            128,
            marks=pytest.mark.skipif(
                not HAS_FMNIST, reason="Fashion-MNIST is absent (./data and Debian's dataset-fashion-mnist)"
            ),
        ),
    ],
)
def test_shipped_feature_nets_load_and_are_accurate_on_held_out_images(data, name, floor, dim):
    net, record = load_feature_net(name)  # checks the file against its recorded SHA-256
    assert net.feature_dim == dim and not net.training
    test = load_dataset(data, train=False, limit=1000)
    _, preds = extract(net, to_eval_images(test.images, data))
    accuracy = (preds == test.labels).double().mean().item()
    assert accuracy > floor, accuracy
    assert abs(accuracy - record["test_accuracy"]) < 0.03  # the manifest tells the truth


@pytest.mark.parametrize(
    "data",
    [
        "shapes",
        pytest.param(
            "fashion-mnist",
            marks=pytest.mark.skipif(
                not HAS_FMNIST, reason="Fashion-MNIST is absent (./data and Debian's dataset-fashion-mnist)"
            ),
        ),
    ],
)
def test_metrics_worsen_monotonically_with_blur_and_noise(data, eval_cache):
    real = load_dataset(data, train=True, limit=1000).images
    labels = load_dataset(data, train=True, limit=1000).labels
    results = {}
    for name, imgs in [
        ("real", real),
        ("blur1", blur(real, 1)),
        ("blur3", blur(real, 3)),
        ("noise16", add_noise(real, 16)),
        ("noise48", add_noise(real, 48)),
    ]:
        results[name] = evaluate(imgs, labels, data, cache_dir=eval_cache, kid_subsets=10)
    tags = ["shapes_cnn", "shapes_judge"] if data == "shapes" else ["fmnist_cnn"]  # shapes: both its judges
    assert list(results["real"]["feature_nets"]) == tags
    for tag in tags:
        fid = {k: v[f"fid_{tag}"] for k, v in results.items()}
        kid_ = {k: v[f"kid_{tag}_mean"] for k, v in results.items()}
        assert fid["real"] < fid["blur1"] < fid["blur3"], (tag, fid)
        assert fid["real"] < fid["noise16"] < fid["noise48"], (tag, fid)
        assert kid_["real"] < kid_["blur1"] < kid_["blur3"], (tag, kid_)
        assert kid_["real"] < kid_["noise16"] < kid_["noise48"], (tag, kid_)
        assert results["real"][f"class_consistency_{tag}"] > 0.9
        assert results["real"][f"precision_{tag}"] > results["noise48"][f"precision_{tag}"]


def test_reference_cache_is_reused_and_invalidated_when_weights_change(tmp_path, monkeypatch):
    import shutil

    import tinydit.eval.evaluate as ev
    import tinydit.eval.features as features

    calls = []
    real_reference_images = ev.reference_images

    def reference_images(*a, **k):  # counted, and the first 1,000 images: what is cached matters here, not how many
        calls.append(a)
        images, labels = real_reference_images(*a, **k)
        return images[:1000], labels[:1000]

    monkeypatch.setattr(ev, "reference_images", reference_images)
    ex = _OfflineExtractor("shapes_cnn")
    feats1, rec1 = reference_features("shapes", "test", ex, cache_dir=tmp_path / "cache")
    feats2, rec2 = reference_features("shapes", "test", ex, cache_dir=tmp_path / "cache")
    assert len(calls) == 1 and not rec1["cache_hit"] and rec2["cache_hit"] and torch.equal(feats1, feats2)

    # Retrained weights: a new file with a new hash in the manifest must not reuse the cached features.
    assets = tmp_path / "assets"
    shutil.copytree(features.ASSETS, assets)
    state = torch.load(assets / "shapes_cnn.pt", weights_only=True)
    state["model"] = {k: v * 1.5 if v.is_floating_point() else v for k, v in state["model"].items()}
    torch.save(state, assets / "shapes_cnn.pt")
    manifest = json.loads((assets / "feature_nets.json").read_text())
    manifest["shapes_cnn"]["sha256"] = features.file_sha256(assets / "shapes_cnn.pt")
    (assets / "feature_nets.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(features, "ASSETS", assets)
    feats3, rec3 = reference_features("shapes", "test", _OfflineExtractor("shapes_cnn"), cache_dir=tmp_path / "cache")
    assert len(calls) == 2 and not rec3["cache_hit"] and not torch.equal(feats1, feats3)

    # A damaged cache file is a miss, not a crash.
    for f in (tmp_path / "cache" / "reference").iterdir():
        f.write_bytes(b"garbage")
    _, rec4 = reference_features("shapes", "test", _OfflineExtractor("shapes_cnn"), cache_dir=tmp_path / "cache")
    assert len(calls) == 3 and not rec4["cache_hit"]


def test_a_tampered_feature_net_is_refused(tmp_path, monkeypatch):
    import shutil

    import tinydit.eval.features as features

    shutil.copytree(features.ASSETS, tmp_path / "assets")
    with open(tmp_path / "assets" / "shapes_cnn.pt", "ab") as f:
        f.write(b"\0")
    monkeypatch.setattr(features, "ASSETS", tmp_path / "assets")
    with pytest.raises(TinyDiTError, match="does not match its recorded SHA-256"):
        load_feature_net("shapes_cnn")


def test_accepted_sizes_dtypes_and_layouts():
    x = torch.randint(0, 256, (4, 1, 28, 28), dtype=torch.uint8)
    assert torch.equal(to_eval_images(x, "fashion-mnist"), x)
    assert torch.equal(to_eval_images(x[:, 0].numpy(), "fashion-mnist"), x)  # (N, H, W)
    assert torch.equal(to_eval_images(x.permute(0, 2, 3, 1).numpy(), "fashion-mnist"), x)  # channels last
    padded = F.pad(x, (2, 2, 2, 2))
    assert torch.equal(to_eval_images(padded, "fashion-mnist"), x)  # 32x32 padded copies
    as_float = x.float() / 127.5 - 1
    assert torch.equal(to_eval_images(as_float, "fashion-mnist"), x)  # float [-1, 1] quantised the same way
    for bad in (
        torch.zeros(4, 3, 28, 28, dtype=torch.uint8),
        torch.zeros(4, 1, 30, 30, dtype=torch.uint8),
        torch.zeros(4, 3, 64, 64),
    ):
        with pytest.raises(TinyDiTError, match="accepted sizes are 1x28x28 or 1x32x32"):
            to_eval_images(bad, "fashion-mnist")
    with pytest.raises(TinyDiTError, match="dtype torch.int32"):
        to_eval_images(x.int(), "fashion-mnist")
    with pytest.raises(TinyDiTError, match="accepted sizes are 3x32x32"):
        to_eval_images(torch.zeros(2, 1, 28, 28), "shapes")
    with pytest.raises(TinyDiTError, match="no offline feature network for cifar10.*`inception`"):
        evaluate(torch.zeros(20, 3, 32, 32), None, "cifar10")


def test_too_few_samples_is_a_clear_error(tmp_path):
    with pytest.raises(TinyDiTError, match="too few"):
        evaluate(torch.zeros(3, 3, 32, 32, dtype=torch.uint8), None, "shapes", cache_dir=tmp_path)


def test_load_samples_from_folder_reads_class_names(tmp_path):
    from tinydit.images import save_image

    for i, name in enumerate(["circle", "square", "circle"]):
        save_image(torch.zeros(3, 32, 32), tmp_path / f"{i:05d}_{name}.png")
    images, labels = load_samples(tmp_path, ["circle", "square", "triangle", "cross"])
    assert images.shape == (3, 32, 32, 3) and labels.tolist() == [0, 1, 0]


def test_eval_cli_end_to_end_on_a_tiny_checkpoint(tiny_run, tmp_path, capsys, eval_cache):
    ckpt = tiny_run[0] / "checkpoint.pt"
    code = main(
        [
            "eval",
            "--checkpoint",
            str(ckpt),
            "--n",
            "40",
            "--steps",
            "2",
            "--out",
            str(tmp_path / "ev"),
            "--cache-dir",
            str(eval_cache),
        ]
    )
    err = capsys.readouterr().err
    assert code == 0, err
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    for key in (
        "fid_shapes_cnn",
        "kid_shapes_cnn_mean",
        "kid_shapes_cnn_std",
        "precision_shapes_cnn",
        "recall_shapes_cnn",
        "class_consistency_shapes_cnn",
    ):
        assert isinstance(metrics[key], float), key
        # read again in the independent judge, which shares no weights, width or images with shapes_cnn
        assert isinstance(metrics[key.replace("shapes_cnn", "shapes_judge")], float), key
    assert metrics["fid_shapes_judge"] != metrics["fid_shapes_cnn"]  # another feature space, another distance
    assert list(metrics["feature_nets"]) == ["shapes_cnn", "shapes_judge"]
    assert metrics["n_samples"] == 40 and metrics["nfe_per_image"] == 4 and metrics["eval_seconds"] > 0
    assert metrics["sampler"] == {
        "sampler": "euler",
        "steps": 2,
        "cfg_scale": 2.0,
        "grid": "uniform",
        "shift": None,
        "cfg_interval": None,
        "eta": None,
        "rtol": None,
        "atol": None,
        "source": metrics["sampler"]["source"],
        "seed": 0,
    }
    assert metrics["sampler"]["source"].startswith("steps as given, the rest as recorded")
    # every field a FID compares under, none left unknown for samples drawn from a checkpoint
    assert metrics["protocol"] == {
        "feature_net": "shapes_cnn, shapes_judge",
        "reference": "shapes test",
        "n_reference": metrics["n_reference"],
        "n_samples": 40,
        "sampler": "euler, 2 steps",
        "guidance": "2",
        "nfe_per_image": 4,
        "precision": "fp32",
    }
    assert metrics["n_reference"] > 40
    # a guided evaluation also scores the model alone, from the same noise
    plain = metrics["guidance_1"]
    assert plain["nfe_per_image"] == 2 and plain["fid_shapes_cnn"] != metrics["fid_shapes_cnn"]
    assert {"precision_shapes_cnn", "recall_shapes_cnn", "shape_strict"} <= plain.keys()
    assert metrics["command"].startswith(f"tinydit eval --checkpoint {ckpt} --n 40")
    report = (tmp_path / "ev" / "report.md").read_text()
    assert (
        "fid_shapes_cnn" in report
        and "samples_by_class.png" in report
        and "- sampler: sampler euler, steps 2, cfg_scale 2.0" in report
        and "- protocol: shapes_cnn, shapes_judge features; "
        f"reference shapes test, {metrics['n_reference']:,} images; 40 samples; "
        "euler, 2 steps, guidance 2, 4 evaluations per image; fp32"
        in report
        and "- at guidance 1 (the same noise, no guidance, 2 evaluations per image): fid_shapes_cnn " in report
    )

    # the same samples written to .npz evaluate to the same numbers (eval generates in fp32)
    assert (
        main(
            [
                "sample",
                "--checkpoint",
                str(ckpt),
                "--n",
                "40",
                "--steps",
                "2",
                "--precision",
                "fp32",
                "--out",
                str(tmp_path / "s.npz"),
            ]
        )
        == 0
    )
    code = main(
        [
            "eval",
            "--samples",
            str(tmp_path / "s.npz"),
            "--data",
            "shapes",
            "--out",
            str(tmp_path / "ev2"),
            "--cache-dir",
            str(eval_cache),
        ]
    )
    assert code == 0
    again = json.loads((tmp_path / "ev2" / "metrics.json").read_text())
    assert again["fid_shapes_cnn"] == pytest.approx(metrics["fid_shapes_cnn"], rel=1e-6)
    assert again["feature_nets"]["shapes_cnn"]["cache_hit"]
    # images from a file: what drew them is not known, and the protocol says so
    assert again["protocol"]["sampler"] is None and again["protocol"]["precision"] is None
    assert "guidance_1" not in again  # images from a file: nothing to draw again
    assert "sampler not recorded" in (tmp_path / "ev2" / "report.md").read_text()


def test_eval_cli_errors(tmp_path, capsys, monkeypatch):
    np.savez(tmp_path / "wrong.npz", images=np.zeros((20, 3, 28, 28), np.uint8))
    code = main(
        ["eval", "--samples", str(tmp_path / "wrong.npz"), "--data", "fashion-mnist", "--out", str(tmp_path / "o")]
    )
    assert code == 2 and "accepted sizes are 1x28x28 or 1x32x32" in capsys.readouterr().err
    np.savez(tmp_path / "few.npz", images=np.zeros((3, 3, 32, 32), np.uint8))
    code = main(
        [
            "eval",
            "--samples",
            str(tmp_path / "few.npz"),
            "--data",
            "shapes",
            "--out",
            str(tmp_path / "o"),
            "--cache-dir",
            str(tmp_path / "c"),
        ]
    )
    assert code == 2 and "too few" in capsys.readouterr().err
    monkeypatch.setattr("tinydit.data.datasets.DEBIAN_FASHION_MNIST", tmp_path / "nowhere")
    np.savez(tmp_path / "ok.npz", images=np.zeros((20, 1, 28, 28), np.uint8))
    code = main(
        [
            "eval",
            "--samples",
            str(tmp_path / "ok.npz"),
            "--data",
            "fashion-mnist",
            "--data-root",
            str(tmp_path / "empty"),
            "--out",
            str(tmp_path / "o"),
            "--cache-dir",
            str(tmp_path / "c"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "Fashion-MNIST is not in" in err and err.count(": error: ") == 1


def _standin_inception_weights(path):
    """Random weights with the layout of torch-fidelity's FID Inception: tests the code path, not the numbers."""
    fe = pytest.importorskip("torch_fidelity.feature_extractor_inceptionv3")
    cls = fe.FeatureExtractorInceptionV3
    original = cls.load_state_dict
    try:
        cls.load_state_dict = lambda self, sd, *a, **k: None
        fe_mod_load = fe.load_state_dict_from_url
        fe.load_state_dict_from_url = lambda *a, **k: {}
        model = cls("inception-v3-compat", ["2048"])
    finally:
        cls.load_state_dict = original
        fe.load_state_dict_from_url = fe_mod_load
    torch.manual_seed(0)
    for m in model.modules():  # keep activations at unit scale through 90 layers, so features differ
        if isinstance(m, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
    torch.save(model.state_dict(), path)


def test_inception_fid_with_local_weights_and_clear_error_offline(tmp_path, monkeypatch):
    pytest.importorskip("torchmetrics")
    weights = tmp_path / "standin_inception.pth"
    _standin_inception_weights(weights)
    # An image folder as the reference: Inception FID is its only metric.
    from tinydit.images import save_image

    folder = tmp_path / "ref"
    folder.mkdir()
    ref = load_dataset("shapes", train=False, limit=12)
    for i in range(12):
        save_image(ref.batch(torch.tensor([i]))[0][0], folder / f"{i:03d}.png")
    same = evaluate(ref.images, None, str(folder), inception_weights=weights, cache_dir=tmp_path / "c")
    other = evaluate(blur(ref.images, 3), None, str(folder), inception_weights=weights, cache_dir=tmp_path / "c")
    assert same["fid_inception"] == pytest.approx(0, abs=1e-3) and other["fid_inception"] > 1e-3
    assert "fid_shapes_cnn" not in same and other["feature_nets"]["inception"]["cache_hit"]
    with pytest.raises(TinyDiTError, match="`inception_weights` .* does not exist"):
        evaluate(ref.images, None, "shapes", inception_weights=tmp_path / "missing.pth")
    from fractions import Fraction

    torch.save({"payload": Fraction(1, 2)}, tmp_path / "pickled.pth")  # arbitrary pickled objects: refused
    with pytest.raises(TinyDiTError, match="not a plain state dict"):
        evaluate(ref.images, None, "shapes", inception_weights=tmp_path / "pickled.pth")
    from tinydit.eval.inception import InceptionFeatures

    # Nothing cached and the download refused (a closed local port stands in for being offline).
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "hub"))
    monkeypatch.setattr("torch_fidelity.feature_extractor_inceptionv3.URL_INCEPTION_V3", "http://127.0.0.1:9/x.pth")
    with pytest.raises(TinyDiTError, match="could not be downloaded.*`inception_weights` PATH"):
        InceptionFeatures(None)


def test_the_protocol_is_read_from_old_metrics_and_said_in_one_line():
    from tinydit.eval.protocol import PROTOCOL_FIELDS, describe_protocol, protocol_of

    old = {  # a metrics.json of an older tinydit eval: no protocol, the sampler's older names
        "fid_fmnist_cnn": 1.99,
        "n_reference": 10000,
        "n_samples": 2000,
        "data": "fashion-mnist",
        "split": "test",
        "feature_nets": {"fmnist_cnn": {"sha256": "c9f4"}},
        "nfe_per_image": 64,
        "sampler": {"name": "euler", "steps": 32, "cfg": 2.0, "seed": 0},
    }
    protocol = protocol_of(old)
    assert tuple(protocol) == PROTOCOL_FIELDS
    assert describe_protocol(protocol) == (
        "fmnist_cnn features; reference fashion-mnist test, 10,000 images; 2,000 samples; "
        "euler, 32 steps, guidance 2, 64 evaluations per image; precision not recorded"
    )
    guided = {**old, "sampler": {"sampler": "ancestral", "steps": 64, "cfg_scale": 50.0, "cfg_interval": [0.8, 1.0]}}
    assert protocol_of(guided)["guidance"] == "50 on t in [0.8, 1]"
