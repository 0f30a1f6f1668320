import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tinydit.cli import main
from tinydit.data import DEBIAN_FASHION_MNIST, load_dataset
from tinydit.errors import TinyDiTError
from tinydit.evaluate import evaluate, load_samples, reference_features, to_eval_images
from tinydit.features import load_feature_net

HAS_FMNIST = (DEBIAN_FASHION_MNIST / "t10k-images-idx3-ubyte.gz").exists()


def blur(x: torch.Tensor, passes: int) -> torch.Tensor:
    """uint8 (N, C, S, S) blurred by `passes` 3x3 box filters."""
    y = x.float()
    kernel = torch.ones(y.shape[1], 1, 3, 3) / 9
    for _ in range(passes):
        y = F.conv2d(F.pad(y, (1, 1, 1, 1), mode="replicate"), kernel, groups=y.shape[1])
    return y.round().clamp(0, 255).to(torch.uint8)


def noise(x: torch.Tensor, std: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return (x.float() + std * torch.randn(x.shape, generator=g)).round().clamp(0, 255).to(torch.uint8)


def test_shipped_feature_nets_match_their_hashes_and_are_accurate():
    for name in ("shapes_cnn", "fmnist_cnn"):
        net, record = load_feature_net(name)
        assert record["test_accuracy"] > (0.99 if name == "shapes_cnn" else 0.9)
        assert net.feature_dim == 128 and not net.training


@pytest.mark.parametrize("data", ["shapes", pytest.param("fashion-mnist", marks=pytest.mark.skipif(
    not HAS_FMNIST, reason="Debian's dataset-fashion-mnist is not installed"))])
def test_metrics_worsen_monotonically_with_blur_and_noise(data, tmp_path):
    real = load_dataset(data, train=True, limit=1000).images
    labels = load_dataset(data, train=True, limit=1000).labels
    results = {}
    for name, imgs in [("real", real), ("blur1", blur(real, 1)), ("blur3", blur(real, 3)),
                       ("noise16", noise(real, 16)), ("noise48", noise(real, 48))]:  # fmt: skip
        results[name] = evaluate(imgs, labels, data, cache_dir=tmp_path, kid_subsets=10)
    tag = "shapes_cnn" if data == "shapes" else "fmnist_cnn"
    fid = {k: v[f"fid_{tag}"] for k, v in results.items()}
    kid_ = {k: v[f"kid_{tag}_mean"] for k, v in results.items()}
    assert fid["real"] < fid["blur1"] < fid["blur3"], fid
    assert fid["real"] < fid["noise16"] < fid["noise48"], fid
    assert kid_["real"] < kid_["blur1"] < kid_["blur3"] and kid_["real"] < kid_["noise16"] < kid_["noise48"], kid_
    assert results["real"][f"class_consistency_{tag}"] > 0.9
    assert results["real"][f"precision_{tag}"] > results["noise48"][f"precision_{tag}"]


def test_reference_cache_is_reused_and_invalidated_when_weights_change(tmp_path, monkeypatch):
    calls = []
    import tinydit.evaluate as ev

    real_reference_images = ev.reference_images
    monkeypatch.setattr(ev, "reference_images", lambda *a, **k: calls.append(a) or real_reference_images(*a, **k))
    feats1, rec1 = reference_features("shapes", "test", cache_dir=tmp_path)
    feats2, rec2 = reference_features("shapes", "test", cache_dir=tmp_path)
    assert len(calls) == 1 and not rec1["cache_hit"] and rec2["cache_hit"] and torch.equal(feats1, feats2)

    net, record = load_feature_net("shapes_cnn")
    with torch.no_grad():
        net.head.weight.zero_()
        next(net.body.parameters()).mul_(2)  # other weights -> other features

    def changed(name, path=None):
        return net, {**record, "sha256": "0" * 64}

    monkeypatch.setattr(ev, "load_feature_net", changed)
    feats3, rec3 = reference_features("shapes", "test", cache_dir=tmp_path)
    assert len(calls) == 2 and not rec3["cache_hit"] and not torch.equal(feats1, feats3)


def test_accepted_sizes_dtypes_and_layouts():
    x = torch.randint(0, 256, (4, 1, 28, 28), dtype=torch.uint8)
    assert torch.equal(to_eval_images(x, "fashion-mnist"), x)
    assert torch.equal(to_eval_images(x[:, 0].numpy(), "fashion-mnist"), x)  # (N, H, W)
    assert torch.equal(to_eval_images(x.permute(0, 2, 3, 1).numpy(), "fashion-mnist"), x)  # channels last
    padded = F.pad(x, (2, 2, 2, 2))
    assert torch.equal(to_eval_images(padded, "fashion-mnist"), x)  # 32x32 padded copies
    as_float = x.float() / 127.5 - 1
    assert torch.equal(to_eval_images(as_float, "fashion-mnist"), x)  # float [-1, 1] quantised the same way
    for bad in (torch.zeros(4, 3, 28, 28, dtype=torch.uint8), torch.zeros(4, 1, 30, 30, dtype=torch.uint8),
                torch.zeros(4, 3, 64, 64)):  # fmt: skip
        with pytest.raises(TinyDiTError, match="accepted sizes are 1x28x28 or 1x32x32"):
            to_eval_images(bad, "fashion-mnist")
    with pytest.raises(TinyDiTError, match="accepted sizes are 3x32x32"):
        to_eval_images(torch.zeros(2, 1, 28, 28), "shapes")
    with pytest.raises(TinyDiTError, match="no offline feature network for data set 'cifar10'"):
        to_eval_images(torch.zeros(2, 3, 32, 32), "cifar10")


def test_too_few_samples_is_a_clear_error(tmp_path):
    with pytest.raises(TinyDiTError, match="too few"):
        evaluate(torch.zeros(3, 3, 32, 32, dtype=torch.uint8), None, "shapes", cache_dir=tmp_path)


def test_load_samples_from_folder_reads_class_names(tmp_path):
    from tinydit.images import save_image

    for i, name in enumerate(["circle", "square", "circle"]):
        save_image(torch.zeros(3, 32, 32), tmp_path / f"{i:05d}_{name}.png")
    images, labels = load_samples(tmp_path, ["circle", "square", "triangle", "cross"])
    assert images.shape == (3, 32, 32, 3) and labels.tolist() == [0, 1, 0]


def test_eval_cli_end_to_end_on_a_tiny_checkpoint(tiny_run, tmp_path, capsys):
    ckpt = tiny_run[0] / "checkpoint.pt"
    code = main(["eval", "--checkpoint", str(ckpt), "--n", "40", "--steps", "2", "--out", str(tmp_path / "ev"),
                 "--cache-dir", str(tmp_path / "cache")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    for key in ("fid_shapes_cnn", "kid_shapes_cnn_mean", "kid_shapes_cnn_std", "precision_shapes_cnn",
                "recall_shapes_cnn", "class_consistency_shapes_cnn"):  # fmt: skip
        assert isinstance(metrics[key], float), key
    assert metrics["n_samples"] == 40 and metrics["nfe_per_image"] == 4 and metrics["eval_seconds"] > 0
    assert metrics["command"].startswith("tinydit eval") or "eval" in metrics["command"]
    report = (tmp_path / "ev" / "report.md").read_text()
    assert "fid_shapes_cnn" in report and "samples_by_class.png" in report

    # the same samples written to .npz evaluate to the same numbers
    assert main(["sample", "--checkpoint", str(ckpt), "--n", "40", "--steps", "2", "--out",
                 str(tmp_path / "s.npz")]) == 0  # fmt: skip
    code = main(["eval", "--samples", str(tmp_path / "s.npz"), "--data", "shapes", "--out", str(tmp_path / "ev2"),
                 "--cache-dir", str(tmp_path / "cache")])  # fmt: skip
    assert code == 0
    again = json.loads((tmp_path / "ev2" / "metrics.json").read_text())
    assert again["fid_shapes_cnn"] == pytest.approx(metrics["fid_shapes_cnn"], rel=1e-6)
    assert again["feature_net"]["cache_hit"]


def test_eval_cli_errors(tmp_path, capsys, monkeypatch):
    np.savez(tmp_path / "wrong.npz", images=np.zeros((20, 3, 28, 28), np.uint8))
    code = main(["eval", "--samples", str(tmp_path / "wrong.npz"), "--data", "fashion-mnist", "--out",
                 str(tmp_path / "o")])  # fmt: skip
    assert code == 2 and "accepted sizes are 1x28x28 or 1x32x32" in capsys.readouterr().err
    np.savez(tmp_path / "few.npz", images=np.zeros((3, 3, 32, 32), np.uint8))
    code = main(["eval", "--samples", str(tmp_path / "few.npz"), "--data", "shapes", "--out", str(tmp_path / "o"),
                 "--cache-dir", str(tmp_path / "c")])  # fmt: skip
    assert code == 2 and "too few" in capsys.readouterr().err
    monkeypatch.setattr("tinydit.data.DEBIAN_FASHION_MNIST", tmp_path / "nowhere")
    np.savez(tmp_path / "ok.npz", images=np.zeros((20, 1, 28, 28), np.uint8))
    code = main(["eval", "--samples", str(tmp_path / "ok.npz"), "--data", "fashion-mnist", "--data-root",
                 str(tmp_path / "empty"), "--out", str(tmp_path / "o"),
                 "--cache-dir", str(tmp_path / "c")])  # fmt: skip
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
    torch.save(model.state_dict(), path)


def test_inception_fid_with_local_weights_and_clear_error_offline(tmp_path, monkeypatch):
    pytest.importorskip("torchmetrics")
    weights = tmp_path / "standin_inception.pth"
    _standin_inception_weights(weights)
    x = load_dataset("shapes", train=False, limit=24).images
    from tinydit.evaluate import inception_fid

    same = inception_fid(x, x, weights)
    other = inception_fid(x, blur(x, 3), weights)
    assert same == pytest.approx(0, abs=1e-2) and other > same
    with pytest.raises(TinyDiTError, match="--inception-weights .* does not exist"):
        inception_fid(x, x, tmp_path / "missing.pth")
    # Nothing cached and the download refused (a closed local port stands in for being offline).
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "hub"))
    monkeypatch.setattr("torch_fidelity.feature_extractor_inceptionv3.URL_INCEPTION_V3", "http://127.0.0.1:9/x.pth")
    with pytest.raises(TinyDiTError, match="could not be downloaded.*--inception-weights PATH"):
        inception_fid(x, x, None)
