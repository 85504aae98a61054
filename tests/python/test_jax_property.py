"""Property test: random shapes, masks and options through flashattn.jax.attention (forward
and gradients) against the float64 reference. hypothesis draws the case; the data come
from a seeded generator (the seed is part of the drawn case and printed on failure)."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
hypothesis = pytest.importorskip("hypothesis")
import jax.numpy as jnp  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402

import flashattn.jax as fj  # noqa: E402

from jax_reference import assert_close, backward, forward  # noqa: E402


@st.composite
def cases(draw):
    hk = draw(st.sampled_from([1, 2]))
    c = dict(b=draw(st.integers(1, 2)), hk=hk, hq=hk * draw(st.sampled_from([1, 2])),
             sq=draw(st.integers(1, 33)), sk=draw(st.integers(1, 33)), d=draw(st.sampled_from([8, 16, 24])),
             dv=draw(st.sampled_from([8, 16])), causal=draw(st.booleans()),
             window=draw(st.sampled_from([(-1, -1), (3, -1), (-1, 2), (4, 4), (0, 0)])),
             softcap=draw(st.sampled_from([0.0, 4.0])), bias=draw(st.sampled_from([None, "full", "shared"])),
             alibi=draw(st.booleans()), segments=draw(st.booleans()), layout=draw(st.sampled_from(["bshd", "bhsd"])),
             seed=draw(st.integers(0, 2**31 - 1)))
    return c


@settings(max_examples=15, deadline=None, derandomize=False)
@given(cases())
def test_random_problems_against_float64_reference(c):
    print(f"case {c} (seed {c['seed']})")
    rng = np.random.default_rng(c["seed"])
    b, hq, hk, sq, sk, d, dv = (c[n] for n in ("b", "hq", "hk", "sq", "sk", "d", "dv"))
    q = rng.standard_normal((b, hq, sq, d)).astype(np.float32)
    k = rng.standard_normal((b, hk, sk, d)).astype(np.float32)
    v = rng.standard_normal((b, hk, sk, dv)).astype(np.float32)
    do = rng.standard_normal((b, hq, sq, dv)).astype(np.float32)
    kw = dict(causal=c["causal"], window=c["window"], softcap=c["softcap"])
    ref = dict(kw)
    bias = None
    if c["bias"]:
        bias = rng.standard_normal((b, hq, sq, sk) if c["bias"] == "full" else (1, 1, sq, sk)).astype(np.float32)
        ref["bias"] = bias
    if c["alibi"]:
        kw["alibi_slopes"] = ref["alibi_slopes"] = rng.uniform(0.05, 0.5, hq).astype(np.float32)
    if c["segments"]:
        qs = rng.integers(0, 2, (b, sq)).astype(np.int32)
        ks = rng.integers(0, 2, (b, sk)).astype(np.int32)
        kw["q_segment_ids"], kw["kv_segment_ids"] = qs, ks
        ref["q_seg"], ref["kv_seg"] = qs, ks
    t = (lambda x: x) if c["layout"] == "bhsd" else (lambda x: np.swapaxes(x, 1, 2))

    def f(q_, k_, v_, bias_):
        return fj.attention(q_, k_, v_, bias=bias_, layout=c["layout"], return_lse=True, **kw)

    (o, lse), vjp = jax.vjp(f, jnp.asarray(t(q)), jnp.asarray(t(k)), jnp.asarray(t(v)),
                            None if bias is None else jnp.asarray(bias))
    o_ref, lse_ref = forward(q, k, v, **ref)
    assert_close("o", t(np.asarray(o)), o_ref, 2e-6, 2e-6)
    assert_close("lse", lse, lse_ref, 1e-5, 1e-5)
    grads = vjp((jnp.asarray(t(do)), jnp.zeros_like(lse)))
    g_ref = backward(q, k, v, do, **ref)
    for name, g, gr in zip(("dq", "dk", "dv", "dbias"), grads, g_ref):
        g = np.asarray(g) if name == "dbias" else t(np.asarray(g))
        # a gradient can vanish by cancellation (dq = 0 with one visible key): its scale is
        # then that of the O(1) terms that cancel, not of the result
        assert_close(name, g, gr, 1e-5, 1e-5, scale_floor=1.0)
