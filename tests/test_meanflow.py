"""Mean flows: the Jacobian-vector product, the target and loss, one-step sampling, and a whole run through the
CLI (resume, refusals)."""

import json

import pytest
import torch
from conftest import fast_config, sample_with

from tinydit.checkpoints.checkpoint import load_checkpoint, load_model
from tinydit.cli import main
from tinydit.config import TrainConfig
from tinydit.errors import TinyDiTError
from tinydit.flow.meanflow import (
    ADAPTIVE_C,
    TIME_SCALE,
    FoldedGuidance,
    check_jvp,
    draw_interval,
    jvp_du_dt,
    meanflow_loss,
    meanflow_target,
)
from tinydit.flow.path import flow_loss
from tinydit.models.dit import DiT, DiTConfig
from tinydit.train import Trainer

CFG = DiTConfig(dim=32, depth=2, n_heads=2, shortcut=True)


def _moved(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Off adaLN-Zero's zero init, where every derivative would be zero."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.data.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


@pytest.mark.parametrize("pred", ["v", "x"])
def test_the_jvp_is_the_derivative_along_the_flow(pred):
    """du/dt along (dz, dr, dt) = (v, 0, 1) against a central difference of the same network, in float64."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        model = _moved(DiT(DiTConfig(dim=32, depth=2, n_heads=2, shortcut=True, pred=pred)))
        z, v = torch.randn(3, 3, 32, 32), torch.randn(3, 3, 32, 32)
        t = torch.tensor([0.9, 0.6, 0.3])
        r = torch.tensor([0.1, 0.5, 0.0])
        y = torch.tensor([0, 3, 7])
        u, du_dt = jvp_du_dt(model, z, r, t, y, v)
        with torch.no_grad():
            torch.testing.assert_close(u, model(z, t, y, t - r))  # the primal is the model's own output
            eps = 1e-7  # the time embedding turns fast (1000 t): a wider step would not be the derivative
            ahead = model(z + eps * v, t + eps, y, t + eps - r)
            behind = model(z - eps * v, t - eps, y, t - eps - r)
        finite = (ahead - behind) / (2 * eps)
        assert du_dt.abs().max() > 1e-2  # a real derivative, not a zero that would also match
        torch.testing.assert_close(du_dt, finite, rtol=1e-4, atol=1e-6)
    finally:
        torch.set_default_dtype(previous)


def test_where_every_r_is_t_the_loss_is_flow_matching():
    torch.manual_seed(0)
    model = _moved(DiT(CFG))
    x0, noise = torch.randn(6, 3, 32, 32), torch.randn(6, 3, 32, 32)
    t, y = torch.rand(6), torch.randint(0, 10, (6,))
    weighted, error = meanflow_loss(model, model, x0, y, t, t, noise)
    torch.testing.assert_close(error, flow_loss(model, x0, y, t, noise, reduce=False))
    torch.testing.assert_close(weighted, error / (error + 1e-3))  # the adaptive weight, detached
    weighted.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_the_target_subtracts_the_interval_times_the_derivative_and_folds_guidance():
    torch.manual_seed(0)
    model = _moved(DiT(CFG))
    z, v = torch.randn(4, 3, 32, 32), torch.randn(4, 3, 32, 32)
    t = torch.tensor([0.8, 0.8, 0.5, 0.5])
    r = torch.tensor([0.8, 0.2, 0.5, 0.1])  # rows 0 and 2: r = t
    y = torch.tensor([1, 2, 3, 10])  # row 3: the null label (dropped)
    target = meanflow_target(model, z, r, t, y, v)
    assert torch.equal(target[[0, 2]], v[[0, 2]])
    _, du_dt = jvp_du_dt(model, z[[1, 3]], r[[1, 3]], t[[1, 3]], y[[1, 3]], v[[1, 3]])
    torch.testing.assert_close(target[[1, 3]], v[[1, 3]] - (t - r)[[1, 3]].view(-1, 1, 1, 1) * du_dt)
    guided = torch.tensor([True, True, True, False])
    null = torch.full_like(y, 10)
    folded = meanflow_target(model, z, r, t, y, v, FoldedGuidance(3.0, guided, null))
    with torch.no_grad():
        v_null = model(z, t, null, torch.zeros(4))
    torch.testing.assert_close(folded[[0, 2]], (3 * v + (1 - 3) * v_null)[[0, 2]])
    assert not torch.allclose(folded[1], target[1])
    torch.testing.assert_close(folded[3], target[3])  # a dropped label learns the unguided field


def test_the_predicted_tangent_follows_the_models_own_instantaneous_velocity():
    torch.manual_seed(0)
    model = _moved(DiT(CFG))
    z, v = torch.randn(2, 3, 32, 32), torch.randn(2, 3, 32, 32)
    t, r, y = torch.tensor([0.8, 0.5]), torch.tensor([0.2, 0.5]), torch.tensor([1, 2])
    target = meanflow_target(model, z, r, t, y, v, tangent="predicted")
    with torch.no_grad():
        along = model(z[:1], t[:1], y[:1], torch.zeros(1))  # u(z, t, t | y)
    _, du_dt = jvp_du_dt(model, z[:1], r[:1], t[:1], y[:1], along)
    torch.testing.assert_close(target[:1], v[:1] - 0.6 * du_dt)
    assert torch.equal(target[1], v[1]) and not torch.allclose(target[0], meanflow_target(model, z, r, t, y, v)[0])
    with pytest.raises(Exception, match="unknown mean-flow tangent 'noise'"):
        meanflow_target(model, z, r, t, y, v, tangent="noise")


def test_intervals_take_the_two_times_in_order_for_a_share_of_the_batch():
    g = torch.Generator().manual_seed(0)
    t, s = torch.rand(4000, generator=g), torch.rand(4000, generator=g)
    r, t2 = draw_interval(t, s, torch.Generator().manual_seed(1), share=0.25)
    interval = r < t2
    assert 0.22 < interval.float().mean() < 0.28
    assert torch.equal(t2[interval], torch.maximum(t, s)[interval])
    assert torch.equal(r[interval], torch.minimum(t, s)[interval])
    assert torch.equal(r[~interval], t[~interval]) and torch.equal(t2[~interval], t[~interval])


def test_one_step_sampling_is_one_evaluation_and_deterministic():
    model = _moved(DiT(CFG)).eval()
    noise, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    for steps in (1, 2, 4):
        a = sample_with("euler", model, noise, y, steps=steps, cfg_scale=1.0)
        b = sample_with("euler", model, noise, y, steps=steps, cfg_scale=1.0)
        assert a.nfe == steps and a.x.shape == (4, 3, 32, 32) and torch.equal(a.x, b.x)
    with torch.no_grad():  # one step from noise: z_0 = z_1 - u(z_1, 0, 1)
        one = noise - model(noise, torch.ones(4), y, torch.ones(4))
    torch.testing.assert_close(sample_with("euler", model, noise, y, steps=1, cfg_scale=1.0).x, one)


def test_the_time_embedding_scale_is_positive_and_slows_the_derivative_in_t():
    with pytest.raises(Exception, match="time_scale"):
        DiTConfig(time_scale=0.0)
    z, v, y = torch.randn(2, 3, 32, 32), torch.zeros(2, 3, 32, 32), torch.tensor([1, 2])
    t, r = torch.tensor([0.9, 0.7]), torch.tensor([0.2, 0.1])
    size = {}
    for scale in (1000.0, 1.0):  # the same weights; dz = 0, so du/dt is the network's own derivative in t
        torch.manual_seed(0)
        model = _moved(DiT(DiTConfig(dim=32, depth=2, n_heads=2, shortcut=True, time_scale=scale)))
        size[scale] = jvp_du_dt(model, z, r, t, y, v)[1].abs().mean().item()
    assert size[1.0] < size[1000.0] / 10


def test_a_model_without_the_interval_is_refused():
    with pytest.raises(Exception, match="shortcut"):
        check_jvp(DiT(DiTConfig(dim=32, depth=1, n_heads=2)), torch.device("cpu"))


KW = dict(steps=6, batch_size=8, limit=24, objective="meanflow")


@pytest.fixture(scope="module")
def meanflow_run(tmp_path_factory):
    """A 6-step mean-flow run (the trainer, its directory)."""
    out = tmp_path_factory.mktemp("meanflow") / "run"
    trainer = Trainer(fast_config(out, **KW), progress=False)
    trainer.fit()
    return trainer, out


def test_a_meanflow_run_resumes_exactly_and_samples_in_one_step_by_default(meanflow_run, tmp_path, capsys):
    straight, run = meanflow_run
    Trainer(fast_config(tmp_path / "b", **{**KW, "steps": 3}), progress=False).fit()
    resumed = Trainer(fast_config(tmp_path / "b", **KW), progress=False)
    resumed.fit()
    for k, v in straight.run.model.state_dict().items():
        assert torch.equal(v, resumed.run.model.state_dict()[k]), k
    state = load_checkpoint(run / "checkpoint.pt")
    assert state.objective == "meanflow" and state.train().meanflow_cfg == 2.0
    assert {k: state.sampling[k] for k in ("sampler", "steps", "cfg_scale")} == dict(
        sampler="euler", steps=1, cfg_scale=1.0
    )
    model, _ = load_model(run / "checkpoint.pt")
    assert model.config.shortcut and model.config.time_scale == TIME_SCALE and model.t_embed.scale == TIME_SCALE
    capsys.readouterr()
    out = tmp_path / "one.png"
    assert main(["sample", "--checkpoint", str(run), "--n", "4", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "1 model evaluations per image" in err and out.exists()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in metrics if "loss" in m]
    assert losses and all(0 < v < 10 for v in losses)  # flow matching's squared error, not the adaptive ~1


def test_a_meanflow_run_can_align_its_trained_forward_to_the_encoder(tmp_path):
    """The JVP's forward runs first and the trained forward last, so the tokens the alignment reads are the
    trained forward's: the loss is finite and the projector learns."""
    trainer = Trainer(fast_config(tmp_path, **{**KW, "repa": 0.5}), progress=False)
    before = [p.detach().clone() for p in trainer.run.alignment.projector.parameters()]
    trainer.fit()
    after = list(trainer.run.alignment.projector.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    aligned = [m["repa_loss"] for m in metrics if "repa_loss" in m]
    assert aligned and all(-1 <= v <= 1 for v in aligned)  # a negative cosine similarity
    assert load_checkpoint(tmp_path / "checkpoint.pt").repa_projector is not None


def test_a_one_step_model_samples_the_same_in_onnx(meanflow_run, tmp_path):
    pytest.importorskip("onnxruntime", reason="the export extra: pip install 'tinydit[export]'")
    from tinydit.export import export
    from tinydit.export.ort_sampler import OnnxSampler, to_uint8
    from tinydit.flow.generate import generate
    from tinydit.flow.settings import SamplingSettings
    from tinydit.images import to_uint8 as torch_to_uint8

    ckpt = meanflow_run[1] / "checkpoint.pt"
    model, _ = load_model(ckpt)
    onnx = OnnxSampler(str(export(ckpt, "onnx", tmp_path / "m.onnx")))
    settings = onnx.meta["sampler"]
    assert (settings["sampler"], settings["steps"], settings["cfg_scale"]) == ("euler", 1, 1.0)
    y = torch.arange(8) % model.config.n_classes
    ref = generate(model, y, SamplingSettings.from_json(settings), seed=3).x
    noise = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    x = onnx.sample(noise.numpy(), y.numpy(), steps=1, cfg_scale=1.0, sampler="euler")
    assert abs(to_uint8(x).astype(int) - torch_to_uint8(ref).numpy().astype(int)).max() <= 1


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--objective", "shortcut", "--repa", "0.5"], "repa"),
        (["--meanflow-cfg", "2"], "--meanflow-cfg"),
        (["--objective", "meanflow", "--meanflow-cfg", "0.5"], "--meanflow-cfg"),
        (["--objective", "meanflow", "--teacher", "x.pt"], "teacher"),
    ],
)
def test_combinations_that_make_no_sense_are_one_error_line(tmp_path, capsys, flags, says):
    out = tmp_path / "run"
    code = main(["train", "--data", "shapes", "--preset", "dit-0.2m", "--steps", "2", "--out", str(out), *flags])
    err = capsys.readouterr().err
    assert code == 2 and says in err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1 and not out.exists()


def test_the_derivative_script_measures_a_mean_flow_checkpoint(meanflow_run):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "meanflow_derivative.py"
    ckpt = meanflow_run[1] / "checkpoint.pt"
    out = subprocess.run(
        [sys.executable, str(script), "--checkpoint", str(ckpt), "--n", "8"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| 0") or line.startswith("| 0.4")]
    assert len(rows) == 3 and f"time_scale {TIME_SCALE:g}" in out.stdout
    assert all(float(cell) >= 0 for row in rows for cell in row.strip("| ").split(" | "))


def test_a_checkpoint_written_with_few_step_meanflow_continues_as_a_mean_flow_run(meanflow_run, tmp_path):
    """A run stored by a release that named the objective `few_step` (and had no `finest_step`) is read
    through the checkpoint's upgrade and continues exactly as the mean-flow run it was."""
    straight, _ = meanflow_run
    out = tmp_path / "old"
    Trainer(fast_config(out, **{**KW, "steps": 3}), progress=False).fit()
    path = out / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    train = dict(state["train_config"])
    state["train_config"] = {**{k: v for k, v in train.items() if k != "objective"}, "few_step": train["objective"]}
    state["model_config"] = {k: v for k, v in state["model_config"].items() if k != "finest_step"}
    torch.save(state, path)
    assert "objective" not in torch.load(path, weights_only=True)["train_config"]
    assert load_checkpoint(path).objective == "meanflow"
    with pytest.raises(Exception, match="objective: 'meanflow' -> 'flow'"):
        Trainer(fast_config(out, **{**KW, "objective": "flow", "meanflow_cfg": None}), progress=False)
    resumed = Trainer(fast_config(out, **KW), progress=False)
    resumed.fit()
    for k, v in straight.run.model.state_dict().items():
        assert torch.equal(v, resumed.run.model.state_dict()[k]), k
    assert load_checkpoint(path).train_config["objective"] == "meanflow"  # written back under its name
    with pytest.raises(TinyDiTError, match="few_step is `objective`"):  # never dropped unread
        TrainConfig.from_dict(state["train_config"])


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--few-step", "meanflow", "--meanflow-cfg", "0.5"], "--meanflow-cfg"),
        (["--few-step", "none", "--meanflow-cfg", "2"], "--meanflow-cfg is only used with --objective meanflow"),
    ],
)
def test_the_old_flag_still_works_and_says_once_what_to_use(tmp_path, capsys, flags, says):
    code = main(["train", "--data", "shapes", "--preset", "dit-0.2m", "--steps", "2", "--out", str(tmp_path), *flags])
    err = capsys.readouterr().err
    objective = "meanflow" if "meanflow" in flags else "flow"
    assert err.count("--few-step") == 1 and f"--few-step is deprecated: use --objective {objective}" in err
    assert code == 2 and says in err


def test_the_adaptive_weight_is_the_paper_codes_summed_form_with_c_times_the_pixels():
    """The loss's error is a per-pixel mean: its weight 1 / (error + c) gives the same loss as the official
    code's summed error with c C H W (p = 1), not with c itself: told apart at errors of the size of c."""

    class Off(torch.nn.Module):  # at r = t the target is noise - x0 = noise (x0 = 0): predict it, off by 0.03
        def forward(self, z, t, y, d):
            return z / t.view(-1, 1, 1, 1) + 0.03

    noise, t = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0)), torch.full((4,), 0.5)
    weighted, error = meanflow_loss(Off(), Off(), torch.zeros_like(noise), torch.zeros(4), t, t, noise)
    torch.testing.assert_close(error, torch.full((4,), 0.03**2))
    pixels = 3 * 32 * 32
    summed = error * pixels  # (N,): the squared error summed over the pixels, as the official code has it
    torch.testing.assert_close(weighted, summed / (summed + ADAPTIVE_C * pixels))
    assert not torch.allclose(weighted, summed / (summed + ADAPTIVE_C), rtol=0.1)
