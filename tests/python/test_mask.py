"""mask= (boolean, True = attend, broadcastable to [B, H, Sq, Sk], ANDed with causal, window
and segment ids) in the numpy and JAX fronts and the plans, against the float64 reference
with the mask as a -inf bias; a boolean bias= raises TypeError pointing to mask=."""
import numpy as np
import pytest

import flashattn
import reference as ref
from conftest import FWD_TOL, BWD_TOL, randn, rel_err

B, H, SQ, SK, D = 2, 3, 7, 9, 8
# every broadcast shape a mask may have (size-1 Sq and Sk too), fewer dims included
SHAPES = [(B, H, SQ, SK), (1, H, SQ, SK), (B, 1, SQ, SK), (B, 1, 1, SK), (1, 1, SQ, 1), (SQ, SK), (SK,),
          (1, 1, 1, 1)]


def _mask(rng, shape):
    m = rng.random(shape) < 0.6
    return m


def _as_bias(mask):
    return np.where(mask, 0.0, -np.inf)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_numpy_mask_forward_backward(rng, shape, causal):
    q, k, v = randn(rng, (B, H, SQ, D)), randn(rng, (B, H, SK, D)), randn(rng, (B, H, SK, D))
    bias = randn(rng, (1, H, SQ, SK))
    mask = _mask(rng, shape)
    o, lse = flashattn.attention(q, k, v, mask=mask, bias=bias, causal=causal, window=(3, None), return_lse=True)
    full_bias = bias + _as_bias(mask)
    o_ref, lse_ref, _ = ref.forward(q, k, v, bias=full_bias, causal=causal, window=(3, -1))
    assert rel_err(o, o_ref) <= FWD_TOL["f32"]
    assert np.array_equal(np.isneginf(lse), np.isneginf(lse_ref))
    do = randn(rng, o.shape)
    dq, dk, dv, dbias = flashattn.attention_backward(q, k, v, o, lse, do, mask=mask, bias=bias, causal=causal,
                                                     window=(3, None), bias_grad=True)
    want = ref.backward(q, k, v, do, bias=full_bias, causal=causal, window=(3, -1))
    # within BWD_TOL of max|ref|, or, where a gradient cancels to 0 (every row seeing one key:
    # FA_TEST_SEED=770305289), within the roundoff of the terms that cancel in it
    floors = ref.cancel_floor(q, k, v, do, bias.shape, bias=full_bias, causal=causal, window=(3, -1))
    for got, w, floor in zip((dq, dk, dv), want[:3], floors[:2] + (0.0,)):
        assert rel_err(got, w) <= BWD_TOL["f32"] or np.abs(got - w).max() <= floor, (rel_err(got, w), floor)
    assert dbias.shape == bias.shape
    w = want[3].sum(0, keepdims=True)
    assert rel_err(dbias, w) <= BWD_TOL["f32"] or np.abs(dbias - w).max() <= floors[2], (rel_err(dbias, w), floors[2])


def test_numpy_mask_with_segment_ids_and_gqa(rng):
    q, k, v = randn(rng, (B, 4, SQ, D)), randn(rng, (B, 2, SK, D)), randn(rng, (B, 2, SK, D))
    qs, ks = rng.integers(0, 2, (B, SQ)), rng.integers(0, 2, (B, SK))
    mask = _mask(rng, (B, 4, SQ, SK))
    o = flashattn.attention(q, k, v, mask=mask, q_segment_ids=qs, kv_segment_ids=ks)
    o_ref, _, _ = ref.forward(q, k, v, bias=_as_bias(mask), q_segment_ids=qs, kv_segment_ids=ks)
    assert rel_err(o, o_ref) <= FWD_TOL["f32"]


def test_boolean_bias_raises_type_error_naming_mask(rng):
    q = randn(rng, (1, 1, 4, D))
    with pytest.raises(TypeError, match="mask="):
        flashattn.attention(q, q, q, bias=np.ones((4, 4), bool))
    with pytest.raises(TypeError, match="boolean"):
        flashattn.attention(q, q, q, mask=np.ones((4, 4), np.float32))
    with pytest.raises(ValueError, match="broadcast"):
        flashattn.attention(q, q, q, mask=np.ones((3, 4), bool))


def test_plan_with_mask_is_not_exact():
    base = dict(batch=2, heads=4, seq_q=64, head_dim=32)
    assert flashattn.plan(**base).exact
    p = flashattn.plan(mask_shape=(2, 1, 1, 64), **base)
    assert not p.exact
    same = flashattn.plan(bias_shape=(2, 1, 1, 64), **base)  # one bias row for all query rows (bias_seq_q)
    assert p.forward == same.forward  # the work is the biased problem's: only "exact" differs


def test_jax_mask_matches_reference(rng):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import flashattn.jax as fj
    q, k, v = randn(rng, (B, H, SQ, D)), randn(rng, (B, H, SK, D)), randn(rng, (B, H, SK, D))
    for shape in SHAPES:
        mask = _mask(rng, shape)
        o = fj.attention(*(jnp.asarray(x) for x in (q, k, v)), mask=jnp.asarray(mask), layout="bhsd", causal=True)
        o_ref, _, _ = ref.forward(q, k, v, bias=_as_bias(mask), causal=True)
        assert rel_err(np.asarray(o), o_ref) <= FWD_TOL["f32"], shape
    bias = randn(rng, (1, H, SQ, SK))
    mask = _mask(rng, (B, 1, 1, SK))
    loss = lambda q, b: jnp.sum(fj.attention(q, k, v, bias=b, mask=mask, layout="bhsd") ** 2)  # noqa: E731
    dq, db = jax.grad(loss, argnums=(0, 1))(jnp.asarray(q), jnp.asarray(bias))
    o_ref, _, _ = ref.forward(q, k, v, bias=bias + _as_bias(mask))
    want = ref.backward(q, k, v, 2 * o_ref, bias=bias + _as_bias(mask))
    assert rel_err(np.asarray(dq), want[0]) <= BWD_TOL["f32"]
    assert rel_err(np.asarray(db), want[3].sum(0, keepdims=True)) <= BWD_TOL["f32"]
    with pytest.raises(TypeError, match="mask="):
        fj.attention(q, k, v, bias=jnp.ones((SQ, SK), bool), layout="bhsd")
    assert not fj.plan(q, k, v, mask=mask, layout="bhsd").exact


def _scaled_mask_case(rng, with_bias):
    q, k, v = randn(rng, (B, H, SQ, D)), randn(rng, (B, H, SK, D)), randn(rng, (B, H, SK, D))
    bias = randn(rng, (1, H, SQ, SK)) if with_bias else None
    mask = _mask(rng, (B, 1, SQ, SK))
    mask[0, 0, 2] = False  # a row with no visible key
    return q, k, v, bias, mask


def _scaled_mask_reference(q, k, v, do, bias, mask, bias_scale):
    """(o, lse, dq, dk, dv, dbias) in f64 for bias_scale * bias plus the mask (bias_scale scales
    the bias alone: a hidden key stays hidden whatever the scale); dbias = bias_scale * d/d(the
    scaled bias), summed over the bias's broadcast batch dim."""
    full = _as_bias(mask) + (0.0 if bias is None else bias_scale * bias.astype(np.float64))
    o, lse, _ = ref.forward(q, k, v, bias=full)
    dq, dk, dv, db4 = ref.backward(q, k, v, do, bias=full)
    return o, lse, dq, dk, dv, (bias_scale or 0.0) * db4.sum(0, keepdims=True)


@pytest.mark.parametrize("bias_scale", [-1.0, 0.0, 0.5])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_numpy_mask_with_bias_scale(rng, bias_scale, with_bias):
    """A mask with bias_scale <= 0 once gave NaN rows (the scale reached the mask's -inf):
    the scale applies to the bias alone, forward and backward, dbias times bias_scale. Without
    a bias there is nothing to scale: bias_scale is refused (ValueError), as the library
    refuses it (it vanished without a word), and the mask runs without it."""
    q, k, v, bias, mask = _scaled_mask_case(rng, with_bias)
    if not with_bias:
        with pytest.raises(ValueError, match="bias_scale needs a bias"):
            flashattn.attention(q, k, v, mask=mask, bias_scale=bias_scale)
        with pytest.raises(ValueError, match="bias_scale needs a bias"):
            flashattn.attention_backward(q, k, v, q, q[..., 0], q, mask=mask, bias_scale=bias_scale)
        bias_scale = None
    o, lse = flashattn.attention(q, k, v, bias=bias, mask=mask, bias_scale=bias_scale, return_lse=True)
    do = randn(rng, o.shape)
    o_ref, lse_ref, *want = _scaled_mask_reference(q, k, v, do, bias, mask, bias_scale)
    assert rel_err(o, o_ref) <= FWD_TOL["f32"]
    assert np.array_equal(np.isneginf(lse), np.isneginf(lse_ref))
    got = flashattn.attention_backward(q, k, v, o, lse, do, bias=bias, mask=mask, bias_scale=bias_scale,
                                       bias_grad=with_bias)
    assert len(got) == 3 + with_bias
    for name, g, w in zip(("dq", "dk", "dv", "dbias"), got, want):
        assert rel_err(g, w) <= BWD_TOL["f32"], name


@pytest.mark.parametrize("bias_scale", [-1.0, 0.0, 0.5])
def test_jax_mask_with_bias_scale(rng, bias_scale):
    """The same through the JAX front's shared lowering (flashattn.jax's call, which takes
    bias_scale for the Pallas drop-in): forward and jax.grad for q, k, v and the bias."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from flashattn.jax import _attention
    q, k, v, bias, mask = _scaled_mask_case(rng, True)
    do = randn(rng, (B, H, SQ, D))
    o_ref, _, *want = _scaled_mask_reference(q, k, v, do, bias, mask, bias_scale)

    def f(q, k, v, b):
        return _attention.call(q, k, v, bias=b, mask=jnp.asarray(mask), bias_scale=bias_scale, layout="bhsd")

    o, vjp = jax.vjp(f, *(jnp.asarray(x) for x in (q, k, v, bias)))
    assert rel_err(np.asarray(o), o_ref) <= FWD_TOL["f32"]
    for name, g, w in zip(("dq", "dk", "dv", "dbias"), vjp(jnp.asarray(do)), want):
        assert rel_err(np.asarray(g), w) <= BWD_TOL["f32"], name
    p = _attention.make_options(*(jnp.asarray(x) for x in (q, k, v)), bias=jnp.asarray(bias), mask=jnp.asarray(mask),
                                bias_scale=bias_scale, layout="bhsd")[0]
    assert p.bias_scale is None  # folded into the bias the op gets


@pytest.mark.parametrize("front", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("hidden, bias_scale", [(np.nan, None), (np.inf, None), (-np.inf, -1.0), (-np.inf, 0.0)])
def test_mask_hides_a_nonfinite_bias(rng, front, hidden, bias_scale):
    """A key the mask hides stays hidden whatever its bias entry holds (NaN, +-inf) and
    whatever bias_scale is, as causal= and jax.nn's mask= hide it (docs/nonfinite.md): the
    fronts lower the mask with where(), not bias + -inf, which is NaN there. o, lse and the
    gradients against the reference with the hidden entries' bias irrelevant (finite)."""
    q, k, v, do = (randn(rng, (1, 2, SQ, D)), randn(rng, (1, 2, SK, D)), randn(rng, (1, 2, SK, D)),
                   randn(rng, (1, 2, SQ, D)))
    mask = _mask(rng, (SQ, SK))
    mask[:, 0] = True  # every row sees a key
    finite = randn(rng, (1, 2, SQ, SK))
    bias = np.where(mask, finite, hidden).astype(np.float32)
    s = 1.0 if bias_scale is None else bias_scale
    want_bias = np.where(mask, s * finite.astype(np.float64), -np.inf)
    o_ref, lse_ref, _ = ref.forward(q, k, v, bias=want_bias)
    grads_ref = ref.backward(q, k, v, do, bias=want_bias)
    kw = dict(bias_scale=bias_scale)
    if front == "numpy":
        o, lse = flashattn.attention(q, k, v, bias=bias, mask=mask, return_lse=True, **kw)
        grads = flashattn.attention_backward(q, k, v, o, lse, do, bias=bias, mask=mask, **kw)
    elif front == "torch":
        torch = pytest.importorskip("torch")
        import flashattn.torch as fat
        t = [torch.from_numpy(a).requires_grad_() for a in (q, k, v)]
        o, lse = fat.attention(*t, bias=torch.from_numpy(bias), mask=torch.from_numpy(mask), return_lse=True, **kw)
        o.backward(torch.from_numpy(do))
        o, lse, grads = o.detach().numpy(), lse.detach().numpy(), [x.grad.numpy() for x in t]
    else:
        pytest.importorskip("jax")
        import jax
        import flashattn.jax as fj
        f = lambda q, k, v: fj.attention(q, k, v, bias=bias, mask=mask, layout="bhsd", **kw)  # noqa: E731
        o, vjp = jax.vjp(f, q, k, v)
        grads = vjp(do)
        lse = fj.attention(q, k, v, bias=bias, mask=mask, layout="bhsd", return_lse=True, **kw)[1]
        o, lse, grads = np.asarray(o), np.asarray(lse), [np.asarray(g) for g in grads]
    assert rel_err(o, o_ref) < FWD_TOL["f32"] and rel_err(lse, lse_ref) < FWD_TOL["f32"]
    for name, g, r in zip(("dq", "dk", "dv"), grads, grads_ref):
        assert rel_err(g, r) < BWD_TOL["f32"], name
