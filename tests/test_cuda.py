"""The GPU path: bf16 autocast, fp16 with the gradient scaler (and its resume), torch.compile, DDP with
NCCL, and sampling on CUDA. Skipped where there is no CUDA device; ``scripts/gpu_check.sh`` runs them.

Each test checks a property, not that the code merely runs: the loss falls, a resumed fp16 run keeps
its scaler's state and ends where an uninterrupted one ends, a compiled model computes what the eager
one does, and a 1-rank NCCL run trains the weights a plain process trains.
"""

import os
import subprocess
import sys

import pytest
import torch
from conftest import fast_config

from tinydit import api
from tinydit.checkpoints.checkpoint import load_checkpoint
from tinydit.train import Trainer

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _losses(run) -> list[float]:
    import json

    return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_training_learns_on_cuda(tmp_path, precision):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    cfg = fast_config(tmp_path, device="cuda", precision=precision, compile="off", steps=60, log_every=10)
    Trainer(cfg, progress=False).fit()
    losses = _losses(tmp_path)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0], losses
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    assert all(v.dtype == torch.float32 for v in state.model.values() if v.is_floating_point())  # fp32 masters
    if precision == "fp16":
        assert state.grad_scaler["scale"] > 0  # the scaler's state travels with the checkpoint


def test_fp16_with_the_scaler_resumes_where_an_uninterrupted_run_ends(tmp_path):
    kw = dict(device="cuda", precision="fp16", compile="off")
    Trainer(fast_config(tmp_path / "ref", steps=20, **kw), progress=False).fit()
    Trainer(fast_config(tmp_path / "run", steps=8, **kw), progress=False).fit()
    mid = load_checkpoint(tmp_path / "run" / "checkpoint.pt").grad_scaler
    Trainer(fast_config(tmp_path / "run", steps=20, **kw), progress=False).fit()
    ref, run = (load_checkpoint(tmp_path / d / "checkpoint.pt") for d in ("ref", "run"))
    assert mid["scale"] > 0
    assert ref["grad_scaler"]["scale"] == run["grad_scaler"]["scale"]
    # CUDA kernels are not all deterministic (atomics in backward), so equal to float tolerance
    diff = max((ref["model"][k] - run["model"][k]).abs().max().item() for k in ref["model"])
    assert diff < 1e-3, diff


def test_compiled_forward_matches_eager_on_cuda(tmp_path, tiny_run):
    run, _ = tiny_run
    model, _ = api.load_model(run / "checkpoint.pt", device="cuda")
    x = torch.randn(8, 3, 32, 32, device="cuda")
    t = torch.rand(8, device="cuda")
    y = torch.arange(8, device="cuda") % 4
    with torch.no_grad():
        eager = model(x, t, y)
        compiled = torch.compile(model)(x, t, y)
    torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-4)
    cfg = fast_config(tmp_path, device="cuda", precision="bf16", compile="on", steps=30, log_every=10)
    Trainer(cfg, progress=False).fit()
    assert _losses(tmp_path)[-1] < _losses(tmp_path)[0]


def test_sampling_on_cuda_is_seeded_and_matches_the_cpu(tiny_run):
    run, _ = tiny_run
    kw = dict(n=8, sampler="heun", steps=4, cfg_scale=2.0, precision="fp32", compile="off")
    gpu = api.sample(run / "checkpoint.pt", device="cuda", **kw).x
    again = api.sample(run / "checkpoint.pt", device="cuda", **kw).x
    cpu = api.sample(run / "checkpoint.pt", device="cpu", **kw).x
    torch.testing.assert_close(gpu, again)
    torch.testing.assert_close(gpu, cpu, atol=1e-3, rtol=1e-3)  # the same noise: CPU and GPU round differently


def test_ddp_with_nccl_at_world_size_1_trains_what_one_process_trains(tmp_path):
    flags = (
        "--data shapes --preset dit-0.2m --batch-size 16 --limit 256 --val-size 32 --steps 12 --warmup "
        "2 --precision fp32 --compile off --device cuda --no-report --no-progress"
    ).split()
    env = {**os.environ, "TINYDIT_OFFLINE": "1"}
    plain = subprocess.run(
        [sys.executable, "-m", "tinydit", "train", *flags, "--out", str(tmp_path / "one")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert plain.returncode == 0, plain.stderr[-2000:]
    ddp = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=1",
            "-m",
            "tinydit",
            "--",
            "train",
            *flags,
            "--out",
            str(tmp_path / "ddp"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    a, b = (load_checkpoint(tmp_path / d / "checkpoint.pt").model for d in ("one", "ddp"))
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert diff < 1e-4, diff
