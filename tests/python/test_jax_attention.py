"""flashattn.jax.attention against the float64 reference and jax.nn.dot_product_attention:
forward, gradients, every mask and option, f32/f16/bf16, both layouts.

Each test prints its seed (FA_TEST_SEED replays it). Inputs are rounded to the tested dtype
before the reference sees them, and the reference's backward takes the op's saved (rounded)
o for its row term, as the kernel does; the bounds are the suite's (conftest.py, the C
suite's): max|err| / max|ref|.
"""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import flashattn.jax as fj  # noqa: E402

from conftest import BWD_TOL, check, check_lse, fwd_tol  # noqa: E402
from jax_reference import assert_close, backward, forward, seeded_rng  # noqa: E402

JNP = {"f32": jnp.float32, "f16": jnp.float16, "bf16": jnp.bfloat16}


def _layout(x, layout):
    """A [B, H, S, D] array in layout."""
    return x if layout == "bhsd" else np.swapaxes(x, 1, 2)


def _make(rng, dtype, *, b=2, hq=4, hk=None, sq=48, sk=None, d=32, dv=None):
    hk = hq if hk is None else hk
    sk = sq if sk is None else sk
    dv = d if dv is None else dv
    q, k, v, do = (rng.standard_normal(shape).astype(np.float32)
                   for shape in ((b, hq, sq, d), (b, hk, sk, d), (b, hk, sk, dv), (b, hq, sq, dv)))
    # round to the dtype as the op sees it; the reference gets the rounded values
    q, k, v, do = (np.asarray(jnp.asarray(x, JNP[dtype]).astype(jnp.float32)) for x in (q, k, v, do))
    return q, k, v, do


CASES = {
    "dense": {},
    "causal": dict(causal=True),
    "causal_sq_lt_sk": dict(causal=True, shape=dict(sq=24, sk=40)),
    "causal_sq_gt_sk_empty_rows": dict(causal=True, shape=dict(sq=40, sk=24)),
    "window": dict(window=(8, 4)),
    "window_causal": dict(window=(6, 0), causal=True),
    "gqa": dict(shape=dict(hq=4, hk=2)),
    "mqa_causal": dict(causal=True, shape=dict(hq=4, hk=1)),
    "softcap": dict(softcap=5.0, scale=0.6),
    "bias_full": dict(bias=(2, 4)),
    "bias_heads": dict(bias=(1, 4)),
    "bias_2d_causal": dict(bias=(None, None), causal=True),
    "alibi": dict(alibi=True, causal=True),
    "segments": dict(segments=True),
    "dv_differs": dict(shape=dict(dv=24), scale=0.3),
}


def _options(rng, case, q, k):
    """(kwargs for attention in [B, H, S, D] terms, kwargs for the reference)."""
    b, hq, sq, _ = q.shape
    sk = k.shape[2]
    kw = {n: case[n] for n in ("causal", "window", "softcap", "scale") if n in case}
    ref = dict(kw)
    if "bias" in case:
        bb, bh = case["bias"]
        shape = (sq, sk) if bb is None else (bb, bh, sq, sk)
        kw["bias"] = rng.standard_normal(shape).astype(np.float32)
        ref["bias"] = kw["bias"].reshape((1, 1, sq, sk) if bb is None else shape)
    if case.get("alibi"):
        kw["alibi_slopes"] = ref["alibi_slopes"] = rng.uniform(0.05, 0.5, hq).astype(np.float32)
    if case.get("segments"):
        # sorted segments, as packed sequences are; every query sees its own segment's keys
        qs = np.sort(rng.integers(0, 3, (b, sq)), axis=1).astype(np.int32)
        ks = np.sort(rng.integers(0, 3, (b, sk)), axis=1).astype(np.int32)
        kw["q_segment_ids"], kw["kv_segment_ids"] = qs, ks
        ref["q_seg"], ref["kv_seg"] = qs, ks
    return kw, ref


def _run(case_name, dtype, layout, seed_name):
    case = CASES[case_name]
    rng = seeded_rng(seed_name)
    q, k, v, do = _make(rng, dtype, **case.get("shape", {}))
    kw, ref_kw = _options(rng, case, q, k)
    args = [jnp.asarray(_layout(x, layout), JNP[dtype]) for x in (q, k, v)]
    bias = kw.pop("bias", None)
    bias = None if bias is None else jnp.asarray(bias)

    def f(q_, k_, v_, bias_):
        return fj.attention(q_, k_, v_, bias=bias_, layout=layout, return_lse=True, **kw)

    (o, lse), vjp = jax.vjp(f, *args, bias)
    ct_o = jnp.asarray(_layout(do, layout), JNP[dtype])
    grads = vjp((ct_o, jnp.zeros_like(lse)))
    o_ref, lse_ref = forward(q, k, v, **ref_kw)
    assert o.dtype == JNP[dtype] and lse.dtype == jnp.float32
    o_bhsd = _layout(np.asarray(o.astype(jnp.float32)), layout)
    check("o", o_bhsd, o_ref, fwd_tol(dtype, lse_ref))
    check_lse(lse, lse_ref)
    g_ref = backward(q, k, v, do, o_saved=o_bhsd, **ref_kw)
    for name, g, gr in zip(("dq", "dk", "dv", "dbias"), grads, g_ref):
        assert g.dtype == (JNP[dtype] if name != "dbias" else jnp.float32)
        g = np.asarray(g.astype(jnp.float32))
        if name != "dbias":
            g = _layout(g, layout)
        else:
            gr = gr.reshape(g.shape)
        check(name, g, gr, BWD_TOL[dtype])


@pytest.mark.parametrize("case", sorted(CASES))
def test_f32_against_float64_reference(case):
    _run(case, "f32", "bshd", f"f32/{case}")


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("case", ["dense", "causal_sq_gt_sk_empty_rows", "gqa", "softcap", "bias_full",
                                  "segments", "window_causal"])
def test_half_precision_against_float64_reference(dtype, case):
    _run(case, dtype, "bshd", f"{dtype}/{case}")


@pytest.mark.parametrize("case", ["causal", "gqa", "bias_heads", "dv_differs"])
def test_bhsd_layout(case):
    _run(case, "f32", "bhsd", f"bhsd/{case}")


def test_empty_rows_give_zero_and_minus_inf():
    rng = seeded_rng("empty_rows")
    q, k, v, _ = _make(rng, "f32", sq=8, sk=4)
    o, lse = fj.attention(*(jnp.asarray(_layout(x, "bshd")) for x in (q, k, v)), causal=True, return_lse=True)
    # bottom-right: rows i < Sq - Sk = 4 see no key
    assert np.all(np.asarray(o)[:, :4] == 0) and np.all(np.isneginf(np.asarray(lse)[:, :, :4]))
    assert np.all(np.isfinite(np.asarray(o)))


# ---- against jax.nn.dot_product_attention where the semantics coincide ----------------

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hk", [4, 2])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_jax_nn_dot_product_attention(causal, hk, with_bias):
    rng = seeded_rng(f"jax_nn/causal={causal}/hk={hk}/bias={with_bias}")
    b, s, hq, d = 2, 40, 4, 16
    q = jnp.asarray(rng.standard_normal((b, s, hq, d)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((b, s, hk, d)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((b, s, hk, d)), jnp.float32)
    bias = jnp.asarray(rng.standard_normal((1, hq, s, s)), jnp.float32) if with_bias else None
    w = jnp.asarray(rng.standard_normal((b, s, hq, d)), jnp.float32)

    def loss(fn, q, k, v, bias):
        return jnp.sum(fn(q, k, v, bias=bias, is_causal=causal) * w)

    ours = lambda q, k, v, bias, is_causal: fj.attention(q, k, v, bias=bias, causal=is_causal)  # noqa: E731
    theirs = lambda q, k, v, bias, is_causal: jax.nn.dot_product_attention(  # noqa: E731
        q, k, v, bias=bias, is_causal=is_causal, implementation="xla")
    argnums = (0, 1, 2, 3) if with_bias else (0, 1, 2)
    o1 = ours(q, k, v, bias, causal)
    o2 = theirs(q, k, v, bias, causal)
    assert_close("o", o1, o2, 2e-6, 2e-6)
    g1 = jax.grad(lambda *a: loss(ours, *a), argnums)(q, k, v, bias)
    g2 = jax.grad(lambda *a: loss(theirs, *a), argnums)(q, k, v, bias)
    for name, a, r in zip(("dq", "dk", "dv", "dbias"), g1, g2):
        assert_close(name, a, r, 1e-5, 1e-5)


def test_diag_offset_and_bias_scale_as_numpy(rng):
    """flashattn.jax.attention takes diag_offset and bias_scale, as the numpy and torch
    attention (and fj.plan) do: the same bits as numpy's, the cost estimate with them too."""
    import flashattn
    q = rng.standard_normal((2, 7, 2, 16)).astype(np.float32)  # bshd, Sq 7 < Sk 11
    k, v = (rng.standard_normal((2, 11, 2, 16)).astype(np.float32) for _ in range(2))
    bias = rng.standard_normal((2, 2, 7, 11)).astype(np.float32)
    for off in (0, 3, -2):
        kw = dict(causal=True, bias=bias, bias_scale=0.5, diag_offset=off, layout="bshd")
        want, wl = flashattn.attention(q, k, v, return_lse=True, **kw)
        got, gl = fj.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), return_lse=True, **kw)
        assert np.array_equal(np.asarray(got), want) and np.array_equal(np.asarray(gl), wl), off
        ce = fj.cost_estimate(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), **kw)
        assert ce.flops == fj.plan(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), **kw).forward["flops"]
