"""Shared prefixes (cascade, docs/semantics.md "Shared prefixes") through the torch and JAX
fronts: kvcache_attention(..., k_prefix=, v_prefix=) against the same step without sharing
(the prefix copied in front of every cache) and against a float64 reference written here
from the definition (sequence b attends to the prefix, then its own cache rows, then its new
tokens, in that position order; causal bottom-right over all of them; a sink is one more
logit without a value); the appended rows; torch.compile and jax.jit; the checks every
front shares (one home: _problem_inference.check_prefix) and the library's refusal of a
prefix over a quantized cache. The numpy front: test_lengths_per_call.py."""
import numpy as np
import pytest

import flashattn
from conftest import SEED, check, randn

B, P, S, SQ, HQ, HK, D = 3, 40, 24, 2, 4, 2, 16
LENS = np.array([0, 7, 22], np.int32)  # + SQ new tokens each: at most S


def inputs(rng, dtype="f32"):
    d = dict(kp=randn(rng, (P, HK, D), dtype), vp=randn(rng, (P, HK, D), dtype),
             kc=randn(rng, (B, S, HK, D), dtype), vc=randn(rng, (B, S, HK, D), dtype),
             q=randn(rng, (B, SQ, HQ, D), dtype), kn=randn(rng, (B, SQ, HK, D), dtype),
             vn=randn(rng, (B, SQ, HK, D), dtype), sinks=rng.standard_normal(HQ).astype(np.float32))
    d["sinks"][0] = 4.0  # weighs in its rows
    return d


def reference(d, sinks):
    """float64 o [B, SQ, HQ, D]: each sequence's keys in position order, causal bottom-right."""
    f = lambda a: np.asarray(a, np.float64)  # noqa: E731
    out = np.zeros((B, SQ, HQ, D))
    for b in range(B):
        n = LENS[b]
        k = np.concatenate([f(d["kp"]), f(d["kc"][b, :n]), f(d["kn"][b])])  # [Sk_b, HK, D]
        v = np.concatenate([f(d["vp"]), f(d["vc"][b, :n]), f(d["vn"][b])])
        sk = k.shape[0]
        for h in range(HQ):
            g = h // (HQ // HK)
            s = f(d["q"][b, :, h]) @ k[:, g].T / np.sqrt(D)  # [SQ, Sk_b]
            s = np.where(np.arange(sk)[None, :] <= np.arange(SQ)[:, None] + sk - SQ, s, -np.inf)
            m = s.max(1, keepdims=True)
            if sinks is not None:
                m = np.maximum(m, sinks[h])
            w = np.exp(s - m)
            z = w.sum(1, keepdims=True) + (0.0 if sinks is None else np.exp(sinks[h] - m))
            out[b, :, h] = (w / z) @ v[:, g]
    return out


def unshared(d):
    """The caches with the prefix copied in front of every one, and their lengths."""
    cat = lambda p, c: np.concatenate([np.broadcast_to(p, (B,) + p.shape), c], 1).copy()  # noqa: E731
    return cat(d["kp"], d["kc"]), cat(d["vp"], d["vc"]), LENS + P


def appended(d, name):
    """The cache after the step: the new tokens at rows LENS[b] .. LENS[b] + SQ - 1."""
    c = d[name + "c"].copy()
    for b in range(B):
        c[b, LENS[b]:LENS[b] + SQ] = d[name + "n"][b]
    return c


TOL = {"f32": 1e-5, "bf16": 2e-2}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_torch_prefix_equals_unshared_and_reference(rng, dtype, with_sinks):
    torch = pytest.importorskip("torch")
    import flashattn.torch as ft
    d = inputs(rng, dtype)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16) \
        if dtype == "bf16" else torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    sinks = torch.from_numpy(d["sinks"]) if with_sinks else None
    kc, vc = t(d["kc"]), t(d["vc"])
    o = ft.kvcache_attention(t(d["q"]), kc, vc, t(d["kn"]), t(d["vn"]), torch.from_numpy(LENS), causal=True,
                             sinks=sinks, k_prefix=t(d["kp"]), v_prefix=t(d["vp"]))
    uk, uv, ulens = unshared(d)
    uk, uv = t(uk), t(uv)
    o_u = ft.kvcache_attention(t(d["q"]), uk, uv, t(d["kn"]), t(d["vn"]), torch.from_numpy(ulens), causal=True,
                               sinks=sinks)
    f = lambda x: x.float().numpy()  # noqa: E731
    print(f"seed {SEED}")
    check("o vs unshared", f(o), f(o_u), TOL[dtype])
    check("o", f(o), reference(d, d["sinks"] if with_sinks else None), TOL[dtype])
    for name, got, u in (("k", kc, uk), ("v", vc, uv)):
        np.testing.assert_array_equal(f(got), np.asarray(appended(d, name), np.float32), err_msg=f"{name} cache")
        np.testing.assert_array_equal(f(got), f(u)[:, P:], err_msg=f"{name} cache vs unshared")


@pytest.mark.parametrize("with_sinks", [False, True])
def test_numpy_prefix_with_sinks_matches_reference(rng, with_sinks):
    """The numpy front (its own test: test_lengths_per_call.py) with sinks, the third front
    of the combination prefix x sinks."""
    d = inputs(rng)
    kc, vc = d["kc"].copy(), d["vc"].copy()
    o = flashattn.kvcache_attention(d["q"], kc, vc, d["kn"], d["vn"], LENS, causal=True,
                                    sinks=d["sinks"] if with_sinks else None, k_prefix=d["kp"], v_prefix=d["vp"])
    print(f"seed {SEED}")
    check("o", o, reference(d, d["sinks"] if with_sinks else None), TOL["f32"])
    np.testing.assert_array_equal(kc, appended(d, "k"))


@pytest.mark.parametrize("with_sinks", [False, True])
def test_prefix_over_caches_of_no_capacity(rng, with_sinks):
    """Own caches of capacity 0 ([B, 0, Hk, D]) with a shared prefix: every row attends to
    the prefix alone (the call is not an empty problem: it once gave o = 0, lse = -inf). The
    plan's cost equals the kernels' counts."""
    d = inputs(rng)
    empty = np.zeros((B, 0, HK, D), np.float32)
    sinks = d["sinks"] if with_sinks else None
    o, lse = flashattn.kvcache_attention(d["q"], empty, empty, cache_seqlens=np.zeros(B, np.int32), causal=True,
                                         sinks=sinks, k_prefix=d["kp"], v_prefix=d["vp"], return_lse=True)
    f = lambda a: np.asarray(a, np.float64)  # noqa: E731
    for h in range(HQ):
        s = np.einsum("bqd,kd->bqk", f(d["q"][:, :, h]), f(d["kp"][:, h // (HQ // HK)])) / np.sqrt(D)
        s = np.where(np.arange(P)[None, :] <= np.arange(SQ)[:, None] + P - SQ, s, -np.inf)  # causal, bottom-right
        m = s.max(-1, keepdims=True) if sinks is None else np.maximum(s.max(-1, keepdims=True), sinks[h])
        w = np.exp(s - m)
        z = w.sum(-1, keepdims=True) + (0.0 if sinks is None else np.exp(sinks[h] - m))
        check("o", o[:, :, h], (w / z) @ f(d["vp"][:, h // (HQ // HK)]), TOL["f32"])
        check("lse", lse[:, h], (m + np.log(z))[..., 0], TOL["f32"])


def test_torch_prefix_compiled_matches_eager(rng):
    torch = pytest.importorskip("torch")
    import flashattn.torch as ft
    d = {k: torch.from_numpy(v) for k, v in inputs(rng).items()}
    lens = torch.from_numpy(LENS)

    def step(q, kc, vc, kn, vn, kp, vp):
        return ft.kvcache_attention(q, kc, vc, kn, vn, lens, causal=True, k_prefix=kp, v_prefix=vp,
                                    return_lse=True)

    caches = [(d["kc"].clone(), d["vc"].clone()) for _ in range(2)]
    eager = step(d["q"], *caches[0], d["kn"], d["vn"], d["kp"], d["vp"])
    got = torch.compile(step, fullgraph=True)(d["q"], *caches[1], d["kn"], d["vn"], d["kp"], d["vp"])
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(*caches):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("with_sinks", [False, True])
def test_jax_prefix_equals_unshared_and_reference(rng, with_sinks):
    pytest.importorskip("jax")
    import jax
    import flashattn.jax as fj
    d = inputs(rng)
    sinks = d["sinks"] if with_sinks else None
    kw = dict(causal=True, sinks=sinks)
    o, kc, vc = fj.kvcache_attention(d["q"], d["kc"], d["vc"], d["kn"], d["vn"], LENS, k_prefix=d["kp"],
                                     v_prefix=d["vp"], **kw)
    uk, uv, ulens = unshared(d)
    o_u, uk2, uv2 = fj.kvcache_attention(d["q"], uk, uv, d["kn"], d["vn"], ulens, **kw)
    print(f"seed {SEED}")
    check("o vs unshared", np.asarray(o), np.asarray(o_u), TOL["f32"])
    check("o", np.asarray(o), reference(d, sinks), TOL["f32"])
    for name, got, u in (("k", kc, uk2), ("v", vc, uv2)):
        np.testing.assert_array_equal(np.asarray(got), appended(d, name), err_msg=f"{name} cache")
        np.testing.assert_array_equal(np.asarray(got), np.asarray(u)[:, P:], err_msg=f"{name} cache vs unshared")
    # under jit, lengths and prefix traced: the handler plans with them when it runs
    step = jax.jit(lambda q, kc, vc, kn, vn, lens, kp, vp: fj.kvcache_attention(
        q, kc, vc, kn, vn, lens, k_prefix=kp, v_prefix=vp, **kw))
    jo, jkc, _ = step(d["q"], d["kc"], d["vc"], d["kn"], d["vn"], LENS, d["kp"], d["vp"])
    np.testing.assert_array_equal(np.asarray(jo), np.asarray(o))
    np.testing.assert_array_equal(np.asarray(jkc), np.asarray(kc))


def _fronts():
    """(name, kvcache_attention, array converter, quantize_cache) of every front installed."""
    out = [("numpy", flashattn.kvcache_attention, np.asarray, flashattn.quantize_cache)]
    try:
        import torch
        import flashattn.torch as ft
        out.append(("torch", ft.kvcache_attention, torch.from_numpy, ft.quantize_cache))
    except ImportError:
        pass
    try:
        import jax.numpy as jnp
        import flashattn.jax as fj
        out.append(("jax", fj.kvcache_attention, jnp.asarray, fj.quantize_cache))
    except ImportError:
        pass
    return out


@pytest.mark.parametrize("front", _fronts(), ids=lambda f: f[0])
def test_every_front_checks_the_prefix_alike(rng, front):
    """The same messages from every front (one check), and the library's refusal of a
    prefix over a quantized cache, naming both features."""
    _, attend, a, quantize = front
    d = {k: a(v) for k, v in inputs(rng).items()}
    lens = a(LENS)
    base = (d["q"], d["kc"], d["vc"])
    with pytest.raises(ValueError, match="k_prefix and v_prefix .* go together"):
        attend(*base, cache_seqlens=lens, k_prefix=d["kp"])
    with pytest.raises(ValueError, match=r"must be \[P, Hk, D\] = \(40, 2, 16\)"):
        attend(*base, cache_seqlens=lens, k_prefix=d["kp"], v_prefix=d["vp"][:, :1])
    half = a(inputs(rng, "f32")["vp"].astype(np.float16))
    with pytest.raises(ValueError, match="k_prefix and v_prefix must have q's dtype"):
        attend(*base, cache_seqlens=lens, k_prefix=d["kp"], v_prefix=half)
    kq, ks, vq, vs = quantize(d["kc"], d["vc"], "int8")
    with pytest.raises(ValueError, match="quantized kv cache .*does not combine with a shared prefix"):
        attend(d["q"], kq, vq, cache_seqlens=lens, cache_dtype="int8", k_scale=ks, v_scale=vs, k_prefix=d["kp"],
               v_prefix=d["vp"])


@pytest.mark.parametrize("front", _fronts(), ids=lambda f: f[0])
def test_an_empty_prefix_is_no_prefix_in_every_front(rng, front):
    """P = 0: the step without a prefix, bit for bit (numpy and JAX refused it with the
    library's "k_prefix is given, but ... shared_prefix_len" message, JAX only when the call
    ran; torch took it)."""
    _, attend, a, _ = front
    d = {k: a(v) for k, v in inputs(rng).items()}
    lens = a(LENS)
    first = lambda r: np.asarray(r[0] if isinstance(r, tuple) else r)  # noqa: E731 (JAX: o and the caches)
    want = first(attend(d["q"], d["kc"], d["vc"], cache_seqlens=lens))
    got = first(attend(d["q"], d["kc"], d["vc"], cache_seqlens=lens, k_prefix=d["kp"][:0], v_prefix=d["vp"][:0]))
    np.testing.assert_array_equal(got, want, err_msg=f"seed {SEED}")
