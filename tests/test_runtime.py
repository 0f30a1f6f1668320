"""Precision and compilation: what each mode promises, checked on the CPU."""

import os
import subprocess
import sys

import pytest
import torch
from conftest import fast_config, sample_with

from tinydit.checkpoints.checkpoint import load_checkpoint, load_model
from tinydit.compiling import unwrap
from tinydit.errors import TinyDiTError
from tinydit.models.dit import DiTConfig
from tinydit.runtime import autocast, maybe_compile, resolve_compile, resolve_precision
from tinydit.train import Trainer

CPU = torch.device("cpu")


def test_auto_picks_bf16_only_where_a_bf16_matmul_is_measured_faster_and_fp16_needs_cuda(monkeypatch):
    import tinydit.runtime as runtime

    for faster, expected in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(runtime, "cpu_bf16_is_faster", lambda faster=faster: faster)
        assert resolve_precision("auto", CPU) == expected
    monkeypatch.undo()
    runtime.cpu_bf16_is_faster.cache_clear()
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: False)
    assert runtime.cpu_bf16_is_faster() is False  # emulated bf16 is never probed, never chosen
    runtime.cpu_bf16_is_faster.cache_clear()
    assert resolve_precision("auto", torch.device("mps")) == "fp32"
    assert resolve_compile("auto", CPU) is False
    assert resolve_compile("on", CPU) is True
    with pytest.raises(TinyDiTError, match="fp16 needs a CUDA device"):
        resolve_precision("fp16", CPU)


def test_auto_takes_bf16_on_a_gpu_only_where_it_is_native_not_emulated(monkeypatch):
    """A T4 (a free hosted notebook's GPU) emulates bf16, which torch.cuda.is_bf16_supported() counts."""
    asked = []

    def is_bf16_supported(including_emulation=True):
        asked.append(including_emulation)
        return including_emulation  # an emulating GPU: supported only when emulation counts

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    assert resolve_precision("auto", torch.device("cuda")) == "fp32" and asked == [False]
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert resolve_precision("auto", torch.device("cuda")) == "bf16"


def test_auto_compiles_a_cpu_run_only_for_a_long_enough_budget_and_with_a_compiler(monkeypatch):
    import tinydit.runtime as runtime

    long, short = runtime.COMPILE_CPU_MINUTES, runtime.COMPILE_CPU_MINUTES - 0.5
    monkeypatch.setattr(runtime, "has_cxx_compiler", lambda: True)
    assert resolve_compile("auto", CPU, long) is True
    assert resolve_compile("auto", CPU, short) is False
    assert resolve_compile("auto", CPU, None) is False  # a `steps` run, or sampling: no budget to win it back
    assert resolve_compile("off", CPU, long) is False
    assert resolve_compile("auto", torch.device("mps"), long) is False
    monkeypatch.setattr(runtime, "has_cxx_compiler", lambda: False)
    assert resolve_compile("auto", CPU, long) is False  # Inductor would fail at the first step
    monkeypatch.undo()
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    assert runtime.has_cxx_compiler() is False  # $CXX names the one compiler Inductor will call
    with pytest.raises(TinyDiTError, match="fp16 needs a CUDA device"):
        Trainer(fast_config("unused", precision="fp16", device="cpu"), progress=False)


def test_bf16_autocast_trains_with_fp32_master_weights_and_ema(tmp_path):
    trainer = Trainer(fast_config(tmp_path, steps=2, batch_size=4, precision="bf16"), progress=False)
    assert trainer.precision == "bf16"
    seen = []  # the network's own output (the clean image for x-prediction) really comes out in bf16
    hook = trainer.run.model.final.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    with autocast(CPU, "bf16"):
        trainer.run.forward(torch.randn(2, 3, 32, 32), torch.rand(2), torch.tensor([0, 1]))
    hook.remove()
    assert seen == [torch.bfloat16]
    result = trainer.fit()
    assert result.val_loss is not None and torch.isfinite(torch.tensor(result.val_loss))
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    for key in ("model", "ema"):
        assert {t.dtype for t in getattr(state, key).values()} == {torch.float32}, key
    assert {p.dtype for p in trainer.run.opt.state_dict()["state"][0].values() if p.numel() > 1} == {torch.float32}


def test_compiled_training_saves_plain_weights_that_load_into_either_module(tmp_path):
    torch._dynamo.reset()
    trainer = Trainer(fast_config(tmp_path, steps=2, batch_size=4, sample_steps=1, compile="on"), progress=False)
    # the trainer really runs compiled blocks (regional compilation, in place); a CPU run samples eagerly
    assert all(block._compiled_call_impl is not None for block in trainer.run.model.blocks)
    assert trainer.run.ema_forward is trainer.run.ema
    trainer.fit()
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    assert list(state.model) == list(unwrap(trainer.run.model).state_dict())
    assert not any(k.startswith("_orig_mod") for k in state.model)  # saved as the plain module's names

    model, _ = load_model(tmp_path / "checkpoint.pt")  # the EMA, into a plain module
    other, _ = load_model(tmp_path / "checkpoint.pt")
    compiled = maybe_compile(other, True)  # the same plain state dict, in a model compiled by region
    assert compiled is other and all(block._compiled_call_impl is not None for block in other.blocks)
    noise, y = torch.randn(32, 3, 32, 32), torch.arange(32) % 4
    eager = sample_with("euler", model, noise, y, steps=1, cfg_scale=2.0).x
    compiled_x = sample_with("euler", compiled, noise, y, steps=1, cfg_scale=2.0).x
    torch.testing.assert_close(compiled_x, eager, rtol=1e-4, atol=1e-4)


def test_precision_and_compile_do_not_change_the_run_identity(tmp_path):
    """A run may continue on another device or in another mode; only the architecture is pinned."""
    Trainer(fast_config(tmp_path, steps=1), progress=False).fit()
    trainer = Trainer(fast_config(tmp_path, steps=2, precision="bf16"), progress=False)
    assert trainer.run.step == 1
    trainer.close()  # a trainer holds its run directory until it trains or lets go
    with pytest.raises(TinyDiTError, match="qk_norm: None -> True"):
        Trainer(fast_config(tmp_path, steps=2, qk_norm=True), progress=False)


def test_architecture_switches_reach_the_model(tmp_path):
    trainer = Trainer(
        fast_config(tmp_path, steps=1, norm="rmsnorm", qk_norm=True, mlp="swiglu", pos="rope"), progress=False
    )
    cfg = trainer.model_config
    assert (cfg.norm, cfg.qk_norm, cfg.mlp, cfg.pos) == ("rmsnorm", True, "swiglu", "rope")
    trainer.fit()
    model, _ = load_model(tmp_path / "checkpoint.pt")
    assert model.config == cfg and isinstance(model.config, DiTConfig)


MPS_FALLBACK = "PYTORCH_ENABLE_MPS_FALLBACK"
# A fresh Python that reports the variable as torch starts to load (a finder sees the import before it
# happens) and after importing tinydit.
WATCH_TORCH = """
import os
import sys


class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            print("as torch loads:", os.environ.get("PYTORCH_ENABLE_MPS_FALLBACK"))
            sys.meta_path.remove(self)


sys.meta_path.insert(0, Watch())
import tinydit
print("after:", os.environ.get("PYTORCH_ENABLE_MPS_FALLBACK"))
"""


@pytest.mark.parametrize("given, kept", [(None, "1"), ("0", "0")])
def test_importing_tinydit_turns_the_mps_fallback_on_before_torch_loads_unless_the_user_set_it(given, kept):
    env = {k: v for k, v in os.environ.items() if k != MPS_FALLBACK} | ({MPS_FALLBACK: given} if given else {})
    done = subprocess.run([sys.executable, "-c", WATCH_TORCH], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"as torch loads: {kept}", f"after: {kept}"]
