import math

import pytest
import torch
import torch.nn.functional as F

import tinydit.models.attention as attention_module
from tinydit.errors import TinyDiTError
from tinydit.models.attention import BACKENDS, attention, attention_backend, matmul_attention, resolve_backend
from tinydit.models.dit import Attention, DiT, DiTConfig


def reference(q, k, v, mask=None):
    """softmax(q k^T / sqrt(Dh)) v in float64, one query at a time, straight from the definition."""
    q, k, v = q.double(), k.double(), v.double()
    n, h, tq, tk = *q.shape[:3], k.shape[2]
    mask = torch.ones(n, h, tq, tk, dtype=torch.bool) if mask is None else mask.expand(n, h, tq, tk)
    out = torch.empty_like(q)
    for i in range(tq):
        logits = (k * q[:, :, i : i + 1]).sum(-1) / math.sqrt(q.shape[-1])  # (N, h, Tk)
        logits = logits.masked_fill(~mask[:, :, i], float("-inf"))
        weights = logits.exp() / logits.exp().sum(-1, keepdim=True)
        out[:, :, i] = (weights.unsqueeze(-1) * v).sum(2)
    return out


def qkv(n=3, h=2, tq=7, tk=9, dh=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, h, t, dh, generator=g).to(dtype) for t in (tq, tk, tk)]


def key_padding(n=3, tk=9):
    """Image i may attend to its first tk - 3 i keys: (N, 1, 1, Tk)."""
    return (torch.arange(tk) < torch.tensor([tk - 3 * i for i in range(n)]).unsqueeze(1))[:, None, None, :]


@pytest.mark.parametrize("backend", ["sdpa", "matmul"])
@pytest.mark.parametrize("masked", [False, True])
def test_each_backend_matches_the_definition(backend, masked):
    q, k, v = qkv()
    mask = key_padding() if masked else None
    with attention_backend(backend):
        out = attention(q, k, v, mask)
    torch.testing.assert_close(out.double(), reference(q, k, v, mask), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("masked", [False, True])
def test_the_backends_agree_on_gradients(masked):
    mask = key_padding() if masked else None
    grads = {}
    for backend in ("sdpa", "matmul"):
        q, k, v = (x.requires_grad_() for x in qkv(seed=1))
        with attention_backend(backend):
            (attention(q, k, v, mask) * torch.linspace(-1, 1, 8)).sum().backward()
        grads[backend] = (q.grad, k.grad, v.grad)
    for a, b in zip(grads["sdpa"], grads["matmul"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    if masked:  # a masked key gets no gradient at all, from either kernel
        for backend in ("sdpa", "matmul"):
            assert grads[backend][1][2, :, 3:].abs().max() == 0


@pytest.mark.parametrize("backend", ["sdpa", "matmul"])
def test_masked_keys_change_nothing(backend):
    q, k, v = qkv()
    mask = key_padding()
    k2, v2 = k.clone(), v.clone()
    k2[1, :, 6:] = 100 * torch.randn(2, 3, 8)
    v2[1, :, 6:] = 100 * torch.randn(2, 3, 8)
    with attention_backend(backend):
        torch.testing.assert_close(attention(q, k2, v2, mask)[1], attention(q, k, v, mask)[1])


@pytest.mark.parametrize("backend", ["sdpa", "matmul"])
def test_a_query_with_no_key_to_attend_to_gets_zeros_and_finite_gradients(backend):
    q, k, v = (x.requires_grad_() for x in qkv(tq=4, tk=5))
    mask = torch.ones(3, 2, 4, 5, dtype=torch.bool)
    mask[1, :, 2] = False  # query 2 of image 1 may attend to nothing
    with attention_backend(backend):
        out = attention(q, k, v, mask)
    assert out[1, :, 2].abs().max() == 0
    torch.testing.assert_close(out[0].double(), reference(q, k, v)[0], rtol=1e-5, atol=1e-6)  # others untouched
    out.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


def test_auto_writes_out_bf16_attention_on_a_native_bf16_cpu_and_keeps_sdpa_elsewhere(monkeypatch):
    monkeypatch.setattr(attention_module, "_CPU_NATIVE_BF16", True)
    assert resolve_backend(torch.zeros(1, dtype=torch.bfloat16)) == "matmul"
    assert resolve_backend(torch.zeros(1)) == "sdpa"
    assert resolve_backend(torch.zeros(1, dtype=torch.float16)) == "sdpa"  # fp16 matmuls are emulated on CPUs
    assert resolve_backend(torch.zeros(1, device="meta", dtype=torch.bfloat16)) == "sdpa"  # not a CPU
    with torch.autocast("cpu", dtype=torch.bfloat16):  # fp32 queries under bf16 autocast still run in bf16
        assert resolve_backend(torch.zeros(1)) == "matmul"
    monkeypatch.setattr(attention_module, "_CPU_NATIVE_BF16", False)  # emulated bf16: SDPA
    assert resolve_backend(torch.zeros(1, dtype=torch.bfloat16)) == "sdpa"
    monkeypatch.setattr(attention_module, "_CPU_NATIVE_BF16", True)
    with attention_backend("matmul"):
        assert resolve_backend(torch.zeros(1)) == "matmul"
        with attention_backend("sdpa"):
            assert resolve_backend(torch.zeros(1, dtype=torch.bfloat16)) == "sdpa"
        assert resolve_backend(torch.zeros(1)) == "matmul"  # restored on leaving the inner block
    assert resolve_backend(torch.zeros(1)) == "sdpa"


def test_auto_sends_bf16_autocast_through_the_matmul_kernel(monkeypatch):
    """Under CPU bf16 autocast (on a CPU with native bf16) the model must not reach SDPA."""
    monkeypatch.setattr(attention_module, "_CPU_NATIVE_BF16", True)
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    model = DiT(DiTConfig(dim=32, depth=2, n_heads=2))
    x, t, y = torch.randn(2, 3, 32, 32), torch.rand(2), torch.tensor([0, 1])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x, t, y)
    assert calls == []
    model(x, t, y)  # fp32: through SDPA, one call per block
    assert len(calls) == 2


def test_bf16_matmul_attention_stays_within_bf16_rounding_of_the_definition():
    q, k, v = qkv(n=4, h=4, tq=64, tk=64, dh=32, seed=2)
    exact = reference(q, k, v)
    with attention_backend("matmul"):
        out = attention(*(x.bfloat16() for x in (q, k, v))).double()
    # Inputs rounded to bf16 (8 significant bits) move the output by about 1e-2 at most; a wrong kernel
    # (no scaling, a softmax over the wrong axis) misses by more than 0.1.
    assert (out - exact).abs().max() < 3e-2
    assert (out - exact).abs().mean() < 3e-3


def test_an_unknown_backend_is_a_clear_error():
    with pytest.raises(TinyDiTError, match="sdpa, matmul"):
        with attention_backend("flash"):
            pass
    assert "flash" not in BACKENDS


def test_attention_module_gives_the_same_output_through_either_kernel():
    torch.manual_seed(0)
    attn = Attention(dim=32, n_heads=4, qk_norm=True)
    x = torch.randn(3, 10, 32)
    with attention_backend("sdpa"):
        a = attn(x)
    with attention_backend("matmul"):
        b = attn(x)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    q, k, v = attn.heads(x)
    torch.testing.assert_close(matmul_attention(q, k, v).double(), reference(q, k, v), rtol=1e-5, atol=1e-6)
