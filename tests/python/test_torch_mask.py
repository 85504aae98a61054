"""mask= in flashattn.torch.attention: a boolean tensor, True = attend, ANDed with causal,
window and segment ids, broadcast over size-1 dims without being materialized; against the
float64 reference with the mask as a 0 / -inf bias (docs/nonfinite.md); a bool bias= refused;
mask= refused by name where the library has no bias (packed batches, kv-cache decoding)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashattn.torch as fat  # noqa: E402
import reference as ref  # noqa: E402
from cases import make  # noqa: E402
from conftest import BWD_TOL, check, check_lse, fwd_tol  # noqa: E402


def f64(x):
    return x.detach().to(torch.float64).numpy()


def as_bias(mask):
    return np.where(mask, 0.0, -np.inf)


@pytest.mark.parametrize("case", ["plain", "causal", "window_causal", "segments", "gqa", "bias_heads"])
@pytest.mark.parametrize("mshape", ["full", "b11k", "1hq1", "qk", "11"])
def test_mask_matches_reference(rng, case, mshape):
    qn, kn, vn, kw = make(rng, case)
    B, H, Sq, _ = qn.shape
    Sk = kn.shape[2]
    shape = {"full": (B, H, Sq, Sk), "b11k": (B, 1, 1, Sk), "1hq1": (1, H, Sq, 1), "qk": (Sq, Sk),
             "11": (1, 1)}[mshape]
    mask = rng.random(shape) < 0.7
    if mshape == "full":
        mask[0, 0, 3] = False  # a row with no visible key
    tkw = {n: torch.from_numpy(a) if isinstance(a, np.ndarray) else a for n, a in kw.items()}
    q, k, v = (torch.from_numpy(a).requires_grad_() for a in (qn, kn, vn))
    if "bias" in tkw:
        tkw["bias"].requires_grad_()
    o, lse = fat.attention(q, k, v, mask=torch.from_numpy(mask), return_lse=True, **tkw)
    m4 = np.broadcast_to(mask.reshape((1,) * (4 - mask.ndim) + mask.shape), (B, H, Sq, Sk))
    bias = as_bias(m4) + (kw["bias"] if "bias" in kw else 0.0)
    rkw = dict(kw, bias=bias)
    o_ref, lse_ref, _ = ref.forward(qn, kn, vn, **rkw)
    check("o", f64(o), o_ref, fwd_tol("f32", lse_ref))
    check_lse(f64(lse), lse_ref)
    do = torch.from_numpy(rng.standard_normal(o.shape).astype(np.float32))
    inputs = (q, k, v) + ((tkw["bias"],) if "bias" in tkw else ())
    got = torch.autograd.grad(o, inputs, do)
    want = ref.backward(qn, kn, vn, do.numpy(), o_saved=f64(o), **rkw)
    for name, g, r in zip(("dq", "dk", "dv"), got, want):
        check(name, f64(g), r, BWD_TOL["f32"])
    if "bias" in tkw:  # dbias: the bias's own shape, broadcast dims summed
        check("dbias", f64(got[3]), want[3].sum(0, keepdims=True), BWD_TOL["f32"])


def test_mask_with_negative_bias_scale_still_hides(rng):
    """A hidden key stays hidden whatever bias_scale is (-inf * -1 would be +inf)."""
    qn, kn, vn, kw = make(rng, "bias_heads")
    mask = rng.random((qn.shape[2], kn.shape[2])) < 0.5
    o = fat.attention(*(torch.from_numpy(a) for a in (qn, kn, vn)), bias=torch.from_numpy(kw["bias"]),
                      mask=torch.from_numpy(mask), bias_scale=-0.5)
    o_ref, lse_ref, _ = ref.forward(qn, kn, vn, bias=-0.5 * kw["bias"] + as_bias(mask))
    check("o", f64(o), o_ref, fwd_tol("f32", lse_ref))


@pytest.mark.parametrize("bias_scale", [-1.0, 0.0, 0.5])
def test_mask_with_bias_scale_forward_and_gradients(rng, bias_scale):
    """The numpy and JAX fronts' rule too (test_mask.py): with a mask, bias_scale scales the
    bias alone; gradients of q, k, v and the bias (bias_scale times the scaled bias's)."""
    B, H, Sq, Sk, D = 2, 3, 7, 9, 8
    qn, kn, vn, don = (rng.standard_normal(s).astype(np.float32)
                       for s in ((B, H, Sq, D), (B, H, Sk, D), (B, H, Sk, D), (B, H, Sq, D)))
    bn = rng.standard_normal((1, H, Sq, Sk)).astype(np.float32)
    mask = rng.random((B, 1, Sq, Sk)) < 0.6
    mask[0, 0, 2] = False  # a row with no visible key
    q, k, v, b = (torch.from_numpy(a).requires_grad_() for a in (qn, kn, vn, bn))
    o = fat.attention(q, k, v, bias=b, mask=torch.from_numpy(mask), bias_scale=bias_scale)
    full = bias_scale * bn.astype(np.float64) + as_bias(mask)
    o_ref, lse_ref, _ = ref.forward(qn, kn, vn, bias=full)
    check("o", f64(o), o_ref, fwd_tol("f32", lse_ref))
    dq, dk, dv, db4 = ref.backward(qn, kn, vn, don, bias=full)
    grads = torch.autograd.grad(o, (q, k, v, b), torch.from_numpy(don))
    for name, g, w in zip(("dq", "dk", "dv", "dbias"), grads, (dq, dk, dv, bias_scale * db4.sum(0, keepdims=True))):
        check(name, f64(g), w, BWD_TOL["f32"])


def _capture_problem(monkeypatch):
    from flashattn import _native
    seen = []
    real = _native.cached_plan

    def spy(problem, options):
        seen.append(_native.Problem.from_buffer_copy(problem))
        return real(problem, options)
    monkeypatch.setattr(_native, "cached_plan", spy)
    return seen


@pytest.mark.parametrize("shape, strides", [((2, 1, 1, 40), (0, 0, 0, 1)),  # key padding
                                            ((1, 1, 30, 1), (0, 0, 1, 0))])
def test_size_one_dims_are_stride_zero_views(rng, monkeypatch, shape, strides):
    q, k, v = (torch.randn(2, 4, 30 if i == 0 else 40, 16) for i in range(3))
    seen = _capture_problem(monkeypatch)
    mask = torch.from_numpy(rng.random(shape) < 0.8)
    fat.attention(q, k, v, mask=mask)
    p = seen[-1]
    # a size-1 Sq is the library's to broadcast (bias_seq_q = 1); a size-1 Sk a stride-0 view
    assert (p.bias_batch, p.bias_heads, p.bias_seq_q) == (shape[0], 1, shape[2])
    first = 2 if shape[2] > 1 else 3
    assert tuple(p.bias_stride.s)[first:] == strides[first:], tuple(p.bias_stride.s)


def test_bool_bias_points_to_mask():
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(TypeError, match="mask="):
        fat.attention(q, q, q, bias=torch.ones(8, 8, dtype=torch.bool).tril())


def test_mask_must_be_bool():
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(TypeError, match="boolean"):
        fat.attention(q, q, q, mask=torch.ones(8, 8))
    with pytest.raises(ValueError, match="broadcast"):
        fat.attention(q, q, q, mask=torch.ones(3, 8, 8, dtype=torch.bool))


def test_mask_refused_where_the_library_has_no_bias():
    q = torch.randn(6, 2, 16)
    cu = torch.tensor([0, 6], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="mask= with varlen_attention"):
        fat.varlen_attention(q, q, q, cu, cu, mask=torch.ones(6, 6, dtype=torch.bool))
    qd, cache = torch.randn(1, 1, 2, 16), torch.randn(1, 8, 2, 16)
    with pytest.raises(NotImplementedError, match="mask= with kvcache_attention"):
        fat.kvcache_attention(qd, cache, cache, mask=torch.ones(1, 8, dtype=torch.bool))


@pytest.mark.parametrize("shape", [(), (6,), (6, 6)])
def test_low_rank_masks_and_biases_broadcast(rng, shape):
    """A mask or bias of fewer than 4 dims (a key mask [Sk], a scalar) broadcasts as torch's
    own broadcasting (and numpy's front) pads it: the same o as numpy's, and a bias
    gradient of the bias's own shape."""
    import flashattn
    q = rng.standard_normal((2, 3, 6, 8)).astype(np.float32)
    m = rng.random(shape) < 0.7
    if m.ndim:
        m[..., 0] = True  # every row sees a key
    else:
        m = np.array(True)
    b = rng.standard_normal(shape).astype(np.float32)
    t = torch.from_numpy(q)
    for kw, tkw in ((dict(mask=m), dict(mask=torch.from_numpy(m))), (dict(bias=b), dict(bias=torch.from_numpy(b)))):
        want = flashattn.attention(q, q, q, **kw)
        assert np.array_equal(fat.attention(t, t, t, **tkw).numpy(), want)
    tb = torch.from_numpy(b).requires_grad_()
    fat.attention(t, t, t, bias=tb).sum().backward()
    assert tb.grad.shape == tb.shape and torch.isfinite(tb.grad).all()


def test_results_do_not_depend_on_the_default_dtype(rng):
    """torch.set_default_dtype(torch.float64) left every tensor the front made without a dtype
    (a boolean mask's 0 / -inf bias, empty lse) in float64, and the library read the mask's f64
    bits as f32: NaN outputs. Every such tensor is f32 now, whatever the default."""
    import torch
    B, H, Sq, Sk, D = 1, 2, 5, 7, 8
    q, k, v = (torch.from_numpy(rng.standard_normal(s).astype(np.float32))
               for s in ((B, H, Sq, D), (B, H, Sk, D), (B, H, Sk, D)))
    mask = torch.from_numpy(rng.random((B, 1, Sq, Sk)) < 0.6)
    mask[..., 0] = True
    bias = torch.from_numpy(rng.standard_normal((1, H, Sq, Sk)).astype(np.float32))
    calls = [lambda: fat.attention(q, k, v, mask=mask), lambda: fat.attention(q, k, v, mask=mask, bias=bias),
             lambda: fat.scaled_dot_product_attention(q, k, v, attn_mask=mask)]
    want = [c() for c in calls]
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        for c, w in zip(calls, want):
            assert torch.equal(c(), w)
        _, lse = fat.attention(q[:, :, :0], k, v, return_lse=True)
        _, lse2 = fat.attention(q, k[:, :, :0], v[:, :, :0], return_lse=True)
        assert lse.dtype == lse2.dtype == torch.float32
        one, none = torch.tensor([0, 3], dtype=torch.int32), torch.tensor([0, 0], dtype=torch.int32)
        _, lv = fat.varlen_attention(q[0, :, :3].transpose(0, 1).contiguous(), k[0, :, :0].transpose(0, 1),
                                     v[0, :, :0].transpose(0, 1), one, none, return_lse=True)
        assert lv.dtype == torch.float32
    finally:
        torch.set_default_dtype(before)
