"""The PyTorch front: against F.scaled_dot_product_attention where semantics coincide, the
float64 reference everywhere, torch.compile, strided tensors, bad input; CUDA where built."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import flashattn  # noqa: E402
import flashattn.torch as fat  # noqa: E402
import reference as ref  # noqa: E402
from cases import CASES, make  # noqa: E402
from conftest import BWD_TOL, SEED, check, check_lse, fwd_tol  # noqa: E402

TDT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def t(a, dtype="f32", grad=False, device="cpu"):
    x = torch.from_numpy(np.asarray(a, np.float32)).to(device=device, dtype=TDT[dtype])
    return x.requires_grad_(grad)


def f64(x):
    return x.detach().to("cpu", torch.float64).numpy()


def options_for_torch(kw, device="cpu"):
    out = dict(kw)
    for name in ("bias", "alibi_slopes"):
        if name in out:
            out[name] = torch.from_numpy(out[name]).to(device)
    for name in ("q_segment_ids", "kv_segment_ids"):
        if name in out:
            out[name] = torch.from_numpy(out[name]).to(device)
    return out


def grads(o, inputs, do):
    return torch.autograd.grad(o, inputs, do)


# ---- against PyTorch's own attention ------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("causal, Hq, Hk, Sk", [(False, 4, 4, 37), (True, 4, 4, 29),
                                                (True, 6, 2, 29), (False, 4, 1, 45)])
def test_matches_sdpa(rng, dtype, causal, Hq, Hk, Sk):
    """is_causal is top-left aligned in SDPA: it equals flashattn's causal when Sq == Sk."""
    Sq = 29 if causal else 21
    B, D = 2, 32
    q = t(rng.standard_normal((B, Hq, Sq, D)), dtype, True)
    k = t(rng.standard_normal((B, Hk, Sk, D)), dtype, True)
    v = t(rng.standard_normal((B, Hk, Sk, D)), dtype, True)
    o = fat.attention(q, k, v, causal=causal)
    assert o.dtype == TDT[dtype] and o.shape == (B, Hq, Sq, D)
    # SDPA in f32 on the same (rounded) inputs: the exact answer up to f32 roundoff
    q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
    r = F.scaled_dot_product_attention(q32, k32, v32, is_causal=causal, enable_gqa=Hq != Hk)
    check("o vs sdpa", f64(o), f64(r), fwd_tol(dtype, np.zeros(1)))
    do = torch.from_numpy(rng.standard_normal(o.shape).astype(np.float32))
    got = grads(o, (q, k, v), do.to(TDT[dtype]))
    want = grads(r, (q32, k32, v32), do.to(TDT[dtype]).float())
    tol = BWD_TOL[dtype]  # the C suite's bounds (tests/backward_check.h)
    for name, g, w, x in zip(("dq", "dk", "dv"), got, want, (q, k, v)):
        assert g.shape == x.shape and g.dtype == x.dtype
        check(f"{name} vs sdpa", f64(g), f64(w), tol)


@pytest.mark.parametrize("Sq, Sk", [(13, 40), (40, 13)])
def test_top_left_causal_matches_sdpa_is_causal(rng, Sq, Sk):
    """SDPA's is_causal aligns top-left: flashattn's diag_offset=0."""
    q = t(rng.standard_normal((2, 4, Sq, 16)), grad=True)
    k = t(rng.standard_normal((2, 2, Sk, 16)), grad=True)
    v = t(rng.standard_normal((2, 2, Sk, 16)), grad=True)
    o = fat.attention(q, k, v, causal=True, diag_offset=0)
    r = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    check("o vs sdpa", f64(o), f64(r), fwd_tol("f32", np.zeros(1)))
    do = torch.randn_like(o)
    for name, g, w in zip(("dq", "dk", "dv"), grads(o, (q, k, v), do), grads(r, (q, k, v), do)):
        check(f"{name} vs sdpa", f64(g), f64(w), BWD_TOL["f32"])


def test_bias_scale_and_gradient(rng):
    qn, kn, vn, kw = make(rng, "bias_full")
    q, k, v = (t(a, grad=True) for a in (qn, kn, vn))
    bias = torch.from_numpy(kw["bias"]).requires_grad_()
    o = fat.attention(q, k, v, bias=bias, bias_scale=0.125)
    do = torch.randn_like(o)
    got = grads(o, (q, k, v, bias), do)
    o_ref, lse_ref, _ = ref.forward(qn, kn, vn, bias=kw["bias"], bias_scale=0.125)
    check("o", f64(o), o_ref, fwd_tol("f32", lse_ref))
    want = ref.backward(qn, kn, vn, f64(do), o_saved=f64(o), bias=kw["bias"], bias_scale=0.125)
    for name, g, r in zip(("dq", "dk", "dv", "dbias"), got, want):
        check(name, f64(g), r, BWD_TOL["f32"])


# ---- against the float64 reference --------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(rng, case, dtype):
    qn, kn, vn, kw = make(rng, case, dtype)
    q, k, v = (t(np.asarray(a, np.float32), dtype, True) for a in (qn, kn, vn))
    o, lse = fat.attention(q, k, v, return_lse=True, **options_for_torch(kw))
    o_ref, lse_ref, _ = ref.forward(qn, kn, vn, **kw)
    check("o", f64(o), o_ref, fwd_tol(dtype, lse_ref))
    check_lse(f64(lse), lse_ref)
    assert lse.requires_grad  # differentiable: test_torch_autograd.py checks its gradient
    do_n = rng.standard_normal(o.shape).astype(np.float32)
    do = t(do_n, dtype)
    dq, dk, dv = grads(o, (q, k, v), do)
    rq, rk, rv, _ = ref.backward(qn, kn, vn, f64(do), o_saved=f64(o), **kw)
    for name, g, r in (("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
        check(name, f64(g), r, BWD_TOL[dtype])


@pytest.mark.parametrize("case", ["bias_heads", "bias_2d", "bias_full"])
def test_bias_gradient(rng, case):
    """dbias through autograd, in the bias's own shape (broadcast dims summed)."""
    qn, kn, vn, kw = make(rng, case)
    q, k, v = (t(a, grad=True) for a in (qn, kn, vn))
    bias = torch.from_numpy(kw["bias"]).requires_grad_()
    o = fat.attention(q, k, v, bias=bias)
    do = torch.from_numpy(rng.standard_normal(o.shape).astype(np.float32))
    db, = torch.autograd.grad(o, (bias,), do)
    *_, rb = ref.backward(qn, kn, vn, do.numpy(), o_saved=f64(o), bias=kw["bias"])
    shape4 = (1,) * (4 - bias.dim()) + tuple(bias.shape)
    broadcast = tuple(i for i, n in enumerate(shape4) if n == 1)   # summed over, size 1 or padded
    want = rb.sum(axis=broadcast, keepdims=True).reshape(bias.shape)
    assert db.shape == bias.shape
    check("dbias", f64(db), want, BWD_TOL["f32"])


# ---- torch.compile ---------------------------------------------------------------------

class TinyBlock(torch.nn.Module):
    def __init__(self, dim=32, heads=4, kv_heads=2):
        super().__init__()
        self.h, self.kvh, self.d = heads, kv_heads, dim // heads
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.d)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x):
        B, S, _ = x.shape
        qkv = self.qkv(x).view(B, S, self.h + 2 * self.kvh, self.d)
        q, k, v = qkv.split([self.h, self.kvh, self.kvh], dim=2)   # [B, S, H, D] views
        o = fat.attention(q, k, v, causal=True, softcap=5.0, layout="bshd")
        return self.out(o.reshape(B, S, -1)).relu().sum()


def test_torch_compile_fullgraph_matches_eager():
    """fullgraph=True fails on any graph break: the op must stay in the graph, opaque."""
    torch.manual_seed(SEED)
    model = TinyBlock()
    x = torch.randn(2, 19, 32)
    eager = model(x)
    g_eager = torch.autograd.grad(eager, list(model.parameters()))
    compiled = torch.compile(model, fullgraph=True)
    got = compiled(x)
    g_got = torch.autograd.grad(got, list(model.parameters()))
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)
    for a, b in zip(g_got, g_eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_torch_compile_of_inputs_passed_straight_in_compiles_once(rng):
    """q, k, v that are the compiled function's own inputs, new tensors at every call: one
    graph (the front once took id() of each, which Dynamo guarded: a recompile per call, and
    fullgraph=True failed at the 9th); attention and varlen_attention, and k passed as v too
    (their aliasing: one more graph, not one per call)."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    att = torch.compile(lambda q, k, v: fat.attention(q, k, v, causal=True), fullgraph=True)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    var = torch.compile(lambda q, k, v: fat.varlen_attention(q, k, v, cu, cu, causal=True), fullgraph=True)
    for i in range(10):
        q, k, v = (torch.from_numpy(rng.standard_normal((1, 2, 12, 16)).astype(np.float32)) for _ in range(3))
        torch.testing.assert_close(att(q, k, v), fat.attention(q, k, v, causal=True))
        torch.testing.assert_close(att(q, k, k), fat.attention(q, k, k, causal=True))
        p, r, s = (x[0].transpose(0, 1).contiguous() for x in (q, k, v))
        torch.testing.assert_close(var(p, r, s), fat.varlen_attention(p, r, s, cu, cu, causal=True))
    assert counters["stats"]["unique_graphs"] <= 3, dict(counters["stats"])


def test_ops_are_registered_with_fake_kernels():
    q = torch.empty(2, 4, 7, 16, device="meta")
    k = torch.empty(2, 2, 9, 16, device="meta")
    o, lse = torch.ops.flashattn.attention_fwd(q, k, k, None, None, None, None, True, -1, -1, 0.0, None,
                                               "bhsd", None, None)
    assert o.shape == (2, 4, 7, 16) and lse.shape == (2, 4, 7) and lse.dtype == torch.float32


# ---- zero copy, strides --------------------------------------------------------------

def _capture_pointers(monkeypatch):
    from flashattn import _native
    seen = {}
    for name in ("forward", "backward"):
        real = getattr(_native.PlanHandle, name)

        def spy(self, args, _real=real, _name=name):
            seen[_name] = args
            return _real(self, args)
        monkeypatch.setattr(_native.PlanHandle, name, spy)
    return seen


def test_packed_qkv_views_reach_the_library_uncopied(rng, monkeypatch):
    B, S, H, D = 2, 21, 4, 16
    qkv = torch.from_numpy(rng.standard_normal((B, S, 3, H, D)).astype(np.float32)).requires_grad_()
    q, k, v = qkv.unbind(2)                                  # [B, S, H, D], gapped strides
    seen = _capture_pointers(monkeypatch)
    o = fat.attention(q, k, v, layout="bshd", causal=True)
    fa = seen["forward"]
    assert (fa.q, fa.k, fa.v) == (q.data_ptr(), k.data_ptr(), v.data_ptr())
    assert fa.o == o.data_ptr()
    do = torch.from_numpy(rng.standard_normal(o.shape).astype(np.float32))
    g, = torch.autograd.grad(o, (qkv,), do)
    ba = seen["backward"]
    assert (ba.q, ba.k, ba.v) == (q.data_ptr(), k.data_ptr(), v.data_ptr())
    qh, kh, vh = (f64(x).transpose(0, 2, 1, 3) for x in (q, k, v))
    rq, rk, rv, _ = ref.backward(qh, kh, vh, do.numpy().transpose(0, 2, 1, 3), o_saved=f64(o).transpose(0, 2, 1, 3),
                                 causal=True)
    for i, (name, r) in enumerate((("dq", rq), ("dk", rk), ("dv", rv))):
        check(name, f64(g[:, :, i]).transpose(0, 2, 1, 3), r, BWD_TOL["f32"])


def test_transposed_and_sliced_inputs(rng):
    qn, kn, vn, kw = make(rng, "gqa")
    # [B, H, D, S] memory seen as [B, H, S, D]; a slice of a wider head dim
    q = torch.from_numpy(np.ascontiguousarray(qn.transpose(0, 1, 3, 2))).transpose(2, 3)
    wide = np.concatenate([kn, rng.standard_normal(kn.shape).astype(np.float32)], axis=3)
    k = torch.from_numpy(wide)[..., :kn.shape[3]]
    v = torch.from_numpy(vn)[:, :, ::1]
    assert not q.is_contiguous() and not k.is_contiguous()
    o = fat.attention(q, k, v)
    o_ref, lse_ref, _ = ref.forward(qn, kn, vn)
    check("o", f64(o), o_ref, fwd_tol("f32", lse_ref))


def test_grad_output_with_zero_strides(rng):
    """.sum() hands the backward an expanded (all-zero-stride) gradient: read correctly."""
    qn, kn, vn, _ = make(rng, "plain")
    q, k, v = (t(a, grad=True) for a in (qn, kn, vn))
    dq, dk, dv = torch.autograd.grad(fat.attention(q, k, v).sum(), (q, k, v))
    rq, rk, rv, _ = ref.backward(qn, kn, vn, np.ones((2, 4, 33, 16)))
    for name, g, r in (("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
        check(name, f64(g), r, BWD_TOL["f32"])


# ---- bad input ------------------------------------------------------------------------

def _qkv():
    return torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)


@pytest.mark.parametrize("mutate, message", [
    (lambda q, k, v: (q[0], k, v), "q must have 4 dims"),
    (lambda q, k, v: (q, k.half(), v), "one dtype"),
    (lambda q, k, v: (q.double(), k.double(), v.double()), "float32, float16 or bfloat16"),
    (lambda q, k, v: (q, k.to("meta"), v), "one device"),
    (lambda q, k, v: (q[:, :3], k, v), "not a multiple"),
    (lambda q, k, v: (q, k, v[..., :3, :]), "k has 8 keys but v has 3"),
    (lambda q, k, v: (q.numpy(), k, v), "torch.Tensor"),
])
def test_bad_input_names_the_problem(mutate, message):
    with pytest.raises(ValueError, match=message):
        fat.attention(*mutate(*_qkv()))


@pytest.mark.parametrize("kw, message", [
    ({"bias": torch.zeros(1, 4, 8, 7)}, "bias"),
    ({"bias": torch.zeros(1, 4, 8, 8, device="meta")}, "bias is on meta"),
    ({"alibi_slopes": torch.ones(3)}, "alibi_slopes"),
    ({"q_segment_ids": torch.zeros(1, 8, dtype=torch.int32)}, "both or neither"),
    ({"window": (-5, 1)}, "window"),
    ({"softcap": -1.0}, "softcap"),
    ({"layout": "bsd"}, "layout"),
])
def test_bad_options_name_the_problem(kw, message):
    with pytest.raises(ValueError, match=message):
        fat.attention(*_qkv(), **kw)


def test_import_does_not_pull_in_jax():
    import sys
    assert "flashattn.jax" not in sys.modules or "jax" in sys.modules


# ---- CUDA -----------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not (torch.cuda.is_available() and flashattn.cuda_available()),
                                reason="no CUDA device here (or the library was built without CUDA)")


@needs_cuda
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_cuda_matches_reference_on_the_current_stream(rng, dtype):
    qn, kn, vn, kw = make(rng, "everything", dtype)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        q, k, v = (t(np.asarray(a, np.float32), dtype, True, "cuda") for a in (qn, kn, vn))
        o, lse = fat.attention(q, k, v, return_lse=True, **options_for_torch(kw, "cuda"))
        do = torch.randn_like(o)
        dq, dk, dv = grads(o, (q, k, v), do)
    stream.synchronize()
    o_ref, lse_ref, _ = ref.forward(qn, kn, vn, **kw)
    check("o", f64(o), o_ref, fwd_tol(dtype, lse_ref))
    check_lse(f64(lse), lse_ref)
    rq, rk, rv, _ = ref.backward(qn, kn, vn, f64(do), o_saved=f64(o), **kw)
    for name, g, r in (("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
        check(name, f64(g), r, BWD_TOL[dtype])


@needs_cuda
def test_cuda_and_cpu_tensors_do_not_mix():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="one device"):
        fat.attention(q.cuda(), k, v)
