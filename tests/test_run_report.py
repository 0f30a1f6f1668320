"""Seeing a run: evaluation during training and best.pt, TensorBoard, the HTML report (opened in a real
headless browser), and progress that reads well in a log file."""

import base64
import io
import json
import re
import subprocess
import sys

import pytest
import torch
from conftest import CHROMIUM, NEEDS_CHROMIUM, chromium, fast_config
from PIL import Image

from tinydit.checkpoints.checkpoint import load_checkpoint, load_model
from tinydit.cli import main
from tinydit.errors import TinyDiTError
from tinydit.progress import Progress
from tinydit.train import Trainer

EVAL = dict(eval_every=4, eval_n=20)  # 20 samples: a noisy score, but a real one, in a second


def _records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def evaluated_run(tmp_path_factory):
    """One 8-step shapes run evaluated every 4 steps, with TensorBoard and the report."""
    out = tmp_path_factory.mktemp("evaluated")
    # best.pt chosen by the FID (lower is better); shapes class runs choose by the strict judge unless told
    cfg = fast_config(out, steps=8, sample_every=4, tensorboard=True, report=True, best_metric="fid_shapes_cnn", **EVAL)
    trainer = Trainer(cfg, progress=False)
    trainer.fit()
    return out, trainer


def test_evaluation_logs_the_offline_metrics_and_keeps_the_best_checkpoint(evaluated_run):
    out, _ = evaluated_run
    evals = [r for r in _records(out) if "eval/fid_shapes_cnn" in r]
    assert [r["step"] for r in evals] == [4, 8]
    for r in evals:
        assert r["best_metric"] == "fid_shapes_cnn" and r["eval/n_samples"] == 20 and r["eval_seconds"] > 0
        assert 0.0 <= r["eval/shape_accuracy"] <= 1.0 and 0.0 <= r["eval/class_consistency_shapes_cnn"] <= 1.0
        assert 0.0 <= r["eval/shape_strict"] <= 1.0 and 0.0 <= r["eval/shape_colours"] <= 1.0
        # the recorded guidance is not 1: the same noise is scored at guidance 1 beside it
        assert 0.0 <= r["eval/guidance_1/shape_strict"] <= 1.0
        assert r["eval/guidance_1/fid_shapes_cnn"] != r["eval/fid_shapes_cnn"]
        # the independent judge reads final checkpoints (tinydit eval), not every evaluation during training
        assert not any("shapes_judge" in k for k in r), sorted(r)
    best = min(evals, key=lambda r: r["eval/fid_shapes_cnn"])
    state = load_checkpoint(out / "best.pt")
    assert state.step == best["step"] and state.best["value"] == best["eval/fid_shapes_cnn"]
    assert load_checkpoint(out / "checkpoint.pt").best == state.best  # a continuation knows the best so far
    load_model(out / "best.pt")  # an ordinary checkpoint


def test_evaluation_does_not_change_what_the_run_trains(tmp_path, evaluated_run):
    _, evaluated = evaluated_run
    plain = Trainer(fast_config(tmp_path, steps=8, sample_every=4), progress=False)
    plain.fit()
    plain_weights, evaluated_weights = plain.run.model.state_dict(), evaluated.run.model.state_dict()
    for (name, a), b in zip(plain_weights.items(), evaluated_weights.values(), strict=True):
        assert torch.equal(a, b), name


def test_tensorboard_holds_the_losses_evaluations_and_sample_grids(evaluated_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = evaluated_run
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0, "images": 0}).Reload()
    tags = events.Tags()
    # loss_by_t/5, a middle bin of t: every window has times there (noise-ward times seldom fall in bin 0)
    wanted = {"loss", "lr", "val_loss_ema_even_t", "val_loss_ema_train_t", "eval/fid_shapes_cnn", "loss_by_t/5"}
    assert wanted <= set(tags["scalars"])
    assert [e.step for e in events.Scalars("eval/fid_shapes_cnn")] == [4, 8]
    fids = {r["step"]: r["eval/fid_shapes_cnn"] for r in _records(out) if "eval/fid_shapes_cnn" in r}
    assert [e.value for e in events.Scalars("eval/fid_shapes_cnn")] == pytest.approx([fids[4], fids[8]])
    assert [e.step for e in events.Images("samples")] == [4, 8]


def test_tensorboard_missing_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if the package were not installed
    with pytest.raises(TinyDiTError, match=r"pip install 'tinydit\[tensorboard\]'"):
        Trainer(fast_config(tmp_path, steps=1, tensorboard=True), progress=False)


def test_evaluation_needs_an_offline_feature_network(tmp_path):
    folder = tmp_path / "imgs" / "a"
    folder.mkdir(parents=True)
    for i in range(3):
        Image.new("RGB", (8, 8), (i * 80, 0, 0)).save(folder / f"{i}.png")
    with pytest.raises(TinyDiTError, match="`eval_every` scores samples with an offline feature network"):
        Trainer(fast_config(tmp_path / "run", data=str(tmp_path / "imgs"), steps=1, **EVAL), progress=False)


def _images(page: str) -> list[bytes]:
    uris = re.findall(r'<img [^>]*src="([^"]+)"', page)
    assert all(u.startswith("data:image/png;base64,") for u in uris)  # self-contained: nothing to fetch
    return [base64.b64decode(u.split(",", 1)[1]) for u in uris]


def test_shapes_class_runs_keep_the_best_by_the_strict_judge():
    from tinydit.eval.evaluate import default_best_metric

    assert default_best_metric("shapes", text=False) == ("shape_strict", False)  # higher is better
    assert default_best_metric("shapes", text=True) == ("adherence_all_all", False)
    assert default_best_metric("fashion-mnist", text=False) == ("fid_fmnist_cnn", True)


def test_the_report_is_one_self_contained_page(evaluated_run):
    out, _ = evaluated_run
    page = (out / "report.html").read_text()
    pngs = _images(page)
    assert len(pngs) >= 6  # final grid, loss, loss by t, evaluations, and the grids of steps 4 and 8
    for png in pngs:
        assert Image.open(io.BytesIO(png)).size[0] > 0
    assert "http://" not in page and "https://" not in page and "<script" not in page
    # the evaluations' protocol beside them, and why the two validation losses differ beside the loss
    assert "Protocol: shapes_cnn features; reference shapes test" in page and "; 20 samples; " in page
    assert "they differ in their times only" in page and "is not overfitting" in page
    for text in (
        "Samples at the end",
        "Loss by t",
        "Evaluation during training",
        "Samples over training",
        "best.pt",
        "fid_shapes_cnn",
        "dit-0.2m",
        "step 4",
        "step 8",
    ):
        assert text in page, text


# Put into a copy of the page, first thing in <head>: records every error (script errors, and images
# that fail to load, caught in the capture phase) and, once the page has loaded, whether every image did.
CHECKER = """<script>
window.__errors = [];
window.addEventListener("error",
  e => window.__errors.push(e.message || ("failed: " + (e.target.src || "").slice(0, 40))), true);
const consoleError = console.error;
console.error = (...a) => { window.__errors.push(a.join(" ")); consoleError(...a); };
window.addEventListener("load", () => {
  const imgs = [...document.images];
  document.body.dataset.images = imgs.length;
  document.body.dataset.loaded = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.errors = JSON.stringify(window.__errors);
});
</script>"""


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason=NEEDS_CHROMIUM)
def test_the_report_renders_in_a_headless_browser_with_every_image_loaded(evaluated_run, tmp_path):
    out, _ = evaluated_run
    page = (out / "report.html").read_text().replace("<head>", "<head>" + CHECKER, 1)
    checked = tmp_path / "checked.html"
    checked.write_text(page)
    res = subprocess.run(
        chromium(tmp_path / "profile", "--virtual-time-budget=5000", "--dump-dom", checked.as_uri()),
        capture_output=True,
        text=True,
        timeout=120,
    )
    body = re.search(r"<body([^>]*)>", res.stdout)
    assert body, res.stderr[-2000:]
    attrs = dict(re.findall(r'data-(\w+)="([^"]*)"', body.group(1)))
    assert int(attrs["images"]) >= 6 and attrs["loaded"] == attrs["images"], attrs
    assert json.loads(attrs["errors"].replace("&quot;", '"')) == []


def test_report_command_and_a_directory_that_is_no_run(evaluated_run, tmp_path, capsys):
    out, _ = evaluated_run
    (out / "report.html").unlink()
    assert main(["report", out]) == 0 and (out / "report.html").is_file()
    assert main(["report", tmp_path]) == 2
    assert "holds no training run (no config.json)" in capsys.readouterr().err


def test_progress_off_a_terminal_is_a_line_every_few_seconds(monkeypatch):
    """A fake clock: 1,000 updates 1/8 s apart are 125 s, so a line every 15 s is 8 lines, and one at the end."""
    import tinydit.progress as progress_module

    now = [0.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    stream = io.StringIO()  # not a terminal
    bar = Progress(1000, "train", enabled=True, stream=stream)
    for _ in range(1000):
        now[0] += 0.125
        bar.set(loss="0.1234")
        bar.update()
    bar.close()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue() and len(lines) == 9
    assert lines[-1] == "train: step 1000/1000 (100%), loss 0.1234, 00:02:05 elapsed, 00:00:00 left"
    assert lines[0] == "train: step 120/1000 (12%), loss 0.1234, 00:00:15 elapsed, 00:01:50 left"  # 880 at 8/s


def test_a_training_log_written_to_a_file_has_no_bar_redraws(tmp_path, capsys):
    Trainer(fast_config(tmp_path, steps=6), progress=True).fit()
    err = capsys.readouterr().err
    assert "\r" not in err and "train: step 6/6 (100%)" in err
