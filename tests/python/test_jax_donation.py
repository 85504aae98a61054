"""kvcache_attention with donated caches and a bad length. Concrete lengths are judged at
trace time, before anything is dispatched, so the donated caches stay alive and unchanged.
Traced lengths can only be judged by the handler when it runs, after XLA has handed it the
donated buffers: the call raises, naming the argument, and the caches are lost (the
docstring and docs/python.md say so beside donate_argnums)."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import flashattn.jax as fj  # noqa: E402


def _caches():
    kc = jnp.asarray(np.arange(2 * 16 * 8, dtype=np.float32).reshape(1, 16, 2, 8))
    return kc, kc + 1


def test_concrete_bad_length_raises_before_donating():
    kc, vc = _caches()
    q = jnp.ones((1, 1, 2, 8), jnp.float32)
    kn = vn = jnp.ones((1, 1, 2, 8), jnp.float32)
    step = jax.jit(lambda kc, vc: fj.kvcache_attention(q, kc, vc, kn, vn, cache_seqlens=16), donate_argnums=(0, 1))
    with pytest.raises(ValueError, match="cache_seqlens|capacity|exceed"):
        step(kc, vc)
    assert not kc.is_deleted() and not vc.is_deleted()
    np.testing.assert_array_equal(np.asarray(kc), np.arange(2 * 16 * 8, dtype=np.float32).reshape(1, 16, 2, 8))


def test_traced_bad_length_raises_naming_it():
    kc, vc = _caches()
    q = jnp.ones((1, 1, 2, 8), jnp.float32)
    kn = vn = jnp.ones((1, 1, 2, 8), jnp.float32)
    step = jax.jit(lambda kc, vc, n: fj.kvcache_attention(q, kc, vc, kn, vn, cache_seqlens=n))
    with pytest.raises(Exception, match="cache_seqlens|capacity|exceed"):
        jax.block_until_ready(step(kc, vc, jnp.array([16], jnp.int32)))
    assert not kc.is_deleted()  # not donated: the caller's caches are untouched


def test_traced_lengths_shape_and_option_errors_raise_at_trace_time():
    """With traced lengths the problem is still planned at trace time, from the capacities
    (lengths per call): what depends on shapes and options alone is refused then, as
    ValueError, with the donated caches intact. These once passed tracing and raised only
    when the call ran, after XLA had consumed the donated caches."""
    B, H, D = 2, 2, 8
    q = jnp.ones((B, 1, H, D), jnp.float32)
    lens = jnp.array([1, 2], jnp.int32)
    pre = jnp.ones((3, H, D), jnp.float32)
    kq, ks, vq, vs = fj.quantize_cache(np.zeros((B, 16, H, D), np.float32), np.zeros((B, 16, H, D), np.float32),
                                       "int8")
    q3 = jnp.ones((B, 3, H, D), jnp.float32)
    table = np.array([[0, 1], [2, 3]], np.int32)
    cases = [
        ("does not combine with a shared prefix",
         lambda kc, vc, n: fj.kvcache_attention(q, kc, vc, q, q, cache_seqlens=n, cache_dtype="int8", k_scale=ks,
                                                v_scale=vs, k_prefix=pre, v_prefix=pre), kq, vq),
        (r"cache capacity\) is below the 3 new tokens",
         lambda kc, vc, n: fj.kvcache_attention(q3, kc, vc, q3, q3, cache_seqlens=n),
         jnp.zeros((B, 2, H, D)), jnp.zeros((B, 2, H, D))),
        ("page_size must be a positive multiple of 16, got 4",
         lambda kc, vc, n: fj.kvcache_attention(q, kc, vc, q, q, cache_seqlens=n, block_table=table),
         jnp.zeros((4, 4, H, D)), jnp.zeros((4, 4, H, D))),
    ]
    for match, fn, kc, vc in cases:
        step = jax.jit(fn, donate_argnums=(0, 1))
        with pytest.raises(ValueError, match=match):
            step.lower(kc, vc, lens)
        with pytest.raises(ValueError, match=match):
            step(kc, vc, lens)
        assert not kc.is_deleted() and not vc.is_deleted(), match


def test_traced_lengths_still_run_and_judge_their_values_at_run_time():
    """The capacity plan refuses nothing a call may run: traced lengths give the results of
    concrete ones, and a bad length value is still the handler's error when the call runs."""
    kc, vc = _caches()
    q = jnp.ones((1, 1, 2, 8), jnp.float32)
    kn = vn = jnp.full((1, 1, 2, 8), 0.5, jnp.float32)
    want = fj.kvcache_attention(q, kc, vc, kn, vn, cache_seqlens=np.array([5], np.int32))
    got = jax.jit(lambda n: fj.kvcache_attention(q, kc, vc, kn, vn, cache_seqlens=n))(jnp.array([5], jnp.int32))
    for a, b in zip(want, got):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(Exception, match="cache_seqlens"):
        jax.block_until_ready(jax.jit(lambda n: fj.kvcache_attention(q, kc, vc, kn, vn, cache_seqlens=n))(
            jnp.array([16], jnp.int32)))
