"""Misuse of the kv-cache fronts that once ran silently (numpy and torch): codes of the
wrong 1-byte type for cache_dtype, buffers the append writes passed twice (or overlapping),
scales that are not float32 (once converted by numpy and JAX, complex and bool included),
degenerate shapes in torch's quantize_cache, and merge_states with Dv = 0 (the lse still
merged). Interleaved views of one combined cache stay allowed; empty caches with new
tokens give empty outputs; the numpy inference functions take threads=. Seeded by the
run's seed (conftest.py)."""
import numpy as np
import pytest
import torch

import flashattn
import flashattn.torch as fat

B, S, H, D = 2, 32, 2, 16


def _caches(rng, dtype):
    k, v = (rng.standard_normal((B, S, H, D)).astype(np.float32) for _ in range(2))
    return flashattn.quantize_cache(k, v, dtype)


@pytest.mark.parametrize("made, asked", [("int8", "fp8"), ("fp8", "int8")])
def test_codes_of_the_other_type(rng, made, asked):
    kc, ks, vc, vs = _caches(rng, made)
    q = rng.standard_normal((B, 1, H, D)).astype(np.float32)
    with pytest.raises(ValueError, match="k_cache must hold"):
        flashattn.kvcache_attention(q, kc, vc, cache_seqlens=10, cache_dtype=asked, k_scale=ks, v_scale=vs)
    k, v = (torch.from_numpy(rng.standard_normal((B, S, H, D)).astype(np.float32)) for _ in range(2))
    tk, tks, tv, tvs = fat.quantize_cache(k, v, made)
    with pytest.raises(ValueError, match="k_cache must hold"):
        fat.kvcache_attention(torch.from_numpy(q), tk, tv, cache_seqlens=10, cache_dtype=asked, k_scale=tks, v_scale=tvs)


def test_wider_codes_refused(rng):
    kc, ks, vc, vs = _caches(rng, "fp8")
    q = rng.standard_normal((B, 1, H, D)).astype(np.float32)
    with pytest.raises(ValueError, match="k_cache must hold"):  # a bool cache is 1 byte too
        flashattn.kvcache_attention(q, kc.view(np.uint8).astype(bool), vc, cache_seqlens=10, cache_dtype="int8",
                                    k_scale=ks, v_scale=vs)
    # uint8 bits of fp8 codes are the documented alternative to ml_dtypes' type
    o = flashattn.kvcache_attention(q, kc.view(np.uint8), vc.view(np.uint8), cache_seqlens=10, cache_dtype="fp8",
                                    k_scale=ks, v_scale=vs)
    ref = flashattn.kvcache_attention(q, kc, vc, cache_seqlens=10, cache_dtype="fp8", k_scale=ks, v_scale=vs)
    assert np.array_equal(o, ref)


def test_written_buffers_must_not_overlap(rng):
    kc, ks, vc, vs = _caches(rng, "int8")
    q = rng.standard_normal((B, 1, H, D)).astype(np.float32)
    kn = rng.standard_normal((B, 1, H, D)).astype(np.float32)
    k0 = kc.copy()
    with pytest.raises(ValueError, match="k_cache and v_cache share memory"):
        flashattn.kvcache_attention(q, kc, kc, kn, kn, cache_seqlens=10, cache_dtype="int8", k_scale=ks, v_scale=vs)
    with pytest.raises(ValueError, match="k_scale and v_scale share memory"):
        flashattn.kvcache_attention(q, kc, vc, kn, kn, cache_seqlens=10, cache_dtype="int8", k_scale=ks, v_scale=ks)
    assert np.array_equal(kc, k0)
    # plain caches too, and torch
    kv = rng.standard_normal((B, S, 2, H, D)).astype(np.float32)
    with pytest.raises(ValueError, match="share memory"):
        flashattn.kvcache_attention(q, kv[:, :, 0], kv[:, :, 0], kn, kn, cache_seqlens=10)
    tkv, tq, tkn = torch.from_numpy(kv.copy()), torch.from_numpy(q), torch.from_numpy(kn)
    with pytest.raises(ValueError, match="share memory"):
        fat.kvcache_attention(tq, tkv[:, :, 0], tkv[:, :, 0], tkn, tkn, cache_seqlens=10)
    # k and v of one combined cache, interleaved but disjoint: allowed, and the same as separate caches
    sep_k, sep_v = kv[:, :, 0].copy(), kv[:, :, 1].copy()
    want = flashattn.kvcache_attention(q, sep_k, sep_v, kn, kn, cache_seqlens=10)
    got = flashattn.kvcache_attention(q, kv[:, :, 0], kv[:, :, 1], kn, kn, cache_seqlens=10)
    assert np.array_equal(got, want) and np.array_equal(kv[:, :, 0], sep_k) and np.array_equal(kv[:, :, 1], sep_v)
    tgot = fat.kvcache_attention(tq, tkv[:, :, 0], tkv[:, :, 1], tkn, tkn, cache_seqlens=10)
    assert np.array_equal(tgot.numpy(), want)


def test_torch_quantize_cache_degenerate():
    codes, scales, _, _ = fat.quantize_cache(torch.zeros(3, 0), torch.zeros(3, 0), "int8")
    assert codes.shape == (3, 0) and torch.equal(scales, torch.ones(3))  # amax 0: scale 1 (docs/caches.md)
    with pytest.raises(ValueError, match="head_dim axis"):
        fat.quantize_cache(torch.tensor(2.0), torch.tensor(3.0), "int8")


def test_merge_states_without_values(rng):
    la, lb = (rng.standard_normal((3, 2)).astype(np.float32) for _ in range(2))
    sinks = rng.standard_normal(2).astype(np.float32)
    want = np.logaddexp(np.logaddexp(la, lb), sinks).astype(np.float32)
    for f, conv in ((flashattn.merge_states, lambda x: x), (fat.merge_states, torch.from_numpy)):
        o, lse = f(conv(np.zeros((3, 2, 0), np.float32)), conv(la), conv(np.zeros((3, 2, 0), np.float32)), conv(lb),
                   sinks=conv(sinks))
        assert tuple(o.shape) == (3, 2, 0)
        np.testing.assert_allclose(np.asarray(lse), want, rtol=0, atol=2e-6)


@pytest.mark.parametrize("bad", [np.float64, np.bool_, np.complex64, np.int32])
def test_scales_must_be_float32(rng, bad):
    kc, ks, vc, vs = _caches(rng, "int8")
    q = rng.standard_normal((B, 1, H, D)).astype(np.float32)
    kn = rng.standard_normal((B, 1, H, D)).astype(np.float32)
    for new in ((), (kn, kn.copy())):  # without and with an append: one rule
        with pytest.raises(ValueError, match="k_scale must be float32"):
            flashattn.kvcache_attention(q, kc.copy(), vc.copy(), *new, cache_seqlens=10, cache_dtype="int8",
                                        k_scale=ks.astype(bad), v_scale=vs.copy())
    if bad == np.float64:  # JAX itself makes float64 float32 where x64 is off (its convention)
        return
    jnp = pytest.importorskip("jax.numpy")
    import flashattn.jax as faj
    with pytest.raises(ValueError, match="v_scale must be float32"):
        faj.kvcache_attention(jnp.asarray(q), jnp.asarray(kc), jnp.asarray(vc), cache_seqlens=10, cache_dtype="int8",
                              k_scale=jnp.asarray(ks), v_scale=jnp.asarray(vs.astype(bad)))


@pytest.mark.parametrize("cache_dtype", [None, "int8"])
def test_empty_caches_with_new_tokens(rng, cache_dtype):
    """B = 0 with an append: empty outputs (numpy gives empty arrays zero strides, which the
    in-place check once refused), as torch gives."""
    dt = np.int8 if cache_dtype else np.float32
    kc, vc = np.zeros((0, S, H, D), dt), np.zeros((0, S, H, D), dt)
    q, kn = np.zeros((0, 1, H, D), np.float32), np.zeros((0, 1, H, D), np.float32)
    sc = dict(k_scale=np.ones((0, S, H), np.float32), v_scale=np.ones((0, S, H), np.float32)) if cache_dtype else {}
    o, lse = flashattn.kvcache_attention(q, kc, vc, kn, kn.copy(), cache_seqlens=np.zeros(0, np.int32),
                                         cache_dtype=cache_dtype, return_lse=True, **sc)
    assert o.shape == (0, 1, H, D) and lse.shape == (0, H, 1)


def test_numpy_inference_threads(rng):
    """threads= as in attention: the same bits on 1 and 2 threads (batch invariance), and a
    bad count named."""
    kc, ks, vc, vs = _caches(rng, "fp8")
    q = rng.standard_normal((B, 3, H, D)).astype(np.float32)
    outs = [flashattn.kvcache_attention(q, kc, vc, cache_seqlens=[20, 7], cache_dtype="fp8", k_scale=ks, v_scale=vs,
                                        causal=True, threads=t) for t in (1, 2)]
    assert np.array_equal(outs[0], outs[1])
    with pytest.raises(ValueError, match="threads"):
        flashattn.kvcache_attention(q, kc, vc, cache_seqlens=10, cache_dtype="fp8", k_scale=ks, v_scale=vs, threads=-2)
    qp, kp = (rng.standard_normal((40, H, D)).astype(np.float32) for _ in range(2))
    cu = np.array([0, 15, 40], np.int32)
    vo = [flashattn.varlen_attention(qp, kp, kp, cu, cu, causal=True, return_lse=True, threads=t) for t in (1, 2)]
    assert np.array_equal(vo[0][0], vo[1][0]) and np.array_equal(vo[0][1], vo[1][1])
    do = rng.standard_normal(vo[0][0].shape).astype(np.float32)
    g = [flashattn.varlen_attention_backward(qp, kp, kp, vo[0][0], vo[0][1], do, cu, cu, causal=True, threads=t)
         for t in (1, 2)]
    assert all(np.array_equal(a, b) for a, b in zip(g[0], g[1]))
