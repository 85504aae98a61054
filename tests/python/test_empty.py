"""Zero-size problems (a zero B, H, Sq or Sk; packed batches with no rows or no keys): empty
results, or o = 0 and lse = -inf where there are no keys, zero gradients, a plan with no
flops; the library plans and runs them (numpy; torch's and JAX's packed calls), the torch and
JAX dense fronts answer them themselves (device memory, meta tensors, XLA). A zero head_dim
stays an error."""
import numpy as np
import pytest

import flashattn
from conftest import randn

DENSE = [(0, 2, 4, 5), (2, 0, 4, 5), (2, 2, 0, 5), (2, 2, 4, 0)]  # (B, H, Sq, Sk)


@pytest.mark.parametrize("B, H, Sq, Sk", DENSE)
def test_numpy_dense(rng, B, H, Sq, Sk):
    q, k, v = randn(rng, (B, H, Sq, 8)), randn(rng, (B, H, Sk, 8)), randn(rng, (B, H, Sk, 6))
    o, lse = flashattn.attention(q, k, v, causal=True, return_lse=True)
    assert o.shape == (B, H, Sq, 6) and lse.shape == (B, H, Sq)
    assert (o == 0).all() and np.isneginf(lse).all()
    dq, dk, dv = flashattn.attention_backward(q, k, v, o, lse, randn(rng, o.shape), causal=True)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert not any(g.any() for g in (dq, dk, dv))
    bias = randn(rng, (1, H, Sq, Sk))
    *_, dbias = flashattn.attention_backward(q, k, v, o, lse, o, bias=bias, bias_grad=True)
    assert dbias.shape == bias.shape and not dbias.any()
    p = flashattn.plan(batch=B, heads=H, seq_q=Sq, seq_k=Sk, head_dim=8, head_dim_v=6)
    assert p.forward["flops"] == p.backward["flops"] == p.backward["transcendentals"] == 0
    # rows without keys (Sk = 0) count the log of their lse, as every row does (docs/semantics.md)
    assert p.forward["transcendentals"] == (B * H * Sq if Sk == 0 else 0)
    assert p.forward["bytes_accessed"] == B * H * Sq * (6 * 4 + 4)  # the o and lse filled


def test_head_dim_zero_stays_an_error(rng):
    with pytest.raises(ValueError, match="head_dim"):
        flashattn.plan(batch=1, heads=1, seq_q=4, head_dim=0)
    q = np.zeros((1, 1, 4, 0), np.float32)
    with pytest.raises(ValueError, match="head_dim"):
        flashattn.attention(q, q, q)


@pytest.mark.parametrize("cu_q, cu_k", [([0], [0]), ([0, 0, 0], [0, 3, 5]), ([0, 2, 3], [0, 0, 0])])
def test_numpy_packed(rng, cu_q, cu_k):
    Tq, Tk = cu_q[-1], cu_k[-1]
    q, k, v = randn(rng, (Tq, 2, 8)), randn(rng, (Tk, 2, 8)), randn(rng, (Tk, 2, 8))
    o, lse = flashattn.varlen_attention(q, k, v, np.array(cu_q), np.array(cu_k), return_lse=True)
    assert o.shape == (Tq, 2, 8) and lse.shape == (2, Tq)
    assert (o == 0).all() and np.isneginf(lse).all()
    dq, dk, dv = flashattn.varlen_attention_backward(q, k, v, o, lse, o, np.array(cu_q), np.array(cu_k))
    assert dq.shape == q.shape and dk.shape == k.shape and not (dq.any() or dk.any() or dv.any())
    p = flashattn.plan_varlen(np.array(cu_q), np.array(cu_k), heads=2, head_dim=8)
    assert p.forward["flops"] == 0


@pytest.mark.parametrize("B, H, Sq, Sk", DENSE)
def test_jax_dense_and_packed(rng, B, H, Sq, Sk):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import flashattn.jax as fj
    q, k, v = (jnp.asarray(randn(rng, (B, s, H, 8))) for s in (Sq, Sk, Sk))
    o, lse = fj.attention(q, k, v, return_lse=True, causal=True)
    assert o.shape == q.shape and lse.shape == (B, H, Sq)
    assert not np.asarray(o).any() and np.isneginf(np.asarray(lse)).all()
    g = jax.grad(lambda q, k, v: jnp.sum(fj.attention(q, k, v) ** 2), argnums=(0, 1, 2))(q, k, v)
    assert [x.shape for x in g] == [q.shape, k.shape, v.shape] and not any(np.asarray(x).any() for x in g)
    assert fj.plan(q, k, v).forward["flops"] == 0
    cu_q, cu_k = jnp.array([0, B * Sq], jnp.int32), jnp.array([0, B * Sk], jnp.int32)
    qp, kp, vp = (x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:]) for x in (q, k, v))
    o = fj.varlen_attention(qp, kp, vp, cu_q, cu_k)
    assert o.shape == qp.shape and not np.asarray(o).any()


# Packed calls with no keys, no sequences or capacity rows: the torch front once answered
# these itself, giving every row (capacity rows too) its head's sink as lse, a sinks
# gradient from rows of no sequence, and accepting any prefix sums; JAX under jit (traced
# sums) accepted any. Now the library judges and runs them, as numpy's front always did.
@pytest.mark.parametrize("cu_q, cu_k", [([0], [0]), ([0, 1], [0, 0]), ([0, 1, 1], [0, 0, 0])])
def test_packed_without_keys_rows_past_the_sums(rng, cu_q, cu_k):
    torch = pytest.importorskip("torch")
    import flashattn.torch as ft
    q, k = randn(rng, (3, 2, 8)), randn(rng, (0, 2, 8))
    sinks = np.float32([0.5, -1.0])
    want = np.full((2, 3), -np.inf, np.float32)
    want[:, :cu_q[-1]] = sinks[:, None]  # rows of a sequence without keys: the sink; capacity rows: -inf
    o, lse = flashattn.varlen_attention(q, k, k, np.array(cu_q), np.array(cu_k), return_lse=True, sinks=sinks)
    assert np.array_equal(lse, want) and not o.any()
    s = torch.tensor(sinks, requires_grad=True)
    o, lse = ft.varlen_attention(torch.tensor(q), torch.tensor(k), torch.tensor(k), torch.tensor(cu_q),
                                 torch.tensor(cu_k), return_lse=True, sinks=s)
    assert np.array_equal(lse.detach().numpy(), want) and not o.detach().numpy().any()
    torch.where(torch.isinf(lse), 0, lse).sum().backward()  # d lse_row / d sink = 1 for rows of a sequence
    assert s.grad.tolist() == [float(cu_q[-1])] * 2


# A paged cache of capacity 0 (a block table [B, 0]) plans and runs as a dense one of
# capacity 0 (docs/semantics.md, "Empty problems"); it was refused ("max_pages >= 1")
def test_paged_cache_of_capacity_zero(rng):
    q, pages = randn(rng, (2, 1, 2, 16)), randn(rng, (4, 16, 1, 16))
    table, lens = np.zeros((2, 0), np.int32), np.zeros(2, np.int32)
    o, lse = flashattn.kvcache_attention(q, pages, pages, None, None, lens, table, return_lse=True)
    assert o.shape == (2, 1, 2, 16) and not o.any() and np.isneginf(lse).all()
    with pytest.raises(ValueError, match="exceeds the cache capacity 0"):
        flashattn.kvcache_attention(q, pages, pages, None, None, np.array([1, 0], np.int32), table)
    torch = pytest.importorskip("torch")
    import flashattn.torch as ft
    o, lse = ft.kvcache_attention(*(torch.from_numpy(x) for x in (q, pages, pages)), None, None,
                                  torch.from_numpy(lens), torch.from_numpy(table), return_lse=True)
    assert not o.numpy().any() and np.isneginf(lse.numpy()).all()


BAD_SUMS = [([0, 5], [0, 0], "reaches past"), ([0, 2, 1, 3], [0, 0, 0, 0], "non-decreasing"),
            ([1, 3], [0, 0], "must be 0"), ([0, 3], [0, 4], "reaches past")]


@pytest.mark.parametrize("cu_q, cu_k, message", BAD_SUMS)
def test_packed_without_keys_bad_sums_refused(rng, cu_q, cu_k, message):
    q, k = randn(rng, (3, 2, 8)), randn(rng, (0, 2, 8))
    cq, ck = np.array(cu_q, np.int32), np.array(cu_k, np.int32)
    with pytest.raises(ValueError, match=message):
        flashattn.varlen_attention(q, k, k, cq, ck)
    torch = pytest.importorskip("torch")
    import flashattn.torch as ft
    with pytest.raises(ValueError, match=message):
        ft.varlen_attention(torch.tensor(q), torch.tensor(k), torch.tensor(k), torch.tensor(cq), torch.tensor(ck))
    jax = pytest.importorskip("jax")
    import flashattn.jax as fj
    with pytest.raises(Exception, match=message):  # traced sums: judged by the call (XLA's error)
        jax.jit(lambda a, b: fj.varlen_attention(q, k, k, a, b))(cq, ck).block_until_ready()


@pytest.mark.parametrize("B, H", [(0, 2), (1, 0)])
def test_mask_arguments_checked_on_empty_calls(rng, B, H):
    """A zero batch or zero heads computes nothing, but a flashattn.masks mask's arguments
    are still checked against the sequences they depend on, as every other option is (they
    once passed unchecked); good ones still give empty outputs, in every front."""
    import flashattn.masks as M
    torch = pytest.importorskip("torch")
    import flashattn.torch as fat
    jnp = pytest.importorskip("jax.numpy")
    import flashattn.jax as fj
    q = randn(rng, (B, H, 64, 8))
    bad = [M.documents([10, 20]), M.chunked(0), M.prefix_lm(-3), M.from_array(np.ones((5, 5), bool))]
    for m in bad:
        with pytest.raises(ValueError):
            flashattn.attention(q, q, q, mask=m)
        with pytest.raises(ValueError):
            fat.attention(*(torch.from_numpy(q),) * 3, mask=m)
        with pytest.raises(ValueError):
            fj.attention(*(jnp.asarray(q),) * 3, mask=m, layout="bhsd")
        with pytest.raises(ValueError):
            flashattn.plan(batch=B, heads=H, seq_q=64, head_dim=8, mask=m)
    good = M.documents([30, 34]) & M.chunked(16)
    assert flashattn.attention(q, q, q, mask=good).shape == q.shape
    assert tuple(fat.attention(*(torch.from_numpy(q),) * 3, mask=good).shape) == q.shape
    assert fj.attention(*(jnp.asarray(q),) * 3, mask=good, layout="bhsd").shape == q.shape


def test_zero_value_head_dim_is_an_error(rng):
    """v [..., 0]: the library reads head_dim_v 0 as "the same as head_dim", so a front that
    passed it on ran a D-column problem over an empty v, reading (and, through out=, writing)
    past its end. Every front refuses it by name, as it refuses D = 0."""
    q = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    vbuf = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    obuf = np.full((1, 2, 3, 4), 7.0, np.float32)
    with pytest.raises(ValueError, match="head_dim_v must be positive"):
        flashattn.attention(q, q, vbuf[..., :0], out=obuf[..., :0])
    assert np.all(obuf == 7.0)
    with pytest.raises(ValueError, match="head_dim_v must be positive"):
        flashattn.plan(batch=1, heads=2, seq_q=3, head_dim=4, head_dim_v=0)
    torch = pytest.importorskip("torch")
    import flashattn.torch as fat
    tq = torch.from_numpy(q)
    for f in (fat.attention, fat.scaled_dot_product_attention):
        with pytest.raises(ValueError, match="head_dim_v must be positive"):
            f(tq, tq, tq[..., :0])
    jnp = pytest.importorskip("jax.numpy")
    import flashattn.jax as faj
    with pytest.raises(ValueError, match="head_dim_v must be positive"):
        faj.attention(jnp.asarray(q), jnp.asarray(q), jnp.asarray(q[..., :0]))


def test_zero_size_out_is_accepted():
    """out= of no elements (numpy gives it all-zero strides) is an output like any other: the
    call returns it, for every numpy function that takes out= (it was refused as overlapping)."""
    q = np.ones((0, 2, 16), np.float32)
    cu = np.array([0, 0], np.int32)
    out = np.empty((0, 2, 16), np.float32)
    assert flashattn.varlen_attention(q, q, q, cu, cu, out=out) is out
    qd, cache = np.ones((0, 1, 2, 16), np.float32), np.ones((0, 4, 2, 16), np.float32)
    out = np.empty((0, 1, 2, 16), np.float32)
    assert flashattn.kvcache_attention(qd, cache, cache, cache_seqlens=np.zeros(0, np.int32), out=out) is out
    qa = np.ones((0, 2, 4, 16), np.float32)
    out = np.empty((0, 2, 4, 16), np.float32)
    assert flashattn.attention(qa, qa, qa, out=out) is out


def test_zero_kv_heads_under_query_heads_is_an_error(rng):
    """k and v with 0 heads while q has some: the library reads heads_kv 0 as "the same as
    heads_q", so every front ran Hq heads over empty k and v, reading (and through out=
    writing) past their ends: garbage lse, a heap corrupted by the backward. Every front and
    the plans refuse it by name (docs/semantics.md, "Empty problems": Hq = 0 is the empty one)."""
    q = rng.standard_normal((1, 2, 8, 8)).astype(np.float32)
    kv = np.zeros((1, 0, 8, 8), np.float32)
    out = np.full((1, 2, 8, 8), 7.0, np.float32)
    with pytest.raises(ValueError, match="0 heads but q has 2"):
        flashattn.attention(q, kv, kv, out=out)
    assert np.all(out == 7.0)
    with pytest.raises(ValueError, match="0 heads but q has 2"):
        flashattn.attention_backward(q, kv, kv, q, q[..., 0], q)
    with pytest.raises(ValueError, match="kv_heads is 0 but heads is 2"):
        flashattn.plan(batch=1, heads=2, kv_heads=0, seq_q=8, head_dim=8)
    cu = np.array([0, 8], np.int32)
    with pytest.raises(ValueError, match="0 heads but q has 2"):
        flashattn.varlen_attention(q[0].transpose(1, 0, 2).copy(), kv[0].transpose(1, 0, 2), kv[0].transpose(1, 0, 2),
                                   cu, cu)
    cache = np.zeros((1, 8, 0, 8), np.float32)
    with pytest.raises(ValueError, match="the caches have 0 heads but q has 2"):
        flashattn.kvcache_attention(q[:, :, :1].transpose(0, 2, 1, 3).copy(), cache, cache, cache_seqlens=4)
    torch = pytest.importorskip("torch")
    import flashattn.torch as fat
    with pytest.raises(ValueError, match="0 heads but q has 2"):
        fat.attention(torch.from_numpy(q), torch.from_numpy(kv), torch.from_numpy(kv))
    jnp = pytest.importorskip("jax.numpy")
    import flashattn.jax as faj
    with pytest.raises(ValueError, match="0 heads but q has 2"):
        faj.attention(jnp.asarray(q), jnp.asarray(kv), jnp.asarray(kv), layout="bhsd")
    with pytest.raises(ValueError, match="0 heads but q has 2"):
        faj.kvcache_attention(jnp.asarray(q[:, :, :1].transpose(0, 2, 1, 3)), jnp.asarray(cache), jnp.asarray(cache),
                              cache_seqlens=4)


@pytest.mark.parametrize("B, H, Sq, bias_shape, mask_shape", [
    (0, 2, 3, (1, 1, 1, 4), (0, 2, 3, 4)), (1, 2, 0, (1, 1, 1, 4), (2, 0, 4)),
    (0, 2, 3, (0, 2, 3, 4), (3, 4)), (1, 0, 3, (0, 3, 4), (1, 1, 3, 4))])
def test_bias_and_mask_on_empty_calls(rng, B, H, Sq, bias_shape, mask_shape):
    """A bias and a boolean mask together on a zero B, H or Sq: the combined shape took the
    larger of a 1 and a 0 (1), and numpy's broadcast then failed ("operands could not be
    broadcast together"); empty outputs now, and zero gradients, as with either alone."""
    q, k = randn(rng, (B, H, Sq, 8)), randn(rng, (B, H, 4, 8))
    bias, mask = randn(rng, bias_shape), rng.random(mask_shape) < 0.5
    o, lse = flashattn.attention(q, k, k, bias=bias, mask=mask, return_lse=True)
    assert o.shape == (B, H, Sq, 8) and lse.shape == (B, H, Sq)
    dq, dk, dv, dbias = flashattn.attention_backward(q, k, k, o, lse, o, bias=bias, mask=mask, bias_grad=True)
    assert dq.shape == q.shape and dk.shape == k.shape and dbias.shape == bias.shape
    assert not dk.any() and not dv.any() and not dbias.any()
