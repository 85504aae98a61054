"""flashattn.jax.flash_attention, the drop-in for the Pallas TPU kernel, against that module's
own mha_reference (plain jnp; it runs on the CPU), forward and gradients for q, k, v and ab
(its mha_reference_no_custom_vjp for gradients with sm_scale != 1, which its backward lacks).

Inputs keep at least one visible key per row: there the two agree. On a row with none the
reference (a finite mask value) averages v uniformly and flashattn returns 0; the last test
pins that documented difference.
"""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

fa_tpu = pytest.importorskip("jax.experimental.pallas.ops.tpu.flash_attention")

import flashattn.jax as fj  # noqa: E402

from jax_reference import assert_close, seeded_rng  # noqa: E402


def _inputs(rng, b=2, h=3, sq=32, sk=32, d=16, with_ab=False, with_seg=False):
    q = jnp.asarray(rng.standard_normal((b, h, sq, d)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((b, h, sk, d)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((b, h, sk, d)), jnp.float32)
    ab = jnp.asarray(rng.standard_normal((b, h, sq, sk)), jnp.float32) if with_ab else None
    seg = None
    if with_seg:
        # key 0 and query 0 in segment 0, sorted segments: every query row sees a key
        # of its own segment, and, with causal, key 0... of it at or before it
        qs = np.sort(rng.integers(0, 3, (b, sq)), axis=1)
        qs[:, 0] = 0
        ks = qs.copy() if sq == sk else np.sort(rng.integers(0, 3, (b, sk)), axis=1)
        seg = (jnp.asarray(qs, jnp.int32), jnp.asarray(ks, jnp.int32))
    return q, k, v, ab, seg


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_ab", [False, True])
@pytest.mark.parametrize("with_seg", [False, True])
@pytest.mark.parametrize("sm_scale", [1.0, 0.25])
def test_matches_mha_reference(causal, with_ab, with_seg, sm_scale):
    rng = seeded_rng(f"pallas/causal={causal}/ab={with_ab}/seg={with_seg}/scale={sm_scale}")
    q, k, v, ab, seg = _inputs(rng, with_ab=with_ab, with_seg=with_seg)
    ours_seg = None if seg is None else fj.SegmentIds(*seg)
    theirs_seg = None if seg is None else fa_tpu.SegmentIds(*seg)
    o = fj.flash_attention(q, k, v, ab, ours_seg, causal=causal, sm_scale=sm_scale)
    with jax.default_matmul_precision("highest"):
        want = fa_tpu.mha_reference(q, k, v, ab, theirs_seg, causal=causal, sm_scale=sm_scale)
    assert o.shape == want.shape and o.dtype == want.dtype
    assert_close("o", o, want, 2e-6, 2e-6)
    # the Pallas module's SegmentIds is accepted too (one import changed, not two)
    if seg is not None:
        o2 = fj.flash_attention(q, k, v, ab, theirs_seg, causal=causal, sm_scale=sm_scale)
        assert_close("o (their SegmentIds)", o2, o, 0, 0)

    w = jnp.asarray(rng.standard_normal(o.shape), jnp.float32)
    argnums = (0, 1, 2, 3) if with_ab else (0, 1, 2)

    def loss(fn, seg_ids, *a):
        qq, kk, vv = a[:3]
        aa = a[3] if with_ab else None
        return jnp.sum(fn(qq, kk, vv, aa, seg_ids, causal=causal, sm_scale=sm_scale) * w)

    g1 = jax.grad(lambda *a: loss(fj.flash_attention, ours_seg, *a), argnums)(q, k, v, *([ab] if with_ab else []))
    # mha_reference's own backward raises NotImplementedError for sm_scale != 1; there the
    # module's mha_reference_no_custom_vjp (the same forward, plain autodiff) stands in
    ref = fa_tpu.mha_reference if sm_scale == 1.0 else fa_tpu.mha_reference_no_custom_vjp
    with jax.default_matmul_precision("highest"):
        g2 = jax.grad(lambda *a: loss(ref, theirs_seg, *a), argnums)(q, k, v, *([ab] if with_ab else []))
    for name, a, r in zip(("dq", "dk", "dv", "dab"), g1, g2):
        assert_close(name, a, r, 2e-5, 2e-5)


def test_causal_is_top_left_when_sq_differs_from_sk():
    rng = seeded_rng("pallas/top_left")
    q, k, v, _, _ = _inputs(rng, sq=16, sk=40)
    o = fj.flash_attention(q, k, v, causal=True, sm_scale=0.5)
    with jax.default_matmul_precision("highest"):
        want = fa_tpu.mha_reference(q, k, v, None, causal=True, sm_scale=0.5)
    assert_close("o", o, want, 2e-6, 2e-6)


def test_under_jit_with_bf16():
    rng = seeded_rng("pallas/bf16")
    q, k, v, ab, _ = _inputs(rng, with_ab=True)
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    f = jax.jit(lambda q, k, v, ab: fj.flash_attention(q, k, v, ab, causal=True, sm_scale=0.3))
    o = f(q, k, v, ab)
    with jax.default_matmul_precision("highest"):
        want = fa_tpu.mha_reference(*(x.astype(jnp.float32) for x in (q, k, v)), ab, causal=True, sm_scale=0.3)
    assert o.dtype == jnp.bfloat16
    assert_close("o", o.astype(jnp.float32), want, 1.6e-2, 1.6e-2)


def test_shape_errors_like_the_pallas_kernel():
    q = jnp.ones((1, 2, 8, 4))
    with pytest.raises(ValueError, match="Head count mismatch"):
        fj.flash_attention(q, jnp.ones((1, 1, 8, 4)), jnp.ones((1, 1, 8, 4)))
    with pytest.raises(ValueError, match="Attention bias shape mismatch"):
        fj.flash_attention(q, q, q, jnp.ones((1, 2, 8, 7)))
    with pytest.raises(NotImplementedError, match="V model dimension"):
        fj.flash_attention(q, q, jnp.ones((1, 2, 8, 5)))


@pytest.mark.parametrize("with_ab", [False, True])
def test_a_traced_sm_scale_is_refused_naming_sm_scale(with_ab):
    # it was "scale must be a Python number": the drop-in has no argument of that name
    q = jnp.ones((1, 2, 8, 4))
    ab = jnp.zeros((1, 2, 8, 8)) if with_ab else None
    with pytest.raises(ValueError, match=r"^sm_scale must be a Python number \(a static value\)"):
        jax.jit(lambda s: fj.flash_attention(q, q, q, ab=ab, sm_scale=s))(0.5)
    with pytest.raises(ValueError, match="^sm_scale must be finite"):
        fj.flash_attention(q, q, q, ab=ab, sm_scale=float("inf"))


def test_fully_masked_rows_differ_as_documented():
    # query 0 in a segment with no keys: the reference averages v, flashattn gives 0
    rng = seeded_rng("pallas/masked_row")
    q, k, v, _, _ = _inputs(rng, b=1, h=1, sq=4, sk=4)
    qs = jnp.asarray([[5, 1, 1, 1]], jnp.int32)
    ks = jnp.asarray([[1, 1, 1, 1]], jnp.int32)
    o = fj.flash_attention(q, k, v, None, fj.SegmentIds(qs, ks))
    want = fa_tpu.mha_reference(q, k, v, None, fa_tpu.SegmentIds(qs, ks))
    assert np.all(np.asarray(o)[0, 0, 0] == 0)
    assert_close("reference row 0 = mean of v", want[0, 0, 0], jnp.mean(v[0, 0], axis=0), 1e-6, 1e-6)
    assert_close("other rows", o[0, 0, 1:], want[0, 0, 1:], 1e-5, 1e-5)
