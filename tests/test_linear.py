import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tinydit.models.linear as linear_module
from tinydit.errors import TinyDiTError
from tinydit.models.dit import DiT, DiTConfig
from tinydit.models.linear import TokenLinear, linear_backend, onednn_is_faster, onednn_linear, resolve_backend
from tinydit.runtime import maybe_compile


def weights(d_in=12, d_out=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(d_out, d_in, generator=g), torch.randn(d_out, generator=g)


@pytest.fixture
def probe_says(monkeypatch):
    """Set the probe's answer (the real one depends on the machine running the tests)."""

    def set_answer(answer: bool) -> None:
        monkeypatch.setattr(linear_module, "_onednn_faster", answer)

    return set_answer


@pytest.mark.parametrize("shape", [(3, 7, 12), (5, 12), (12,), (2, 3, 4, 12)])
@pytest.mark.parametrize("bias", [True, False])
def test_onednn_linear_is_the_linear_map(shape, bias):
    w, b = weights()
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    out = onednn_linear(x, w, b if bias else None)
    want = x.double() @ w.double().T + (b.double() if bias else 0)
    assert out.shape == (*shape[:-1], 20)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


def test_onednn_linear_takes_non_contiguous_and_empty_inputs():
    w, b = weights()
    x = torch.randn(7, 3, 12).transpose(0, 1)  # (3, 7, 12), not contiguous
    torch.testing.assert_close(onednn_linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    assert onednn_linear(torch.randn(0, 4, 12), w, b).shape == (0, 4, 20)


def test_onednn_linear_has_the_gradients_of_f_linear():
    w0, b0 = weights(seed=2)
    x0 = torch.randn(4, 9, 12, generator=torch.Generator().manual_seed(3))
    upstream = torch.randn(4, 9, 20, generator=torch.Generator().manual_seed(4))
    grads = []
    for fn in (F.linear, onednn_linear):
        x, w, b = (t.clone().requires_grad_() for t in (x0, w0, b0))
        (fn(x, w, b) * upstream).sum().backward()
        grads.append((x.grad, w.grad, b.grad))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


def test_token_linear_is_an_nn_linear_with_its_state_dict():
    plain, token = nn.Linear(12, 20), TokenLinear(12, 20)
    assert isinstance(token, nn.Linear)
    token.load_state_dict(plain.state_dict())  # checkpoints from either load into the other
    assert token.state_dict().keys() == plain.state_dict().keys()
    x = torch.randn(2, 5, 12)
    for backend in ("blas", "onednn"):
        with linear_backend(backend):
            torch.testing.assert_close(token(x), plain(x), rtol=1e-5, atol=1e-5)


def test_auto_takes_onednn_only_for_fp32_on_a_cpu_where_the_probe_says_so(probe_says):
    x = torch.randn(2, 3, 4)
    probe_says(True)
    assert resolve_backend(x) == "onednn"
    assert resolve_backend(x.double()) == "blas"
    assert resolve_backend(x.bfloat16()) == "blas"
    with torch.autocast("cpu", dtype=torch.bfloat16):  # linear maps already run through oneDNN there
        assert resolve_backend(x) == "blas"
    assert resolve_backend(torch.empty(2, 3, 4, device="meta")) == "blas"  # not a CPU: cuBLAS on a GPU
    probe_says(False)
    assert resolve_backend(x) == "blas"


def test_a_forced_backend_wins_over_the_probe_and_is_restored(probe_says):
    probe_says(False)
    x = torch.randn(2, 3, 4)
    with linear_backend("onednn"):
        assert resolve_backend(x) == "onednn"
        with linear_backend("blas"):
            assert resolve_backend(x) == "blas"
        assert resolve_backend(x) == "onednn"
    assert resolve_backend(x) == "blas"
    with pytest.raises(TinyDiTError, match="blas"):
        with linear_backend("mkl"):
            pass


def test_the_probe_runs_once_and_leaves_the_global_rng_alone(monkeypatch):
    monkeypatch.setattr(linear_module, "_onednn_faster", None)
    calls = []
    real = linear_module._probe
    monkeypatch.setattr(linear_module, "_probe", lambda: calls.append(1) or real())
    state = torch.get_rng_state()
    answer = onednn_is_faster()
    assert isinstance(answer, bool)
    assert onednn_is_faster() is answer and len(calls) == 1
    assert torch.equal(torch.get_rng_state(), state)


def test_maybe_compile_asks_the_probe_before_compiling(monkeypatch):
    monkeypatch.setattr(linear_module, "_onednn_faster", None)
    monkeypatch.setattr(linear_module, "_probe", lambda: True)
    monkeypatch.setattr(torch, "compile", lambda model: model)  # compiling itself is not under test
    model = nn.Linear(2, 2)
    assert maybe_compile(model, False) is model and linear_module._onednn_faster is None  # eager: no probe
    maybe_compile(model, True)
    assert linear_module._onednn_faster is True


def tiny_dit(**kw) -> DiT:
    torch.manual_seed(0)
    model = DiT(
        DiTConfig(**{**dict(img_size=8, in_channels=3, patch_size=2, dim=32, depth=2, n_heads=2, n_classes=3), **kw})
    )
    for m in model.modules():  # away from the zero initialisation, so every layer matters
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.1)
    return model


@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
def test_the_model_computes_the_same_through_either_kernel(mlp):
    model = tiny_dit(mlp=mlp)
    x, t, y = torch.randn(4, 3, 8, 8), torch.rand(4), torch.tensor([0, 1, 2, 3])
    outs, grads = {}, {}
    for backend in ("blas", "onednn"):
        model.zero_grad()
        with linear_backend(backend):
            outs[backend] = model(x, t, y)
        outs[backend].square().mean().backward()
        grads[backend] = [p.grad.clone() for p in model.parameters()]
    torch.testing.assert_close(outs["blas"], outs["onednn"], rtol=1e-4, atol=1e-5)
    for a, b in zip(grads["blas"], grads["onednn"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mlp, maps_per_block", [("gelu", 4), ("swiglu", 5)])  # SwiGLU: gate and up apart
def test_the_models_token_linears_go_through_the_chosen_kernel(monkeypatch, probe_says, mlp, maps_per_block):
    model = tiny_dit(mlp=mlp)
    convs = []
    real = F.conv2d
    monkeypatch.setattr(F, "conv2d", lambda *a, **k: convs.append(a[1].shape[-1]) or real(*a, **k))
    x, t, y = torch.randn(2, 3, 8, 8), torch.rand(2), torch.tensor([0, 1])
    probe_says(True)
    model(x, t, y)
    one_by_one = [k for k in convs if k == 1]
    # QKV, projection, MLP per block; the patch embedding and the output layer
    assert len(one_by_one) == maps_per_block * model.config.depth + 2
    convs.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x, t, y)
    assert [k for k in convs if k == 1] == []
    probe_says(False)
    model(x, t, y)
    assert [k for k in convs if k == 1] == []


@pytest.fixture
def two_threads():
    """PyTorch sends a one-image convolution to oneDNN only with 2+ threads; a parallel worker has one."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")
def test_onednn_linear_at_a_size_that_reaches_onednn_matches_f_linear_forward_and_backward(two_threads):
    """Above 20,480 input values PyTorch runs the convolution through oneDNN (smaller ones through a
    generic kernel): this is the kernel that fp32 training on a CPU uses."""
    from torch.profiler import ProfilerActivity, profile

    w0, b0 = weights(d_in=128, d_out=96, seed=5)
    g = torch.Generator().manual_seed(6)
    x0, upstream = torch.randn(4, 64, 128, generator=g), torch.randn(4, 64, 96, generator=g)
    grads = []
    for fn in (F.linear, onednn_linear):
        x, w, b = (t.clone().requires_grad_() for t in (x0, w0, b0))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = fn(x, w, b)
            (out * upstream).sum().backward()
        grads.append((out.detach(), x.grad, w.grad, b.grad))
    assert "aten::mkldnn_convolution" in {e.key for e in prof.key_averages()}
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("bias", [True, False])
def test_the_compiled_code_operator_passes_torch_library_checks(bias):
    """Schema, fake (shape-only) implementation and autograd registration of tinydit::onednn_linear."""
    w, b = weights(d_in=128, d_out=96, seed=7)
    x = torch.randn(4, 64, 128, generator=torch.Generator().manual_seed(8), requires_grad=True)
    w.requires_grad_()
    args = (x, w, b.requires_grad_() if bias else None)
    torch.library.opcheck(linear_module._onednn_linear_op, args)


@pytest.mark.parametrize("needed", [[True, False, False], [False, True, True], [True, True, False]])
def test_the_operator_backward_computes_only_the_gradients_asked_for(monkeypatch, needed):
    w0, b0 = weights(d_in=128, d_out=96, seed=9)
    x0 = torch.randn(4, 64, 128, generator=torch.Generator().manual_seed(10))
    upstream = torch.randn(4, 64, 96, generator=torch.Generator().manual_seed(11))
    x, w, b = (t.clone().requires_grad_() for t in (x0, w0, b0))
    want = torch.autograd.grad((F.linear(x, w, b) * upstream).sum(), (x, w, b))
    got = linear_module._onednn_linear_backward_op(upstream, x0, w0, needed)
    for n, g, ref in zip(needed, got, want, strict=True):
        if n:
            torch.testing.assert_close(g, ref, rtol=1e-5, atol=1e-4)
        else:
            assert g.numel() == 0  # never computed
    torch.library.opcheck(linear_module._onednn_linear_backward_op, (upstream, x0, w0, needed))
    # through autograd: the backward asks for what autograd needs, and a gradient nobody needs stays None
    asked = []
    real = linear_module._onednn_linear_backward_op
    monkeypatch.setattr(linear_module, "_onednn_linear_backward_op", lambda *a: asked.append(a[-1]) or real(*a))
    x, w, b = (t.clone().requires_grad_(n) for t, n in zip((x0, w0, b0), needed, strict=True))
    (linear_module._onednn_linear_op(x, w, b) * upstream).sum().backward()
    assert asked == [needed]
    for t, n, ref in zip((x, w, b), needed, want, strict=True):
        if n:
            torch.testing.assert_close(t.grad, ref, rtol=1e-5, atol=1e-4)
        else:
            assert t.grad is None


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_compiled_models_run_the_operator_and_match_eager(monkeypatch, probe_says, precision):
    """Compiled code reaches the convolution through tinydit::onednn_linear (Inductor would otherwise
    lay its image out channels-first); values and gradients match the eager model."""
    calls = []
    real = linear_module._onednn_linear_op
    monkeypatch.setattr(linear_module, "_onednn_linear_op", lambda *a: calls.append(1) or real(*a))
    torch._dynamo.reset()
    model = tiny_dit(mlp="swiglu", depth=1)  # one block holds every kind of layer; compiling two costs more
    x, t, y = torch.randn(4, 3, 8, 8), torch.rand(4), torch.tensor([0, 1, 2, 3])
    results = []
    probe_says(True)
    for forward in (model, torch.compile(model)):
        model.zero_grad()
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
        with linear_backend("onednn"), ctx:
            out = forward(x, t, y)
        out.float().square().mean().backward()
        results.append((out.detach().float(), [p.grad.clone() for p in model.parameters()]))
    assert calls, "the compiled model never reached the operator"
    tol = dict(rtol=1e-4, atol=1e-5) if precision == "fp32" else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(results[0][0], results[1][0], **tol)
    for a, b in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(a, b, **tol)
