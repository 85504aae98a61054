"""flashattn.jax's inference shapes against the per-sequence float64 reference: packed
batches forward and gradients (eager, jit, grad of lse too), kv-cache decoding returning
the updated caches (dense and paged, jit with donated caches), and bad input raising with
the argument named, at trace time where the lengths are concrete and at run time under jit."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import flashattn.jax as fj  # noqa: E402
import reference_inference as ref  # noqa: E402
from conftest import BWD_TOL, SEED, check, check_lse, fwd_tol  # noqa: E402
from inference_cases import (decode_rows, expected_cache, expected_pages, make_decode,  # noqa: E402
                             make_varlen, page)

# what a traced call's bad lengths raise when it runs: the handler's error, the library's message
RUNTIME = (ValueError, jax.errors.JaxRuntimeError)

def f64(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def _same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("case", ["empty_and_one", "causal", "window", "gqa", "softcap_alibi", "dv_differs",
                                  "top_left"])
def test_varlen_forward_and_grads_match_reference(rng, case, dtype):
    qn, kn, vn, cq, ck, kw = make_varlen(rng, case, dtype)
    q, k, v = (jnp.asarray(x) for x in (qn, kn, vn))
    o, lse = fj.varlen_attention(q, k, v, cq, ck, return_lse=True, **kw)
    o_ref, lse_ref = ref.varlen(qn, kn, vn, cq, ck, **kw)
    check("o", f64(o), o_ref, fwd_tol(dtype, lse_ref))
    check_lse(np.asarray(lse), lse_ref)
    do = jnp.asarray(np.random.default_rng(SEED).standard_normal(o.shape), o.dtype)
    _, vjp = jax.vjp(lambda q, k, v: fj.varlen_attention(q, k, v, cq, ck, **kw), q, k, v)
    grads = vjp(do)
    _, ref_grads = ref.varlen(qn, kn, vn, cq, ck, do=f64(do), o_saved=f64(o), **kw)
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        check(name, f64(g), r, BWD_TOL[dtype])


def test_varlen_under_jit_with_traced_lengths_and_lse_grad(rng):
    """cu_seqlens as traced int32 operands; the gradient of a loss through lse as well."""
    qn, kn, vn, cq, ck, kw = make_varlen(rng, "gqa")

    def loss(q, k, v, cq, ck):
        o, lse = fj.varlen_attention(q, k, v, cq, ck, return_lse=True, **kw)
        return jnp.sum(o * o) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0) * 0.5)

    args = [jnp.asarray(x) for x in (qn, kn, vn)]
    g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*args, jnp.asarray(cq), jnp.asarray(ck))
    # the reference: d(sum o^2)/do = 2o; d lse_i / d s_ij = p_ij enters as a value column of ones
    (o_ref, lse_ref), _ = ref.varlen(qn, kn, vn, cq, ck, do=np.zeros((cq[-1], 6, 16)), **kw)
    ones = np.ones(vn.shape[:2] + (1,))
    v_ext = np.concatenate([vn, ones], axis=-1)
    do_ext = np.concatenate([2 * o_ref, 0.5 * np.isfinite(lse_ref).T[..., None]], axis=-1)
    o_ext = np.concatenate([o_ref, np.zeros(o_ref.shape[:2] + (1,))], axis=-1)
    _, (rq, rk, rv) = ref.varlen(qn, kn, v_ext, cq, ck, do=do_ext, o_saved=o_ext, **kw)
    for name, got, r in (("dq", g[0], rq), ("dk", g[1], rk), ("dv", g[2], rv[..., :-1])):
        check(name, f64(got), r, BWD_TOL["f32"])


def test_varlen_vmap_runs_each_index(rng):
    qn, kn, vn, cq, ck, kw = make_varlen(rng, "causal")
    qs = np.stack([qn, qn[::-1].copy()])
    o = jax.vmap(lambda q: fj.varlen_attention(q, kn, vn, cq, ck, **kw))(jnp.asarray(qs))
    for i in range(2):
        o_ref, lse_ref = ref.varlen(qs[i], kn, vn, cq, ck, **kw)
        check(f"o[{i}]", f64(o[i]), o_ref, fwd_tol("f32", lse_ref))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("case", ["one_token", "gqa_8to1", "mqa_multi", "no_append", "softcap_alibi"])
def test_decode_returns_updated_caches(rng, case, dtype):
    d = make_decode(rng, case, dtype)
    new = [None if d[n] is None else jnp.asarray(d[n]) for n in ("k", "v")]
    o, lse, kc, vc = fj.kvcache_attention(jnp.asarray(d["q"]), jnp.asarray(d["k_cache"]), jnp.asarray(d["v_cache"]),
                                          *new, cache_seqlens=d["lens"], return_lse=True, **d["kw"])
    o_ref, lse_ref = ref.decode(d["q"], *decode_rows(d), **d["kw"])
    check("o", f64(o), o_ref, fwd_tol(dtype, lse_ref))
    check_lse(np.asarray(lse), lse_ref)
    assert _same_bits(kc, expected_cache(d, "k")) and _same_bits(vc, expected_cache(d, "v"))


def test_decode_without_new_tokens_returns_the_caches_as_given(rng):
    d = make_decode(rng, "no_append")
    kc, vc = jnp.asarray(d["k_cache"]), jnp.asarray(d["v_cache"])
    o, kc2, vc2 = fj.kvcache_attention(jnp.asarray(d["q"]), kc, vc, cache_seqlens=d["lens"], **d["kw"])
    assert kc2 is kc and vc2 is vc
    o_ref, lse_ref = ref.decode(d["q"], *decode_rows(d), **d["kw"])
    check("o", f64(o), o_ref, fwd_tol("f32", lse_ref))


@pytest.mark.parametrize("case", ["one_token", "mqa_multi", "shared_pages"])
def test_paged_decode_under_jit_with_donated_caches(rng, case):
    d = page(make_decode(rng, case), rng, share=case == "shared_pages")
    new = [None if d[n] is None else jnp.asarray(d[n]) for n in ("k", "v")]
    step = jax.jit(lambda q, kp, vp, lens, table: fj.kvcache_attention(q, kp, vp, *new, lens, table, **d["kw"]),
                   donate_argnums=(1, 2))
    o, kp, vp = step(jnp.asarray(d["q"]), jnp.asarray(d["k_pages"]), jnp.asarray(d["v_pages"]),
                     jnp.asarray(d["lens"]), jnp.asarray(d["table"]))
    o_ref, lse_ref = ref.decode(d["q"], *decode_rows(d), **d["kw"])
    check("o", f64(o), o_ref, fwd_tol("f32", lse_ref))
    assert _same_bits(kp, expected_pages(d, "k")) and _same_bits(vp, expected_pages(d, "v"))


def test_bad_input_names_the_argument(rng):
    qn, kn, vn, cq, ck, _ = make_varlen(rng, "causal")
    bad = cq.copy()
    bad[2] = 0
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be non-decreasing"):
        fj.varlen_attention(qn, kn, vn, bad, ck)                      # concrete: at trace time
    with pytest.raises(RUNTIME, match=r"cu_seqlens_q must be non-decreasing"):
        jax.block_until_ready(jax.jit(fj.varlen_attention)(qn, kn, vn, bad, ck))  # traced: when it runs
    with pytest.raises(ValueError, match=r"max_seqlen_q = 3 but a sequence has 30 rows"):
        fj.varlen_attention(qn, kn, vn, cq, ck, max_seqlen_q=3)
    with pytest.raises(ValueError, match=r"cu_seqlens_k must be integers"):
        fj.varlen_attention(qn, kn, vn, cq, ck.astype(np.float32))
    # concrete lengths past int32 are refused as numpy and torch refuse them (JAX's own
    # int32 conversion would wrap 2**32 + n to n: another problem, silently)
    wrap = cq.astype(np.int64)
    wrap[-1] += 2**32
    with pytest.raises(ValueError, match=r"cu_seqlens_q values must fit int32"):
        fj.varlen_attention(qn, kn, vn, wrap, ck)

    d = page(make_decode(rng, "one_token"), rng)
    args = [jnp.asarray(d[n]) for n in ("q", "k_pages", "v_pages", "k", "v")]
    table = d["table"].copy()
    table[0, 0] = -7
    run = jax.jit(lambda *a: fj.kvcache_attention(*a[:5], a[5], a[6]))
    with pytest.raises(RUNTIME, match=r"block_table\[0\]\[0\] = -7 is out of range"):
        jax.block_until_ready(run(*args, jnp.asarray(d["lens"]), jnp.asarray(table)))
    over = d["lens"].copy()
    over[1] = 70
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\] = 70 plus 1 new tokens exceeds the cache capacity 64"):
        fj.kvcache_attention(*args, over, d["table"])
    with pytest.raises(RUNTIME, match=r"cache_seqlens\[1\] = 70 plus 1 new tokens exceeds"):
        jax.block_until_ready(run(*args, jnp.asarray(over), jnp.asarray(d["table"])))
    with pytest.raises(ValueError, match=r"cache_seqlens values must fit int32"):
        fj.kvcache_attention(*args, d["lens"].astype(np.int64) + 2**32, d["table"])
    with pytest.raises(ValueError, match=r"block_table values must fit int32"):
        fj.kvcache_attention(*args, d["lens"], d["table"].astype(np.int64) + 2**32)
    with pytest.raises(ValueError, match=r"block_table must have shape \[batch, max_pages\] with batch = 4"):
        fj.kvcache_attention(*args, d["lens"], d["table"][:2])
    with pytest.raises(ValueError, match=r"k and v \(the new tokens\) go together"):
        fj.kvcache_attention(*args[:4], None, d["lens"], d["table"])
    # the caller's arrays are untouched whatever happened (JAX arrays are immutable; the
    # numpy inputs were copied in)
    assert _same_bits(args[1], d["k_pages"])


def test_kvcache_takes_a_0d_jax_integer_as_every_sequences_length():
    """cache_seqlens "an int": a 0-d integer JAX array (concrete, a jit argument, a scan's step
    counter) is every sequence's length, as a Python int and a 0-d numpy integer are. It was
    refused ("must have 1 dim", or under jit "must be integers ... got int32 of shape ()")."""
    rng = np.random.default_rng([SEED, 31])
    print(f"seed [{SEED}, 31]")
    B, H, D, S = 2, 2, 8, 16
    q, kn, vn = (jnp.asarray(rng.standard_normal((B, 1, H, D)), jnp.float32) for _ in range(3))
    kc, vc = (jnp.asarray(rng.standard_normal((B, S, H, D)), jnp.float32) for _ in range(2))
    want = fj.kvcache_attention(q, kc, vc, kn, vn, cache_seqlens=np.full(B, 3, np.int32))
    for n in (3, np.int32(3), jnp.int32(3), jnp.asarray(3, jnp.int16)):
        got = fj.kvcache_attention(q, kc, vc, kn, vn, cache_seqlens=n)
        for a, b in zip(want, got):
            assert _same_bits(a, b), type(n)
    got = jax.jit(lambda n: fj.kvcache_attention(q, kc, vc, kn, vn, cache_seqlens=n))(jnp.int32(3))
    for a, b in zip(want, got):
        assert _same_bits(a, b)

    def step(c, _):
        kc, vc, t = c
        o, kc, vc = fj.kvcache_attention(q, kc, vc, kn, vn, cache_seqlens=t)
        return (kc, vc, t + 1), o

    (kc3, vc3, t), os_ = jax.lax.scan(step, (kc, vc, jnp.int32(0)), None, length=3)
    assert int(t) == 3
    kc_ref, vc_ref = kc, vc
    for i in range(3):
        o, kc_ref, vc_ref = fj.kvcache_attention(q, kc_ref, vc_ref, kn, vn, cache_seqlens=i)
        assert _same_bits(os_[i], o)
    assert _same_bits(kc3, kc_ref) and _same_bits(vc3, vc_ref)
    with pytest.raises(ValueError, match=r"cache_seqlens must be an int or integers \[batch\], got dtype float32"):
        fj.kvcache_attention(q, kc, vc, cache_seqlens=jnp.float32(3))
    with pytest.raises(ValueError, match=r"cache_seqlens must have 1 dim \[batch\] = \[2\], got shape \(2, 1\)"):
        jax.jit(lambda n: fj.kvcache_attention(q, kc, vc, cache_seqlens=n))(jnp.ones((2, 1), jnp.int32))
