"""The numpy and torch fronts of the inference shapes judge the same arguments alike: a decoding
step with no rows still runs the library (its checks of lengths and sinks included), one integer
is every sequence's cache length in both, and max_seqlen_q/k follow the one integer rule of
every integer option (JAX's packed call too, where its lengths are concrete)."""
import numpy as np
import pytest

import flashattn
from conftest import randn

torch = pytest.importorskip("torch")
import flashattn.torch as ft  # noqa: E402

HQ, HK, D = 4, 2, 16


def _both(call):
    """call(front) in numpy and torch: ("ok", outputs as numpy) or ("error", message)."""
    out = []
    for front in ("numpy", "torch"):
        try:
            res = call(front)
            out.append(("ok", [np.asarray(r) if front == "numpy" else r.numpy() for r in res]))
        except ValueError as e:
            out.append(("error", str(e)))
    return out


def _decode(front, q, kc, vc, lens, **kw):
    """kvcache_attention in one front, on copies of the caches; (o, lse, k_cache, v_cache)."""
    kc, vc = kc.copy(), vc.copy()
    conv = (lambda a: a) if front == "numpy" else (lambda a: a if a is None else torch.from_numpy(a))
    fn = flashattn.kvcache_attention if front == "numpy" else ft.kvcache_attention
    kw = {n: conv(a) for n, a in kw.items()}
    tk, tv = conv(kc), conv(vc)
    o, lse = fn(conv(q), tk, tv, cache_seqlens=conv(lens), return_lse=True, **kw)
    return o, lse, tk, tv


# A step with no new rows (Sq_new = 0), no batch or no query heads: torch answered it itself with
# a stand-in plan of lengths [0] and no sinks, so lengths of -1 or past the capacity and NaN
# sinks passed there while numpy (which runs the library) refused them.
@pytest.mark.parametrize("B, Sq, Hq", [(2, 0, HQ), (2, 1, 0), (0, 1, HQ), (2, 3, HQ)])
@pytest.mark.parametrize("bad", [None, "negative length", "length past the capacity", "nan sink", "new tokens"])
def test_decode_without_rows_runs_the_library(rng, B, Sq, Hq, bad):
    q = randn(rng, (B, Sq, Hq, D))
    kc, vc = randn(rng, (B, 8, HK, D)), randn(rng, (B, 8, HK, 8))
    lens = np.full(B, 3, np.int32)
    kw = {"sinks": randn(rng, (Hq,))}
    message = {"negative length": "is negative", "length past the capacity": "exceeds the cache capacity",
               "nan sink": "must be finite"}.get(bad)
    if B == 0 and bad in ("negative length", "length past the capacity"):
        pytest.skip("no sequence to give a length")
    if Hq == 0 and bad == "nan sink":
        pytest.skip("no head to give a sink")
    if bad == "negative length":
        lens[0] = -1
    elif bad == "length past the capacity":
        lens[-1] = 99
    elif bad == "nan sink":
        kw["sinks"][0] = np.nan
    elif bad == "new tokens":
        kw.update(k=randn(rng, (B, Sq, HK, D)), v=randn(rng, (B, Sq, HK, 8)))
    (kind_np, got_np), (kind_t, got_t) = _both(lambda front: _decode(front, q, kc, vc, lens, **kw))
    if message is not None:
        assert kind_np == kind_t == "error", (got_np, got_t)
        assert message in got_np and got_t == got_np
        return
    assert kind_np == kind_t == "ok", (got_np, got_t)
    for a, b in zip(got_np, got_t):
        assert a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    if bad != "new tokens":
        assert np.array_equal(got_t[2], kc) and np.array_equal(got_t[3], vc)


# cache_seqlens as one integer: torch took 5 and np.int64(5) but refused a 0-d integer tensor
# ("must be integers [batch]"), and took a 0-d float or bool numpy array as an int (4.5 as 4)
@pytest.mark.parametrize("n", [np.array(5), torch.tensor(5), torch.tensor(5, dtype=torch.int32),
                               torch.tensor(5, dtype=torch.uint8), np.int64(5), 5])
def test_one_integer_is_every_sequences_length(rng, n):
    q, kc, vc = randn(rng, (2, 1, HQ, D)), randn(rng, (2, 32, HK, D)), randn(rng, (2, 32, HK, D))
    want = ft.kvcache_attention(*(torch.from_numpy(a) for a in (q, kc, vc)), cache_seqlens=torch.tensor([5, 5]))
    got = ft.kvcache_attention(*(torch.from_numpy(a) for a in (q, kc, vc)), cache_seqlens=n)
    assert torch.equal(got, want)
    as_np = n.numpy() if isinstance(n, torch.Tensor) else n
    assert np.array_equal(flashattn.kvcache_attention(q, kc, vc, cache_seqlens=as_np), want.numpy())


@pytest.mark.parametrize("n, message", [
    (torch.tensor(5.0), "cache_seqlens must be integers"), (torch.tensor(True), "cache_seqlens must be integers"),
    (np.array(4.5), "cache_seqlens must be an int"), (np.array(True), "cache_seqlens must be an int"),
    (torch.tensor(2**40), "must fit int32"), (torch.tensor(-1), "is negative"),
    (torch.tensor(40), "exceeds the cache capacity 32")])
def test_one_integer_of_another_kind_is_refused(rng, n, message):
    q, kc = torch.from_numpy(randn(rng, (2, 1, HQ, D))), torch.from_numpy(randn(rng, (2, 32, HK, D)))
    with pytest.raises(ValueError, match=message):
        ft.kvcache_attention(q, kc, kc.clone(), cache_seqlens=n)
    with pytest.raises(ValueError, match="cache_seqlens"):  # numpy refuses it too
        flashattn.kvcache_attention(q.numpy(), kc.numpy(), kc.numpy().copy(),
                                    cache_seqlens=n.numpy() if isinstance(n, torch.Tensor) else n)


# max_seqlen_q/k: numpy truncated any value with int() (4.9, "7", True, 2**70 taken), torch
# refused them; now one rule (an integer that fits int64) in every front
@pytest.mark.parametrize("value, message", [(4.9, "must be an integer, got 4.9"), ("7", "must be an integer"),
                                            (True, "must be an integer, got True"),
                                            (np.float64(7.0), "must be an integer"),
                                            (np.array(4.9), r"must be an integer, got array\(4\.9\)"),
                                            (2**70, "does not fit a 64-bit signed integer"),
                                            (3, "max_seqlen_q = 3 but a sequence has 4 rows"),
                                            (7, None), (np.int64(4), None), (np.array(4, np.int32), None)])
@pytest.mark.parametrize("front", ["numpy", "torch", "jax"])
def test_max_seqlen_one_rule(rng, front, value, message):
    q, k = randn(rng, (7, HQ, D)), randn(rng, (9, HK, D))
    cq, ck = np.array([0, 3, 7], np.int32), np.array([0, 4, 9], np.int32)
    if front == "numpy":
        call = lambda m: flashattn.varlen_attention(q, k, k, cq, ck, m, None)  # noqa: E731
    elif front == "torch":
        T = torch.from_numpy
        call = lambda m: ft.varlen_attention(T(q), T(k), T(k), T(cq), T(ck), m, None)  # noqa: E731
    else:
        pytest.importorskip("jax")
        import flashattn.jax as fj
        call = lambda m: fj.varlen_attention(q, k, k, cq, ck, m, None)  # noqa: E731
    if message is None:
        assert np.asarray(call(value)).shape == (7, HQ, D)
    else:
        with pytest.raises(ValueError, match=f"max_seqlen_q.*{message}" if "max_seqlen" not in message else message):
            call(value)


# under jax.jit with traced cu_seqlens there are no lengths to compare a bound with, but a
# static max_seqlen still follows the integer rule (4.9 was taken silently); a traced one is
# not read (as torch.compile's)
@pytest.mark.parametrize("value, message", [(4.9, "must be an integer, got 4.9"), ("7", "must be an integer"),
                                            (np.array(4.9), "must be an integer, got array"),
                                            (2**70, "does not fit a 64-bit signed integer"),
                                            (3, None), (np.int64(4), None)])
def test_max_seqlen_integer_rule_with_traced_lengths(rng, value, message):
    jax = pytest.importorskip("jax")
    import flashattn.jax as fj
    q, k = randn(rng, (7, HQ, D)), randn(rng, (9, HK, D))
    cq, ck = np.array([0, 3, 7], np.int32), np.array([0, 4, 9], np.int32)
    f = jax.jit(lambda a, b: fj.varlen_attention(q, k, k, a, b, value, value))
    if message is None:  # 3 is below a sequence's 4 rows: not judged, the lengths unknown when built
        np.testing.assert_allclose(np.asarray(f(cq, ck)), np.asarray(fj.varlen_attention(q, k, k, cq, ck)),
                                   rtol=0, atol=0)
    else:
        with pytest.raises(ValueError, match=f"max_seqlen_q {message}" if "fit" not in message else
                           f"max_seqlen_q = .* {message}"):
            f(cq, ck)
    traced = jax.jit(lambda a, b, m: fj.varlen_attention(q, k, k, a, b, m, None))
    assert traced(cq, ck, np.int32(5)).shape == (7, HQ, D)
