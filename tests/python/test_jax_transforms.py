"""flashattn.jax.attention under jit, grad and vmap (folded into the batch, or one call per
vmapped index when an input is shared), and bad input raising errors that name the problem.
"""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import flashattn.jax as fj  # noqa: E402
from flashattn import masks  # noqa: E402

from jax_reference import assert_close, backward, forward, seeded_rng  # noqa: E402


def _bshd(rng, b, s, h, d):
    return jnp.asarray(rng.standard_normal((b, s, h, d)), jnp.float32)


def _ref(q, k, v, **kw):
    """The float64 reference on [B, S, H, D] arrays; o back in [B, S, H, D]."""
    t = lambda x: np.swapaxes(np.asarray(x, np.float64), 1, 2)  # noqa: E731
    return np.swapaxes(forward(t(q), t(k), t(v), **kw)[0], 1, 2)


def test_jit_matches_eager_and_reference():
    rng = seeded_rng("jit")
    q, k, v = (_bshd(rng, 2, 32, 4, 16) for _ in range(3))
    f = jax.jit(lambda q, k, v: fj.attention(q, k, v, causal=True, window=(5, 0)))
    o = f(q, k, v)
    assert_close("o(jit)", o, fj.attention(q, k, v, causal=True, window=(5, 0)), 0, 0)
    assert_close("o", o, _ref(q, k, v, causal=True, window=(5, 0)), 2e-6, 2e-6)
    # the compiled module calls the FFI target, not a Python callback
    text = f.lower(q, k, v).as_text()
    assert "flashattn_forward" in text


def test_grad_under_jit_matches_reference():
    rng = seeded_rng("grad_jit")
    q, k, v, w = (_bshd(rng, 1, 24, 2, 8) for _ in range(4))
    g = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fj.attention(q, k, v, softcap=3.0) * w), argnums=(0, 1, 2)))
    t = lambda x: np.swapaxes(np.asarray(x, np.float64), 1, 2)  # noqa: E731
    want = backward(t(q), t(k), t(v), t(w), softcap=3.0)
    for name, a, r in zip(("dq", "dk", "dv"), g(q, k, v), want):
        assert_close(name, np.swapaxes(np.asarray(a), 1, 2), r, 1e-5, 1e-5)


@pytest.mark.parametrize("mapped", ["all", "q_only", "kv_only"])
def test_vmap_forward_and_grad(mapped):
    rng = seeded_rng(f"vmap/{mapped}")
    n, b, s, h, d = 3, 2, 16, 2, 8
    q, k, v = (jnp.asarray(rng.standard_normal((n, b, s, h, d)), jnp.float32) for _ in range(3))
    axes = {"all": (0, 0, 0), "q_only": (0, None, None), "kv_only": (None, 0, 0)}[mapped]
    args = [x if a == 0 else x[0] for x, a in zip((q, k, v), axes)]
    f = lambda q, k, v: fj.attention(q, k, v, causal=True)  # noqa: E731
    o = jax.vmap(f, in_axes=axes)(*args)
    for i in range(n):
        sl = [x[i] if a == 0 else x for x, a in zip(args, axes)]
        assert_close(f"o[{i}]", o[i], _ref(*sl, causal=True), 2e-6, 2e-6)
    # gradients of a vmapped loss equal the per-example gradients, summed where shared
    loss = lambda *a: jnp.sum(jax.vmap(f, in_axes=axes)(*a) ** 2)  # noqa: E731
    g = jax.grad(loss, argnums=(0, 1, 2))(*args)
    per = [jax.grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=(0, 1, 2))(
        *[x[i] if a == 0 else x for x, a in zip(args, axes)]) for i in range(n)]
    for j, a in enumerate(axes):
        want = jnp.stack([p[j] for p in per]) if a == 0 else sum(p[j] for p in per)
        assert_close(f"grad {j}", g[j], want, 1e-5, 1e-5)


def test_nested_vmap_with_shared_bias_and_alibi():
    rng = seeded_rng("vmap/nested")
    n1, n2, b, s, h, d = 2, 3, 1, 12, 2, 8
    q = jnp.asarray(rng.standard_normal((n1, n2, b, s, h, d)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((n1, n2, b, s, h, d)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((n1, n2, b, s, h, d)), jnp.float32)
    bias = jnp.asarray(rng.standard_normal((h, s, s)), jnp.float32)
    slopes = jnp.asarray(rng.uniform(0.1, 0.4, h), jnp.float32)
    f = lambda q, k, v: fj.attention(q, k, v, bias=bias, alibi_slopes=slopes)  # noqa: E731
    o = jax.vmap(jax.vmap(f))(q, k, v)
    for i in range(n1):
        for j in range(n2):
            want = _ref(q[i, j], k[i, j], v[i, j], bias=np.asarray(bias)[None], alibi_slopes=np.asarray(slopes))
            assert_close(f"o[{i},{j}]", o[i, j], want, 2e-6, 2e-6)
    # per-example bias (mapped) and its gradient
    biases = jnp.asarray(rng.standard_normal((n2, b, h, s, s)), jnp.float32)
    g = jax.vmap(jax.grad(lambda q, bb: jnp.sum(fj.attention(q, k[0, 0], v[0, 0], bias=bb) ** 2), argnums=1))(
        q[0], biases)
    for j in range(n2):
        gj = jax.grad(lambda bb: jnp.sum(fj.attention(q[0, j], k[0, 0], v[0, 0], bias=bb) ** 2))(biases[j])
        assert_close(f"dbias[{j}]", g[j], gj, 1e-6, 1e-6)


def test_return_lse_and_its_gradient():
    rng = seeded_rng("lse_grad")
    q, k, v = (_bshd(rng, 1, 20, 2, 8) for _ in range(3))
    w = jnp.asarray(rng.standard_normal((1, 2, 20)), jnp.float32)

    def ours(q, k, v):
        o, lse = fj.attention(q, k, v, causal=True, return_lse=True)
        return jnp.sum(o) + jnp.sum(lse * w)

    def theirs(q, k, v):  # plain jnp, float32: lse and o from the definitions
        qh, kh, vh = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
        s = jnp.einsum("bhqd,bhkd->bhqk", qh, kh) / jnp.sqrt(8.0)
        s = jnp.where(jnp.tril(jnp.ones((20, 20), bool)), s, -jnp.inf)
        lse = jax.nn.logsumexp(s, axis=-1)
        o = jnp.einsum("bhqk,bhkd->bhqd", jnp.exp(s - lse[..., None]), vh)
        return jnp.sum(o) + jnp.sum(lse * w)

    g1 = jax.grad(ours, argnums=(0, 1, 2))(q, k, v)
    g2 = jax.grad(theirs, argnums=(0, 1, 2))(q, k, v)
    for name, a, r in zip(("dq", "dk", "dv"), g1, g2):
        assert_close(name, a, r, 2e-5, 2e-5)


# ---- bad input --------------------------------------------------------------------------

def _qkv(b=1, s=8, h=2, d=8, dtype=jnp.float32):
    return tuple(jnp.ones((b, s, h, d), dtype) for _ in range(3))


@pytest.mark.parametrize("make, match", [
    (lambda: (jnp.ones((8, 2, 8)),) + _qkv()[1:], "q must have rank 4"),
    (lambda: (_qkv()[0], _qkv(dtype=jnp.float16)[1], _qkv()[2]), "share a dtype"),
    (lambda: (jnp.ones((1, 8, 3, 8)),) + _qkv()[1:], r"heads \(3\) must be a multiple"),
    (lambda: (_qkv()[0], jnp.ones((1, 8, 2, 4)), _qkv()[2]), "k has head_dim 4 but q has 8"),
    (lambda: (_qkv()[0], _qkv()[1], jnp.ones((1, 9, 2, 8))), "v has 2 heads and 9 keys"),
    (lambda: tuple(jnp.ones((1, 8, 2, 8), jnp.int32) for _ in range(3)), "float32, float16 or bfloat16"),
])
def test_bad_tensors_raise_naming_the_problem(make, match):
    with pytest.raises(ValueError, match=match):
        fj.attention(*make())


@pytest.mark.parametrize("kw, match", [
    (dict(bias=jnp.ones((3, 2, 8, 8))), r"bias has shape \(3, 2, 8, 8\)"),
    (dict(alibi_slopes=jnp.ones(3)), r"alibi_slopes must have shape \(2,\)"),
    (dict(q_segment_ids=jnp.ones((1, 8), jnp.int32)), "given together"),
    (dict(q_segment_ids=jnp.ones((1, 7), jnp.int32), kv_segment_ids=jnp.ones((1, 8), jnp.int32)),
     r"q_segment_ids must have shape \(1, 8\)"),
    (dict(window=(-2, 3)), "window values must be >= -1"),
    (dict(scale=float("nan")), "scale must be finite"),
    (dict(softcap=-1.0), "softcap must be >= 0"),
    # a subnormal or huge cap (1 / cap overflows, or the quotients flush to 0 under XLA's FTZ),
    # and one that rounds to 0 in float32 (which would turn the cap off)
    (dict(softcap=1e-39), r"softcap must be 0 \(off\) or within \[2\^-126, 2\^100\]"),
    (dict(softcap=5e37), r"softcap must be 0 \(off\) or within \[2\^-126, 2\^100\]"),
    (dict(softcap=1e-50), "rounds to 0 in float32"),
    (dict(layout="sbhd"), "layout must be"),
])
def test_bad_options_raise_naming_the_problem(kw, match):
    with pytest.raises(ValueError, match=match):
        fj.attention(*_qkv(), **kw)


@pytest.mark.parametrize("name, value, match", [
    ("dropout_p", 0.1, "dropout_p must be a Python number"),
    ("causal", True, "causal must be True or False known when the call is built"),
    ("window", 3, "window left must be an integer known when the call is built"),
    ("threads", 2, "threads must be an integer known when the call is built"),
])
def test_traced_static_options_are_refused_in_words(name, value, match):
    """Options the library takes at plan time cannot be traced: jit over them raises the
    option's name, as a traced scale does, not JAX's conversion error."""
    q, k, v = _qkv()

    def f(x):
        kw = {"window": (x, 0)} if name == "window" else {name: x}
        return fj.attention(q, k, v, seed=1, **kw)
    with pytest.raises(ValueError, match=match):
        jax.jit(f)(value)


@pytest.mark.parametrize("fn", ["attention", "varlen", "kvcache"])
def test_threads_out_of_range_at_trace_time(fn):
    """threads=-3 is the library's refusal in its words in every function, also where the
    plan waits for the lengths (it once ran and failed with 'does not fit int32')."""
    x = np.random.default_rng(0).standard_normal((1, 10, 2, 4)).astype(np.float32)
    cu = np.array([0, 4, 10], np.int32)
    call = {"attention": lambda: fj.attention(x, x, x, threads=-3),
            "varlen": lambda: jax.jit(lambda c: fj.varlen_attention(x[0], x[0], x[0], c, c, threads=-3))(cu),
            "kvcache": lambda: jax.jit(lambda n: fj.kvcache_attention(x[:, :1], x, x, cache_seqlens=n, threads=-3))(
                np.array([5], np.int32))}[fn]
    with pytest.raises(ValueError, match=r"threads must be 1\.\.1024 \(0 = default\), got -3"):
        call()


def test_library_rejections_surface_at_trace_time():
    # the library's own check (here: a window right of -1 with causal is allowed, but a
    # diag offset beyond int32 is not) comes back as ValueError with its message, under jit
    q, k, v = _qkv()
    from flashattn.jax import _attention
    with pytest.raises(ValueError, match="diag_offset"):
        jax.jit(lambda q, k, v: _attention.call(q, k, v, causal=True, diag_offset=2**40))(q, k, v)


def test_handler_rejects_inconsistent_buffers_with_the_message():
    # calling the FFI target directly, past the Python checks: the C handler's own checks
    from flashattn.jax import _ffi
    q, k, v = _qkv()
    opt = _ffi.Options(layout="bshd", causal=False, window=(-1, -1), softcap=0.0, scale=None, diag_offset=None,
                       bias_scale=None, has_bias=False, has_alibi=False, has_segment_ids=False)
    with pytest.raises(Exception, match="k has head_dim 4 but q has 8"):
        _ffi.forward(opt, q, jnp.ones((1, 8, 2, 4)), v, None, None, None, None)[0].block_until_ready()


def test_vmap_one_call_per_index_with_shared_bias_grad_and_mapped_alibi():
    # a bias of batch B > 1 shared across the vmapped axis, differentiated, and ALiBi
    # slopes mapped: neither folds into B, so the handler runs one call per vmapped index
    rng = seeded_rng("vmap/per_index")
    n, b, s, h, d = 3, 2, 12, 2, 8
    q = jnp.asarray(rng.standard_normal((n, b, s, h, d)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((b, s, h, d)), jnp.float32) for _ in range(2))
    bias = jnp.asarray(rng.standard_normal((b, h, s, s)), jnp.float32)
    slopes = jnp.asarray(rng.uniform(0.1, 0.4, (n, h)), jnp.float32)
    f = lambda q, bias, sl: fj.attention(q, k, v, bias=bias, alibi_slopes=sl, causal=True)  # noqa: E731
    o = jax.vmap(f, in_axes=(0, None, 0))(q, bias, slopes)
    for i in range(n):
        want = _ref(q[i], k, v, bias=np.asarray(bias), alibi_slopes=np.asarray(slopes[i]), causal=True)
        assert_close(f"o[{i}]", o[i], want, 2e-6, 2e-6)
    g = jax.grad(lambda q, bias: jnp.sum(jax.vmap(f, in_axes=(0, None, 0))(q, bias, slopes) ** 2),
                 argnums=(0, 1))(q, bias)
    per = [jax.grad(lambda q, bias: jnp.sum(f(q, bias, slopes[i]) ** 2), argnums=(0, 1))(q[i], bias)
           for i in range(n)]
    assert_close("dq", g[0], jnp.stack([p[0] for p in per]), 1e-5, 1e-5)
    assert_close("dbias", g[1], sum(p[1] for p in per), 1e-5, 1e-5)


@pytest.mark.parametrize("kind", ["prefix_lm", "documents", "from_array", "per_head", "per_head_shared"])
def test_vmap_with_a_per_batch_mask(rng, kind):
    # a flashattn.masks mask of batch B > 1 covers the B items of each vmapped index, not the
    # folded batch: the handler runs one call per index; a mask of batch 1 (per head or not)
    # still folds. Either way the vmapped result is the un-vmapped calls' stacked.
    n, b, s, h, d = 3, 2, 40, 2, 8
    q, k, v, w = (jnp.asarray(rng.standard_normal((n, b, s, h, d)), jnp.float32) for _ in range(4))
    mask = {
        "prefix_lm": lambda: masks.prefix_lm([3, 25]),
        "documents": lambda: masks.documents([[10, 30], [25, 5, 10]]),
        "from_array": lambda: masks.from_array(rng.random((b, 1, s, s)) < 0.5),
        "per_head": lambda: masks.per_head([masks.prefix_lm([3, 25]), masks.documents([[10, 30], [40]])]),
        "per_head_shared": lambda: masks.per_head([masks.from_array(rng.random((s, s)) < 0.5), masks.causal()]),
    }[kind]()
    f = lambda q, k, v: fj.attention(q, k, v, mask=mask)  # noqa: E731
    o = jax.vmap(f)(q, k, v)
    assert_close("o", o, jnp.stack([f(q[i], k[i], v[i]) for i in range(n)]), 0, 0)
    # the backward's call carries the same mask
    g = jax.grad(lambda q, k, v: jnp.sum(jax.vmap(f)(q, k, v) * w), argnums=(0, 1, 2))(q, k, v)
    per = [jax.grad(lambda *a: jnp.sum(f(*a) * w[i]), argnums=(0, 1, 2))(q[i], k[i], v[i]) for i in range(n)]
    for j, name in enumerate(("dq", "dk", "dv")):
        assert_close(name, g[j], jnp.stack([p[j] for p in per]), 0, 0)


@pytest.mark.parametrize("kind", ["dropout", "dropout_sinks", "dropout_mask"])
def test_vmap_shared_seed_draws_the_folded_batch(rng, kind):
    # one seed shared by every vmapped index draws at the items' indices in the folded batch,
    # whether the handler folds (dropout alone), folds the forward only (sinks: the backward
    # returns dsink, so it runs one call per index) or neither (a per-batch mask): the vmapped
    # results equal one call on the batch of all indices, forward and gradients, and so
    # agree with each other (a forward that folded and a backward that did not once drew
    # different masks: wrong gradients)
    n, b, s, h, d = 3, 2, 24, 2, 8
    q, k, v, w = (jnp.asarray(rng.standard_normal((n, b, s, h, d)), jnp.float32) for _ in range(4))
    sinks = jnp.asarray(rng.standard_normal(h), jnp.float32)
    kw = dict(dropout_p=0.4, seed=int(rng.integers(1 << 31)))
    if kind == "dropout_sinks":
        kw["sinks"] = sinks
    if kind == "dropout_mask":
        kw["mask"] = masks.prefix_lm([5, 17] * n)  # folded: the same two lengths at every index
    fold = lambda x: x.reshape((n * b,) + x.shape[2:])  # noqa: E731
    folded_kw = dict(kw)
    if kind == "dropout_mask":
        kw["mask"] = masks.prefix_lm([5, 17])
    f = lambda q, k, v: fj.attention(q, k, v, **kw)  # noqa: E731
    g_ = lambda q, k, v: fj.attention(q, k, v, **folded_kw)  # noqa: E731
    assert_close("o", fold(jax.vmap(f)(q, k, v)), g_(fold(q), fold(k), fold(v)), 0, 0)
    gv = jax.grad(lambda q, k, v: jnp.sum(jax.vmap(f)(q, k, v) * w), argnums=(0, 1, 2))(q, k, v)
    gf = jax.grad(lambda q, k, v: jnp.sum(g_(q, k, v) * fold(w)), argnums=(0, 1, 2))(fold(q), fold(k), fold(v))
    for j, name in enumerate(("dq", "dk", "dv")):
        assert_close(name, fold(gv[j]), gf[j], 1e-6, 1e-6)


def test_dropout_lse_cotangent_judged_at_trace_time(rng):
    """Under dropout a gradient through lse raises; lse unused is JAX's symbolic zero, no
    gradient, also through checkpoint, scan and cond and under jit (the op runs inside a
    jit of its own, for an eager shard_map: symbolic zeros must still reach its rule). An
    explicit zeros cotangent passed to jax.vjp counts as a gradient (docs/python.md)."""
    q, k, v, w = (_bshd(rng, 1, 12, 2, 8) for _ in range(4))
    att = lambda q: fj.attention(q, k, v, dropout_p=0.3, seed=7, return_lse=True)  # noqa: E731
    want = jax.grad(lambda q: jnp.sum(fj.attention(q, k, v, dropout_p=0.3, seed=7) * w))(q)
    cases = {
        "grad": lambda q: jnp.sum(att(q)[0] * w),
        "checkpoint": lambda q: jnp.sum(jax.checkpoint(att)(q)[0] * w),
        "scan": lambda q: jnp.sum(jax.lax.scan(lambda c, _: (c, att(c)), q, None, length=1)[1][0][0] * w),
        "cond": lambda q: jnp.sum(jax.lax.cond(True, att, att, q)[0] * w),
    }
    for name, loss in cases.items():
        for wrap in (lambda f: f, jax.jit):
            assert_close(name, wrap(jax.grad(loss))(q), want, 1e-6, 1e-6)
    assert float(jnp.abs(want).max()) > 0
    with pytest.raises(NotImplementedError, match="gradient through lse"):
        jax.grad(lambda q: jnp.sum(att(q)[1]))(q)
    with pytest.raises(NotImplementedError, match="gradient through lse"):
        jax.vjp(att, q)[1]((w, jnp.zeros((1, 2, 12), jnp.float32)))


def test_a_gradient_through_alibi_slopes_raises():
    """The library computes no gradient for ALiBi slopes: differentiating in them gave zeros
    (a stop_gradient), in attention and varlen_attention alike. TypeError now; a gradient in q
    with constant slopes still runs and matches the reference."""
    rng = seeded_rng("alibi-grad")
    q, k, v = (jnp.asarray(_bshd(rng, 1, 6, 2, 8)) for _ in range(3))
    slopes = jnp.asarray([0.5, -0.25], jnp.float32)
    loss = lambda s, q: jnp.sum(fj.attention(q, k, v, alibi_slopes=s, layout="bshd") ** 2)  # noqa: E731
    with pytest.raises(TypeError, match="no gradient for the ALiBi slopes"):
        jax.grad(loss)(slopes, q)
    with pytest.raises(TypeError, match="no gradient for the ALiBi slopes"):
        jax.jit(jax.grad(loss))(slopes, q)
    cu = jnp.asarray([0, 6], jnp.int32)
    vl = lambda s: jnp.sum(fj.varlen_attention(q[0], k[0], v[0], cu, cu, alibi_slopes=s) ** 2)  # noqa: E731
    with pytest.raises(TypeError, match="no gradient for the ALiBi slopes"):
        jax.grad(vl)(slopes)
    g = jax.grad(loss, argnums=1)(slopes, q)  # slopes constant: fine
    assert g.shape == q.shape and bool(jnp.all(jnp.isfinite(g)))
    assert float(jnp.max(jnp.abs(g))) > 0


def test_a_gradient_through_decoding_raises():
    """kvcache_attention runs forward only: its operands went through stop_gradient, so
    jax.grad through a decode step gave zeros silently. A derivative that depends on any of
    them raises TypeError naming it; the forward under jit is unchanged."""
    rng = seeded_rng("decode-grad")
    q = jnp.asarray(rng.standard_normal((1, 1, 2, 8)).astype(np.float32))
    kc, vc = (jnp.asarray(rng.standard_normal((1, 5, 2, 8)).astype(np.float32)) for _ in range(2))
    lens = np.asarray([5], np.int32)
    f = lambda q, kc: jnp.sum(fj.kvcache_attention(q, kc, vc, cache_seqlens=lens)[0])  # noqa: E731
    with pytest.raises(TypeError, match="kvcache_attention's q has no gradient"):
        jax.grad(f)(q, kc)
    with pytest.raises(TypeError, match="kvcache_attention's k_cache has no gradient"):
        jax.grad(f, argnums=1)(q, kc)
    with pytest.raises(TypeError, match="kvcache_attention's q has no gradient"):
        jax.jvp(f, (q, kc), (q, kc))
    assert float(jax.jit(f)(q, kc)) == float(f(q, kc))


def test_a_gradient_of_a_gradient_is_refused_in_flashattn_s_words():
    """grad of grad (and a jvp of a grad) through attention, the jax.nn drop-in and
    varlen_attention: NotImplementedError saying what is not supported (it read "Differentiation
    rule for 'custom_partitioning' not implemented"); the first gradient is unchanged."""
    rng = seeded_rng("grad-of-grad")
    q = _bshd(rng, 1, 8, 2, 16)
    cu = jnp.asarray([0, 3, 8], jnp.int32)
    for name, f in (("attention", lambda q: fj.attention(q, q, q, causal=True)),
                    ("dot_product_attention", lambda q: fj.dot_product_attention(q, q, q)),
                    ("varlen_attention", lambda q: fj.varlen_attention(q[0], q[0], q[0], cu, cu))):
        g = jax.grad(lambda q: (f(q) ** 2).sum())
        assert bool(jnp.all(jnp.isfinite(g(q)))), name
        with pytest.raises(NotImplementedError, match="a gradient of a gradient"):
            jax.grad(lambda q: g(q).sum())(q)
        with pytest.raises(NotImplementedError, match="a gradient of a gradient"):
            jax.jvp(g, (q,), (q,))


def test_symbolic_shapes_are_refused_naming_the_dimension():
    """jax.export with shape polymorphism: flashattn plans from concrete shapes. The refusal
    names the dimension and says so (it read "batch must be an integer, got b")."""
    from jax import export
    b, t = export.symbolic_shape("b, t")
    spec = jax.ShapeDtypeStruct((b, t, 2, 8), jnp.float32)
    for f in (lambda q: fj.dot_product_attention(q, q, q), lambda q: fj.attention(q, q, q, layout="bshd")):
        with pytest.raises(ValueError, match="symbolic dimension b: flashattn plans from concrete shapes"):
            export.export(jax.jit(f))(spec)
