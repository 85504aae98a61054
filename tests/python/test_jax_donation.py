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
