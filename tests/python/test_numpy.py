"""The numpy front against the float64 reference: every case and dtype, both layouts,
outputs into caller arrays, strided inputs, and bad input."""
import numpy as np
import pytest

import flashattn
import reference as ref
from cases import CASES, bshd, make
from conftest import BWD_TOL, check, check_lse, fwd_tol, np_dtype, randn

DTYPES = ["f32", "f16", "bf16"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_reference(rng, case, dtype):
    q, k, v, kw = make(rng, case, dtype)
    o, lse = flashattn.attention(q, k, v, return_lse=True, **kw)
    assert o.dtype == q.dtype and o.shape == q.shape[:3] + (v.shape[3],)
    o_ref, lse_ref, _ = ref.forward(q, k, v, **kw)
    check("o", o, o_ref, fwd_tol(dtype, lse_ref))
    check_lse(lse, lse_ref)
    if np.isinf(lse_ref).any():  # rows with no visible key: o = 0 exactly
        assert (np.asarray(o, np.float64)[np.isinf(lse_ref)] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["plain", "causal_sq_gt_sk", "gqa", "softcap", "alibi",
                                  "bias_full", "bias_neg_inf", "segments", "top_left", "everything"])
def test_backward_matches_reference(rng, case, dtype):
    q, k, v, kw = make(rng, case, dtype)
    o, lse = flashattn.attention(q, k, v, return_lse=True, **kw)
    do = randn(rng, o.shape, dtype)
    dq, dk, dv = flashattn.attention_backward(q, k, v, o, lse, do, **kw)
    rq, rk, rv, _ = ref.backward(q, k, v, do, o_saved=o, **kw)
    tol = BWD_TOL[dtype]
    for name, g, r, x in (("dq", dq, rq, q), ("dk", dk, rk, k), ("dv", dv, rv, v)):
        assert g.shape == x.shape and g.dtype == x.dtype
        check(name, g, r, tol)


@pytest.mark.parametrize("case", ["causal_sq_lt_sk", "gqa", "everything"])
def test_bshd_layout_is_a_view_and_matches(rng, case):
    q, k, v, kw = make(rng, case)
    qs, ks, vs = bshd(q), bshd(k), bshd(v)           # [B, S, H, D] views of BHSD memory
    o, lse = flashattn.attention(qs, ks, vs, layout="bshd", return_lse=True, **kw)
    o_ref, lse_ref, _ = ref.forward(q, k, v, **kw)
    assert o.shape == (q.shape[0], q.shape[2], q.shape[1], v.shape[3])
    assert lse.shape == lse_ref.shape
    check("o", bshd(o), o_ref, fwd_tol("f32", lse_ref))
    check_lse(lse, lse_ref)
    # contiguous [B, S, H, D] too
    o2 = flashattn.attention(np.ascontiguousarray(qs), np.ascontiguousarray(ks),
                             np.ascontiguousarray(vs), layout="bshd", **kw)
    np.testing.assert_array_equal(o2, o)
    do = randn(rng, o.shape)
    dq, dk, dv = flashattn.attention_backward(qs, ks, vs, o, lse, do, layout="bshd", **kw)
    rq, rk, rv, _ = ref.backward(q, k, v, bshd(do), o_saved=bshd(o), **kw)
    for name, g, r in (("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
        check(name, bshd(g), r, BWD_TOL["f32"])


def test_out_is_written_in_place(rng):
    """Zero-copy: o lands in a view of a caller's larger buffer, nothing around it changes."""
    q, k, v, kw = make(rng, "causal")
    B, H, S, D = q.shape
    big = np.full((B, H + 2, S + 3, D + 5), np.nan, np.float32)
    view = big[:, 1:H + 1, 2:S + 2, 3:D + 3]
    got = flashattn.attention(q, k, v, out=view, **kw)
    assert got is view and np.shares_memory(got, big)
    o_ref, lse_ref, _ = ref.forward(q, k, v, **kw)
    check("o", view, o_ref, fwd_tol("f32", lse_ref))
    mask = np.ones(big.shape, bool)
    mask[:, 1:H + 1, 2:S + 2, 3:D + 3] = False
    assert np.isnan(big[mask]).all(), "elements outside out were written"


def test_strided_inputs_without_copies(rng, monkeypatch):
    """Slices of packed qkv, transposes and a broadcast bias reach the library as they are:
    no np.ascontiguousarray call on the forward's way."""
    B, H, S, D = 2, 4, 23, 16
    qkv = randn(rng, (B, S, 3, H, D))
    q, k, v = (qkv[:, :, i] for i in range(3))       # [B, S, H, D], gapped strides
    bias = np.broadcast_to(rng.standard_normal((1, 1, S, S)).astype(np.float32), (B, H, S, S))
    import flashattn._numpy as front
    calls = []
    real = np.ascontiguousarray
    monkeypatch.setattr(front.np, "ascontiguousarray", lambda a, *x, **y: calls.append(a) or real(a, *x, **y))
    o = flashattn.attention(q, k, v, layout="bshd", causal=True, bias=bias)
    monkeypatch.undo()
    assert calls == [], "an input was copied"
    qh, kh, vh = (np.ascontiguousarray(np.swapaxes(a, 1, 2)) for a in (q, k, v))
    o_ref, lse_ref, _ = ref.forward(qh, kh, vh, causal=True, bias=bias)
    check("o", bshd(o), o_ref, fwd_tol("f32", lse_ref))


def test_odd_strides_are_copied_not_misread(rng):
    """Negative strides and an all-zero broadcast cannot be described to the library: the
    front copies them, and the answer stays right."""
    q, k, v, kw = make(rng, "plain")
    flipped = q[:, :, ::-1]
    o = flashattn.attention(flipped, k, v)
    o_ref, lse_ref, _ = ref.forward(np.ascontiguousarray(flipped), k, v)
    check("o", o, o_ref, fwd_tol("f32", lse_ref))
    const_v = np.broadcast_to(np.float32(0.5), v.shape)
    o = flashattn.attention(q, k, const_v)
    np.testing.assert_allclose(o, 0.5, rtol=1e-6)


def test_backward_do_with_other_strides(rng):
    q, k, v, kw = make(rng, "gqa")
    o, lse = flashattn.attention(q, k, v, return_lse=True)
    do_t = np.ascontiguousarray(np.swapaxes(randn(rng, o.shape), 2, 3))   # [B, H, D, S] memory
    do = np.swapaxes(do_t, 2, 3)
    dq, dk, dv = flashattn.attention_backward(q, k, v, o, lse, do)
    rq, rk, rv, _ = ref.backward(q, k, v, do, o_saved=o)
    for name, g, r in (("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
        check(name, g, r, BWD_TOL["f32"])


@pytest.mark.parametrize("case", ["bias_heads", "bias_2d", "bias_full"])
def test_bias_grad(rng, case):
    q, k, v, kw = make(rng, case)
    o, lse = flashattn.attention(q, k, v, return_lse=True, **kw)
    do = randn(rng, o.shape)
    dq, dk, dv, db = flashattn.attention_backward(q, k, v, o, lse, do, bias_grad=True, **kw)
    *_, rb = ref.backward(q, k, v, do, o_saved=o, **kw)
    shape4 = (1,) * (4 - kw["bias"].ndim) + kw["bias"].shape
    broadcast = tuple(i for i, n in enumerate(shape4) if n == 1)
    assert db.shape == kw["bias"].shape
    check("dbias", db, rb.sum(axis=broadcast, keepdims=True).reshape(db.shape), BWD_TOL["f32"])


def test_bias_scale(rng):
    q, k, v, kw = make(rng, "bias_full")
    o, lse = flashattn.attention(q, k, v, bias_scale=0.125, return_lse=True, **kw)
    o_ref, lse_ref, _ = ref.forward(q, k, v, bias_scale=0.125, **kw)
    check("o", o, o_ref, fwd_tol("f32", lse_ref))
    check_lse(lse, lse_ref)
    do = randn(rng, o.shape)
    dq, dk, dv, db = flashattn.attention_backward(q, k, v, o, lse, do, bias_scale=0.125, bias_grad=True, **kw)
    rq, rk, rv, rb = ref.backward(q, k, v, do, o_saved=o, bias_scale=0.125, **kw)
    for name, g, r in (("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv), ("dbias", db, rb)):
        check(name, g, r, BWD_TOL["f32"])


def test_plan_matches_what_the_call_uses(rng):
    q, k, v, kw = make(rng, "everything")
    B, H, Sq, D = q.shape
    p = flashattn.plan(batch=B, heads=H, kv_heads=k.shape[1], seq_q=Sq, seq_k=k.shape[2],
                       head_dim=D, head_dim_v=v.shape[3], causal=True, window=kw["window"],
                       softcap=kw["softcap"], bias_shape=kw["bias"].shape, alibi=True,
                       segment_ids=True, backend="cpu")
    assert p.exact is False and p.backend == "cpu"


# ---- bad input: a Python exception naming the problem, never a crash ----------------

def _qkv(rng, dtype="f32"):
    return (randn(rng, (1, 4, 8, 16), dtype), randn(rng, (1, 2, 8, 16), dtype),
            randn(rng, (1, 2, 8, 16), dtype))


@pytest.mark.parametrize("what, mutate, message", [
    ("rank", lambda q, k, v: (q[0], k, v), "q must have 4 dims"),
    ("dtype mix", lambda q, k, v: (q, k.astype(np.float16), v), "one dtype"),
    ("float64", lambda q, k, v: (q.astype(np.float64),) * 1 + (k.astype(np.float64), v.astype(np.float64)),
     "float32, float16 or bfloat16"),
    ("heads", lambda q, k, v: (q[:, :3], k, v), "not a multiple"),
    ("head dim", lambda q, k, v: (q[..., :8], k, v), "head_dim 16 but q has 8"),
    ("k vs v keys", lambda q, k, v: (q, k, v[:, :, :5]), "k has 8 keys but v has 5"),
    ("batch", lambda q, k, v: (q, np.concatenate([k, k]), v), "batch sizes differ"),
    ("not an array", lambda q, k, v: (q.tolist(), k, v), "q must be a numpy array"),
])
def test_bad_input_names_the_problem(rng, what, mutate, message):
    q, k, v = mutate(*_qkv(rng))
    with pytest.raises(ValueError, match=message):
        flashattn.attention(q, k, v)


@pytest.mark.parametrize("kw, message", [
    ({"window": (-2, 0)}, "window"),
    ({"window": 3}, "pair"),
    ({"softcap": -1.0}, "softcap"),
    ({"softcap": float("nan")}, "softcap"),
    ({"scale": float("inf")}, "scale"),
    ({"layout": "sbhd"}, "layout"),
    ({"bias": np.zeros((1, 4, 8, 7), np.float32)}, "bias"),
    ({"bias": np.zeros((3, 4, 8, 8), np.float32)}, "bias"),
    ({"alibi_slopes": np.ones(3, np.float32)}, "alibi_slopes"),
    ({"q_segment_ids": np.zeros((1, 8), np.int32)}, "both or neither"),
    ({"q_segment_ids": np.zeros((1, 8)), "kv_segment_ids": np.zeros((1, 8))}, "integers"),
])
def test_bad_options_name_the_problem(rng, kw, message):
    q, k, v = _qkv(rng)
    with pytest.raises(ValueError, match=message):
        flashattn.attention(q, k, v, **kw)


def test_bad_out(rng):
    q, k, v = _qkv(rng)
    with pytest.raises(ValueError, match="out must be"):
        flashattn.attention(q, k, v, out=np.empty((1, 4, 8, 8), np.float32))
    ro = np.empty(q.shape, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        flashattn.attention(q, k, v, out=ro)
    with pytest.raises(ValueError, match="overlap"):
        flashattn.attention(q, k, v, out=np.broadcast_to(np.empty((1, 1, 8, 16), np.float32), q.shape))


def test_bad_backward_input(rng):
    q, k, v = _qkv(rng)
    o, lse = flashattn.attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="lse must be"):
        flashattn.attention_backward(q, k, v, o, lse[:, :2], o)
    with pytest.raises(ValueError, match="do must be"):
        flashattn.attention_backward(q, k, v, o, lse, o[..., :4])


def test_f16_and_bf16_inputs_in_one_call_are_rejected(rng):
    if np_dtype("bf16") is None:
        pytest.skip("no ml_dtypes")
    q, k, v = _qkv(rng, "f16")
    with pytest.raises(ValueError, match="one dtype"):
        flashattn.attention(q, k.astype(np_dtype("bf16")), v)


def test_sizes_the_library_refuses_are_refused_before_any_copy_or_output():
    """A stride-0 view of 2**31 query rows (no memory) was copied, or its output reserved,
    before the library was asked: numpy's "Unable to allocate 512 GiB", where the library
    answers at once that sequence lengths are limited. Now the library's ValueError first,
    forward and backward; plan_varlen's batch likewise before its int32 arrays exist."""
    small = np.zeros((1, 1, 1, 64), np.float32)
    q = np.broadcast_to(small, (1, 1, 2**31, 64))
    kv = np.zeros((1, 1, 16, 64), np.float32)
    with pytest.raises(ValueError, match="sequence lengths are limited"):
        flashattn.attention(q, kv, kv)
    with pytest.raises(ValueError, match="sequence lengths are limited"):
        flashattn.attention_backward(q, kv, kv, q, np.zeros((1, 1, 2**31), np.float32)[..., :1], q)
    with pytest.raises(ValueError, match="batch = 1099511627776 is too large"):
        flashattn.plan_varlen(None, None, batch=2**40, heads=1, head_dim=8, total_q=4)


def test_out_with_a_reversed_dim_names_the_negative_stride(rng):
    """A writable, aligned, non-overlapping out[..., ::-1, :] was refused as if its elements
    overlapped; the message names the negative stride now."""
    q = rng.standard_normal((1, 2, 8, 16)).astype(np.float32)
    out = np.empty_like(q)
    with pytest.raises(ValueError, match="non-negative strides"):
        flashattn.attention(q, q, q, out=out[:, :, ::-1])
