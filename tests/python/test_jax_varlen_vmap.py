"""flashattn.jax.varlen_attention under jax.vmap (docs/semantics.md, "Dropout"): with one
dropout seed, mapped index n's sequences draw the masks of one packed batch of every index's
sequences in turn (b = n * batch + s; nested vmaps: n the flattened index), forward and
backward alike, as flashattn.jax.attention's vmapped indices draw the folded batch's; a
vmapped seed gives each index its own masks; without dropout each index is its own call,
lengths mapped too. And the message for empty prefix sums given as lists."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import flashattn.jax as fj  # noqa: E402

H, HK, D = 4, 2, 8


def _same(name, got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), \
        f"{name}: max |diff| {np.abs(got.astype(np.float64) - want).max()}"


def _packed(rng, lead, batch):
    """q [*lead, Tq, H, D], k, v [*lead, Tk, HK, D], do like o, and one pair of prefix sums
    (every index's), with an empty sequence among them."""
    lq = rng.integers(1, 7, batch)
    lk = lq + rng.integers(0, 4, batch)
    lq[1] = lk[1] = 0
    cq, ck = (np.concatenate([[0], np.cumsum(x)]).astype(np.int32) for x in (lq, lk))
    q, do = (jnp.asarray(rng.standard_normal(lead + (int(cq[-1]), H, D)), jnp.float32) for _ in range(2))
    k, v = (jnp.asarray(rng.standard_normal(lead + (int(ck[-1]), HK, D)), jnp.float32) for _ in range(2))
    return q, k, v, do, cq, ck


def _concatenated(x, n):
    return x.reshape((n * x.shape[-3],) + x.shape[-2:])


def _concatenated_sums(cu, n):
    """One packed batch of n copies of the sequences cu describes, index 1's after index 0's."""
    return np.concatenate([cu[:1]] + [cu[1:] + i * cu[-1] for i in range(n)]).astype(np.int32)


def _grads(f, q, k, v, do):
    return jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * do), argnums=(0, 1, 2))(q, k, v)


@pytest.mark.parametrize("kind", ["plain", "causal_sinks", "jit"])
@pytest.mark.parametrize("lead", [(3,), (2, 3)], ids=["vmap", "nested_vmap"])
def test_one_seed_draws_the_concatenated_batch(rng, kind, lead):
    """vmap (nested: vmap of vmap) with one seed == one call over the concatenated packed
    batch, bit for bit, forward, grad of the vmapped loss and vmap of per-index grads."""
    q, k, v, do, cq, ck = _packed(rng, lead, 4)
    n = int(np.prod(lead))
    kw = dict(dropout_p=0.4, seed=int(rng.integers(1 << 31)), dropout_offset=3)
    if kind == "causal_sinks":
        kw.update(causal=True, sinks=jnp.asarray(rng.standard_normal(H), jnp.float32))
    one = lambda q, k, v: fj.varlen_attention(q, k, v, cq, ck, **kw)  # noqa: E731
    f = _vmapped(one, lead)
    if kind == "jit":
        f = jax.jit(f)
    cat_q, cat_k = _concatenated_sums(cq, n), _concatenated_sums(ck, n)
    whole = lambda q, k, v: fj.varlen_attention(q, k, v, cat_q, cat_k, **kw)  # noqa: E731
    qc, kc, vc, doc = (_concatenated(x, n) for x in (q, k, v, do))
    _same("o", _concatenated(f(q, k, v), n), whole(qc, kc, vc))
    want = _grads(whole, qc, kc, vc, doc)
    for name, g, w in zip(("dq", "dk", "dv"), _grads(f, q, k, v, do), want):
        _same(f"grad(vmap) {name}", _concatenated(g, n), w)
    per = _vmapped(lambda q, k, v, do: _grads(one, q, k, v, do), lead)
    for name, g, w in zip(("dq", "dk", "dv"), per(q, k, v, do), want):
        _same(f"vmap(grad) {name}", _concatenated(g, n), w)
    if kind == "causal_sinks":  # dsink: the vmapped loss's sums every index's, as the whole call's
        with_sinks = lambda s: lambda q, k, v: fj.varlen_attention(q, k, v, cq, ck, **{**kw, "sinks": s})  # noqa: E731
        ds = jax.grad(lambda s: jnp.sum(_vmapped(with_sinks(s), lead)(q, k, v) * do))(kw["sinks"])
        ds_whole = jax.grad(lambda s: jnp.sum(fj.varlen_attention(qc, kc, vc, cat_q, cat_k, **{**kw, "sinks": s})
                                              * doc))(kw["sinks"])
        np.testing.assert_allclose(np.asarray(ds), np.asarray(ds_whole), rtol=1e-5, atol=1e-5)
    # index 1 does not draw index 0's masks again (b restarting at 0 in each index's call did)
    flat = [x.reshape((n,) + x.shape[len(lead):]) for x in (q, k, v, f(q, k, v))]
    assert not np.array_equal(np.asarray(flat[3][1]), np.asarray(one(*(x[1] for x in flat[:3]))))


def _vmapped(f, lead):
    for _ in lead:
        f = jax.vmap(f)
    return f


@pytest.mark.parametrize("lead", [(3,), (2, 3)], ids=["vmap", "nested_vmap"])
def test_vmapped_seed_is_each_index_own(rng, lead):
    """A seed mapped with the inputs: index n draws as an unvmapped call with its seed (b
    from 0), forward and gradients."""
    q, k, v, do, cq, ck = _packed(rng, lead, 3)
    n = int(np.prod(lead))
    seeds = jnp.asarray(rng.integers(0, 1 << 31, lead), jnp.int32)
    one = lambda q, k, v, s: fj.varlen_attention(q, k, v, cq, ck, dropout_p=0.3, seed=s)  # noqa: E731
    o = _vmapped(one, lead)(q, k, v, seeds)
    g = _vmapped(lambda q, k, v, do, s: _grads(lambda q, k, v: one(q, k, v, s), q, k, v, do), lead)(q, k, v, do, seeds)
    flat = [x.reshape((n,) + x.shape[len(lead):]) for x in (q, k, v, do, seeds, o) + tuple(g)]
    for i in range(n):
        qi, ki, vi, doi, si = (x[i] for x in flat[:5])
        _same(f"o[{i}]", flat[5][i], one(qi, ki, vi, int(si)))
        for name, got, w in zip(("dq", "dk", "dv"), flat[6:], _grads(lambda q, k, v: one(q, k, v, int(si)),
                                                                     qi, ki, vi, doi)):
            _same(f"{name}[{i}]", got[i], w)


@pytest.mark.parametrize("seed_level", ["outer", "inner"])
@pytest.mark.parametrize("front", ["varlen", "attention"])
def test_seed_mapped_at_one_nested_level(rng, seed_level, front):
    """Nested vmaps with the seed mapped along one level only: the indices that share a seed
    (along the other level) draw the masks one vmap over them with that seed draws, not one
    mask each time (they drew identical masks: the handlers numbered b only where the seed
    was mapped nowhere), forward and gradients; dense attention and packed batches alike."""
    if front == "varlen":
        q, k, v, do, cq, ck = _packed(rng, (2, 3), 3)
        one = lambda q, k, v, s: fj.varlen_attention(q, k, v, cq, ck, dropout_p=0.4, seed=s)  # noqa: E731
    else:
        q, k, v, do = (jnp.asarray(rng.standard_normal((2, 3, 2, 9, H, D)), jnp.float32) for _ in range(4))
        one = lambda q, k, v, s: fj.attention(q, k, v, dropout_p=0.4, seed=s)  # noqa: E731
    seeds = jnp.asarray(rng.integers(0, 1 << 31, 2 if seed_level == "outer" else 3), jnp.int32)
    if seed_level == "outer":  # outer maps (inputs, seed), inner maps the inputs under one seed
        f = jax.vmap(lambda q, k, v, s: jax.vmap(lambda q, k, v: one(q, k, v, s))(q, k, v))
        o = f(q, k, v, seeds)
        dq = jax.grad(lambda q: jnp.sum(f(q, k, v, seeds) * do))(q)
        for a in range(2):
            inner = lambda q, k, v: jax.vmap(lambda q, k, v: one(q, k, v, int(seeds[a])))(q, k, v)  # noqa: E731
            _same(f"o[{a}]", o[a], inner(q[a], k[a], v[a]))
            _same(f"dq[{a}]", dq[a], jax.grad(lambda x: jnp.sum(inner(x, k[a], v[a]) * do[a]))(q[a]))
    else:  # inner maps (inputs, seed), outer maps the inputs alone: the seed shared along the outer level
        f = jax.vmap(lambda q, k, v: jax.vmap(one)(q, k, v, seeds))
        o = f(q, k, v)
        for b in range(3):
            _same(f"o[:, {b}]", o[:, b], jax.vmap(lambda q, k, v: one(q, k, v, int(seeds[b])))(q[:, b], k[:, b],
                                                                                                 v[:, b]))
    assert not np.array_equal(np.asarray(o[0, 0]), np.asarray(o[1, 0] if seed_level == "inner" else o[0, 1]))


def test_without_dropout_each_index_is_its_own_call(rng):
    """No dropout: the vmapped results are the unvmapped calls', bit for bit, with q alone
    mapped (k, v broadcast), with the prefix sums mapped too (each index its own lengths)
    and nested."""
    q, k, v, do, cq, ck = _packed(rng, (3,), 4)
    f = lambda q, k, v, cq, ck: fj.varlen_attention(q, k, v, cq, ck, causal=True)  # noqa: E731
    o = jax.vmap(f, in_axes=(0, None, None, None, None))(q, k[0], v[0], cq, ck)
    for i in range(3):
        _same(f"o[{i}] (q mapped)", o[i], f(q[i], k[0], v[0], cq, ck))
    # lengths per index: the same totals, split differently
    cqs = np.stack([cq, np.array([0, 0, cq[-1], cq[-1], cq[-1]], np.int32), np.array([0] + [cq[-1]] * 4, np.int32)])
    cks = np.stack([ck, ck, ck])
    o = jax.vmap(f)(q, k, v, cqs, cks)
    g = jax.vmap(lambda q, k, v, do, a, b: _grads(lambda q, k, v: f(q, k, v, a, b), q, k, v, do))(q, k, v, do, cqs, cks)
    for i in range(3):
        _same(f"o[{i}] (lengths mapped)", o[i], f(q[i], k[i], v[i], cqs[i], cks[i]))
        for name, got, w in zip(("dq", "dk", "dv"), g, _grads(lambda q, k, v: f(q, k, v, cqs[i], cks[i]),
                                                               q[i], k[i], v[i], do[i])):
            _same(f"{name}[{i}]", got[i], w)
    # ALiBi slopes and sinks mapped too (each index its own, dsink its own)
    sl, sk = jnp.asarray(rng.random((3, H)), jnp.float32), jnp.asarray(rng.standard_normal((3, H)), jnp.float32)
    h = lambda q, s, z: fj.varlen_attention(q, k[0], v[0], cq, ck, alibi_slopes=jax.lax.stop_gradient(s),  # noqa: E731
                                            sinks=z, causal=True)
    dh = jax.grad(lambda q, s, z, do: jnp.sum(h(q, s, z) * do), argnums=(0, 2))  # noqa: E731
    o, g = jax.vmap(h)(q, sl, sk), jax.vmap(dh)(q, sl, sk, do)
    for i in range(3):
        _same(f"o[{i}] (slopes, sinks mapped)", o[i], h(q[i], sl[i], sk[i]))
        for name, got, w in zip(("dq", "dsink"), g, dh(q[i], sl[i], sk[i], do[i])):
            _same(f"{name}[{i}] (slopes, sinks mapped)", got[i], w)
    qn = jnp.stack([q[:2], q[1:]])
    o = jax.vmap(jax.vmap(lambda q: f(q, k[0], v[0], cq, ck)))(qn)
    for i in range(2):
        for j in range(2):
            _same(f"o[{i}, {j}] (nested)", o[i, j], f(qn[i, j], k[0], v[0], cq, ck))


def test_empty_prefix_sums_as_lists_report_their_shape():
    """[] for the prefix sums is refused for its shape, as numpy's front does, not for a
    float32 dtype that JAX's conversion of [] would give (the user gave none)."""
    x = jnp.zeros((4, 2, 8), jnp.float32)
    with pytest.raises(ValueError, match=r"must both be \[batch \+ 1\], got shapes \(0,\) and \(0,\)"):
        fj.varlen_attention(x, x, x, [], [])
