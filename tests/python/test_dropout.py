"""Dropout (docs/semantics.md, "Dropout") through the Python fronts: forward and gradients
against a float64 reference (torch autograd) that takes the keep mask from
flashattn.dropout_keep_mask; the same seed giving the same bits, another seed another mask;
torch's autograd regenerating the forward's mask; the SDPA drop-in with dropout_p > 0;
JAX's attention with dropout_p=, seed=; bad values refused."""
import numpy as np
import pytest

import flashattn
from conftest import randn, rel_err, BWD_TOL, FWD_TOL

torch = pytest.importorskip("torch")


def keep_mask(p, seed, B, H, Sq, Sk, offset=0):
    return np.stack([np.stack([flashattn.dropout_keep_mask(p, seed, b, h, Sq, Sk, dropout_offset=offset)
                               for h in range(H)]) for b in range(B)])


def reference(q, k, v, do, keep, p, causal=False):
    """o and (dq, dk, dv) in float64, [B, H, S, D], dropout by keep, GQA by repeating k, v."""
    t = [torch.tensor(np.asarray(x, np.float64), requires_grad=True) for x in (q, k, v)]
    group = q.shape[1] // k.shape[1]
    kk, vv = (x.repeat_interleave(group, dim=1) for x in t[1:])
    s = t[0] @ kk.transpose(-1, -2) / np.sqrt(q.shape[-1])
    if causal:
        Sq, Sk = s.shape[-2:]
        hide = torch.ones(Sq, Sk, dtype=torch.bool).triu(Sk - Sq + 1)
        s = s.masked_fill(hide, -np.inf)
    w = torch.softmax(s, -1) * torch.tensor(keep, dtype=torch.float64) / (1 - p)
    o = w @ vv
    o.backward(torch.tensor(np.asarray(do, np.float64)))
    return o.detach().numpy(), [x.grad.numpy() for x in t]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_numpy_against_reference(rng, dtype, causal):
    B, Hq, Hk, Sq, Sk, D = 2, 4, 2, 37, 45, 32
    q, k, v = randn(rng, (B, Hq, Sq, D), dtype), randn(rng, (B, Hk, Sk, D), dtype), randn(rng, (B, Hk, Sk, D), dtype)
    do = randn(rng, (B, Hq, Sq, D), dtype)
    p, seed, off = 0.2, int(rng.integers(0, 2**63)), int(rng.integers(0, 5))
    o, lse = flashattn.attention(q, k, v, causal=causal, dropout_p=p, seed=seed, dropout_offset=off, return_lse=True)
    keep = keep_mask(p, seed, B, Hq, Sq, Sk, off)
    ro, (rq, rk, rv) = reference(q, k, v, do, keep, p, causal)
    assert rel_err(o, ro) < FWD_TOL[dtype]
    plain, lse0 = flashattn.attention(q, k, v, causal=causal, return_lse=True)
    np.testing.assert_array_equal(lse, lse0)  # lse is the undropped normalizer
    dq, dk, dv = flashattn.attention_backward(q, k, v, o, lse, do, causal=causal, dropout_p=p, seed=seed,
                                              dropout_offset=off)
    for g, r in ((dq, rq), (dk, rk), (dv, rv)):
        assert rel_err(g, r) < 2 * BWD_TOL[dtype]


def test_numpy_seed_and_arguments(rng):
    q, k, v = (randn(rng, (1, 2, 40, 16)) for _ in range(3))
    a = flashattn.attention(q, k, v, dropout_p=0.3, seed=5)
    np.testing.assert_array_equal(a, flashattn.attention(q, k, v, dropout_p=0.3, seed=5, threads=1))
    assert not np.array_equal(a, flashattn.attention(q, k, v, dropout_p=0.3, seed=6))
    assert not np.array_equal(a, flashattn.attention(q, k, v, dropout_p=0.3, seed=5, dropout_offset=1))
    np.testing.assert_array_equal(flashattn.attention(q, k, v), flashattn.attention(q, k, v, dropout_p=0.0, seed=5))
    with pytest.raises(ValueError, match="needs seed="):
        flashattn.attention(q, k, v, dropout_p=0.3)
    for bad in (1.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="dropout_p"):
            flashattn.attention(q, k, v, dropout_p=bad, seed=1)
    with pytest.raises(ValueError, match="seed"):
        flashattn.attention(q, k, v, dropout_p=0.1, seed=-1)
    assert flashattn.dropout_keep_rate(0.1) == 230 / 256
    m = flashattn.dropout_keep_mask(0.5, 9, 0, 1, 300, 300)
    assert m.dtype == np.bool_ and abs(m.mean() - 0.5) < 4 * np.sqrt(0.25 / m.size)


def test_torch_autograd_regenerates_the_mask(rng):
    import flashattn.torch as ft
    B, H, S, D = 1, 2, 33, 16
    q, k, v, do = (torch.tensor(randn(rng, (B, H, S, D)), requires_grad=True) for _ in range(4))
    torch.manual_seed(1234)
    o = ft.attention(q, k, v, causal=True, dropout_p=0.25)
    o.backward(do.detach())
    torch.manual_seed(1234)
    seed = ft.dropout_seed()  # the seed attention drew from torch's generator
    keep = keep_mask(0.25, seed, B, H, S, S)
    ro, refs = reference(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), do.detach().numpy(), keep,
                         0.25, causal=True)
    assert rel_err(o.detach().numpy(), ro) < FWD_TOL["f32"]
    for t, r in zip((q, k, v), refs):
        assert rel_err(t.grad.numpy(), r) < 2 * BWD_TOL["f32"]
    o2 = ft.attention(q, k, v, causal=True, dropout_p=0.25, seed=seed)
    torch.testing.assert_close(o2, o, rtol=0, atol=0)


def test_sdpa_dropout(rng):
    import flashattn.torch as ft
    q, k, v = (torch.tensor(randn(rng, (2, 3, 24, 16))) for _ in range(3))
    torch.manual_seed(7)
    a = ft.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True)
    torch.manual_seed(7)
    b = ft.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.manual_seed(7)
    keep = keep_mask(0.2, ft.dropout_seed(), 2, 3, 24, 24)
    hide = np.triu(np.ones((24, 24), bool), 1)  # is_causal: top-left
    s = np.einsum("bhid,bhjd->bhij", q.double().numpy(), k.double().numpy()) / 4.0
    s[..., hide] = -np.inf
    w = np.exp(s - s.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True) * keep / 0.8
    assert rel_err(a.numpy(), w @ v.double().numpy()) < FWD_TOL["f32"]


def test_jax_dropout(rng):
    jax = pytest.importorskip("jax")
    import flashattn.jax as fj
    q, k, v = (randn(rng, (1, 20, 2, 16)) for _ in range(3))  # [B, S, N, H]
    try:
        o = np.asarray(fj.attention(q, k, v, dropout_p=0.3, seed=11))
    except NotImplementedError as e:
        pytest.skip(str(e))
    qb, kb, vb = (np.swapaxes(x, 1, 2) for x in (q, k, v))
    np.testing.assert_array_equal(np.swapaxes(o, 1, 2), flashattn.attention(qb, kb, vb, dropout_p=0.3, seed=11))
    g = jax.grad(lambda q: (fj.attention(q, k, v, dropout_p=0.3, seed=11) ** 2).sum())(q)
    do = 2 * np.swapaxes(o, 1, 2)
    ob, lse = flashattn.attention(qb, kb, vb, dropout_p=0.3, seed=11, return_lse=True)
    dq, _, _ = flashattn.attention_backward(qb, kb, vb, ob, lse, do.astype(np.float32), dropout_p=0.3, seed=11)
    np.testing.assert_allclose(np.swapaxes(np.asarray(g), 1, 2), dq, rtol=1e-5, atol=1e-6)


def test_jax_traced_seed(rng):
    """The seed is an operand: under jit a new seed (a traced int) runs the same compiled call
    and gives that seed's mask; a jax.random key gives the seed of its two key-data words; a
    vmapped seed gives each index its own; bad seeds are refused naming the argument."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import flashattn.jax as fj
    q, k, v = (randn(rng, (1, 20, 2, 16)) for _ in range(3))  # [B, S, N, H]
    qb, kb, vb = (np.swapaxes(x, 1, 2) for x in (q, k, v))
    traces = []

    @jax.jit
    def f(q, seed, offset):
        traces.append(1)
        return fj.attention(q, k, v, dropout_p=0.3, seed=seed, dropout_offset=offset)

    for seed, offset in ((11, 0), (12, 0), (2**31 + 5, 3)):
        o = np.asarray(f(q, jnp.uint32(seed), jnp.uint32(offset)))
        want = flashattn.attention(qb, kb, vb, dropout_p=0.3, seed=seed, dropout_offset=offset)
        np.testing.assert_array_equal(np.swapaxes(o, 1, 2), want)
    assert len(traces) == 1, f"a new seed recompiled: {len(traces)} traces"
    # a Python int seed past 32 bits: its high word counts
    o = np.asarray(fj.attention(q, k, v, dropout_p=0.3, seed=2**40 + 5, dropout_offset=2**33))
    want = flashattn.attention(qb, kb, vb, dropout_p=0.3, seed=2**40 + 5, dropout_offset=2**33)
    np.testing.assert_array_equal(np.swapaxes(o, 1, 2), want)
    # gradients under jit with a traced seed equal the library's backward with that seed
    g = jax.jit(jax.grad(lambda q, s: (fj.attention(q, k, v, dropout_p=0.3, seed=s) ** 2).sum()))(q, jnp.uint32(12))
    ob, lse = flashattn.attention(qb, kb, vb, dropout_p=0.3, seed=12, return_lse=True)
    dq, _, _ = flashattn.attention_backward(qb, kb, vb, ob, lse, (2 * ob).astype(np.float32), dropout_p=0.3, seed=12)
    np.testing.assert_allclose(np.swapaxes(np.asarray(g), 1, 2), dq, rtol=1e-5, atol=1e-6)
    # keys: typed and raw, the seed = key data word 0 | word 1 << 32
    key = jax.random.key(5)
    w = np.asarray(jax.random.key_data(key), np.uint64)
    want = flashattn.attention(qb, kb, vb, dropout_p=0.3, seed=int(w[0] | w[1] << np.uint64(32)))
    for kk in (key, jax.random.PRNGKey(5)):
        o = np.asarray(jax.jit(lambda q, s: fj.attention(q, k, v, dropout_p=0.3, seed=s))(q, kk))
        np.testing.assert_array_equal(np.swapaxes(o, 1, 2), want)
    # a vmapped seed: index i runs with seed i (batch index 0 in each)
    seeds = jnp.arange(3, dtype=jnp.uint32)
    o = np.asarray(jax.vmap(lambda s: fj.attention(q, k, v, dropout_p=0.3, seed=s))(seeds))
    for i in range(3):
        np.testing.assert_array_equal(np.swapaxes(o[i], 1, 2), flashattn.attention(qb, kb, vb, dropout_p=0.3, seed=i))
    for bad, what in ((-1, "seed = -1"), (2**64, "seed = 18446744073709551616"), (1.5, "seed must be an integer"),
                      (jnp.zeros(3, jnp.int32), "seed must be an integer scalar"), (True, "seed must be an integer")):
        with pytest.raises(ValueError, match=what):
            fj.attention(q, k, v, dropout_p=0.3, seed=bad)


def test_torch_compile_keeps_one_graph(rng):
    """Under torch.compile the seed is drawn as a tensor: one graph, no graph break, a new
    mask each call, the same masks again after torch.manual_seed, and gradients that match
    eager flashattn with the seed each call drew."""
    import torch._dynamo as dynamo
    import flashattn.torch as ft
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    dynamo.reset()
    dynamo.utils.counters.clear()
    f = torch.compile(lambda q, k, v: ft.attention(q, k, v, dropout_p=0.25, causal=True), backend=backend)
    q, k, v = (torch.tensor(randn(rng, (1, 2, 16, 8)), requires_grad=True) for _ in range(3))
    torch.manual_seed(5)
    outs = [f(q, k, v) for _ in range(3)]
    assert len(graphs) == 1 and not dynamo.utils.counters["graph_break"], dict(dynamo.utils.counters["graph_break"])
    assert len({o.detach().sum().item() for o in outs}) == 3
    torch.manual_seed(5)
    again = f(q, k, v)
    assert torch.equal(again, outs[0])
    torch.manual_seed(5)
    eager = ft.attention(q, k, v, dropout_p=0.25, causal=True)
    assert torch.equal(eager, outs[0])
    g = torch.autograd.grad(again.square().sum(), (q, k, v))
    ge = torch.autograd.grad(eager.square().sum(), (q, k, v))
    for a, b in zip(g, ge):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="integer scalar tensor"):
        ft.attention(q, k, v, dropout_p=0.25, seed=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="seed must be in"):
        ft.attention(q, k, v, dropout_p=0.25, seed=torch.tensor(-3))
    t = ft.attention(q, k, v, dropout_p=0.25, seed=torch.tensor(77))
    assert torch.equal(t, ft.attention(q, k, v, dropout_p=0.25, seed=77))
    # lse under dropout has no gradient: one reaching it raises, alone or beside o's, in
    # eager mode and compiled
    g = torch.compile(lambda q: ft.attention(q, k, v, dropout_p=0.25, seed=3, return_lse=True), backend=backend)
    for fn in (lambda q: ft.attention(q, k, v, dropout_p=0.25, seed=3, return_lse=True), g):
        o, lse = fn(q)
        with pytest.raises(NotImplementedError, match="through lse with dropout"):
            (o.sum() + lse.sum()).backward()
        o, lse = fn(q)
        with pytest.raises(NotImplementedError, match="through lse with dropout"):
            lse.sum().backward()
        o, lse = fn(q)
        o.sum().backward()  # o alone is fine


def test_packed_dropout(rng):
    """Packed batches (numpy and torch varlen_attention): each sequence's weights dropped by
    the keep mask of its own (b, h, i, j), i and j counting within it; gradients against the
    float64 reference with that mask; torch's seed from its generator."""
    import flashattn.torch as ft
    lens_q, lens_k, H, D, p = [5, 0, 9], [7, 3, 9], 2, 16, 0.3
    cu_q, cu_k = np.cumsum([0] + lens_q).astype(np.int32), np.cumsum([0] + lens_k).astype(np.int32)
    q, k, v = randn(rng, (cu_q[-1], H, D)), randn(rng, (cu_k[-1], H, D)), randn(rng, (cu_k[-1], H, D))
    do = randn(rng, (cu_q[-1], H, D))
    o = flashattn.varlen_attention(q, k, v, cu_q, cu_k, causal=True, dropout_p=p, seed=21)
    dq, dk, dv = flashattn.varlen_attention_backward(q, k, v, o, flashattn.varlen_attention(
        q, k, v, cu_q, cu_k, causal=True, dropout_p=p, seed=21, return_lse=True)[1], do, cu_q, cu_k, causal=True,
        dropout_p=p, seed=21)
    for b, (sq, sk) in enumerate(zip(lens_q, lens_k)):
        if sq == 0:
            continue
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        keep = np.stack([flashattn.dropout_keep_mask(p, 21, b, h, sq, sk) for h in range(H)])[None]
        t = lambda x, r: np.swapaxes(x[r], 0, 1)[None]  # noqa: E731 - [1, H, S, D]
        ro, (rdq, rdk, rdv) = reference(t(q, rq), t(k, rk), t(v, rk), t(do, rq), keep, p, causal=True)
        assert rel_err(t(o, rq), ro) < FWD_TOL["f32"]
        for got, want in ((dq, rdq), (dk, rdk), (dv, rdv)):
            r = rq if got is dq else rk
            assert rel_err(t(got, r), want) < BWD_TOL["f32"]
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    got = ft.varlen_attention(tq, tk, tv, torch.tensor(cu_q), torch.tensor(cu_k), causal=True, dropout_p=p, seed=21)
    assert torch.equal(got.detach(), torch.tensor(o))
    got.backward(torch.tensor(do))
    for g, want in ((tq.grad, dq), (tk.grad, dk), (tv.grad, dv)):
        np.testing.assert_array_equal(g.numpy(), want)
    torch.manual_seed(4)
    a = ft.varlen_attention(tq, tk, tv, torch.tensor(cu_q), torch.tensor(cu_k), dropout_p=p)
    torch.manual_seed(4)
    seed = ft.dropout_seed()
    np.testing.assert_array_equal(a.detach().numpy(),
                                  flashattn.varlen_attention(q, k, v, cu_q, cu_k, dropout_p=p, seed=seed))
    # without dropout a seed is unused (every front: docs/python.md)
    assert torch.equal(ft.varlen_attention(tq, tk, tv, torch.tensor(cu_q), torch.tensor(cu_k), seed=3),
                       ft.varlen_attention(tq, tk, tv, torch.tensor(cu_q), torch.tensor(cu_k)))
    with pytest.raises(ValueError, match="needs seed="):
        flashattn.varlen_attention(q, k, v, cu_q, cu_k, dropout_p=p)


def test_jax_packed_dropout(rng):
    """JAX's varlen_attention with dropout: the same bits as numpy's (a traced seed under jit
    too), gradients equal numpy's backward with that seed, lse's gradient refused."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import flashattn.jax as fj
    cu = np.array([0, 6, 6, 15], np.int32)
    q, k, v = (randn(rng, (15, 2, 16)) for _ in range(3))
    want, lse = flashattn.varlen_attention(q, k, v, cu, cu, causal=True, dropout_p=0.2, seed=8, return_lse=True)
    f = jax.jit(lambda q, s: fj.varlen_attention(q, k, v, cu, cu, causal=True, dropout_p=0.2, seed=s))
    np.testing.assert_array_equal(np.asarray(f(q, jnp.uint32(8))), want)
    assert not np.array_equal(np.asarray(f(q, jnp.uint32(9))), want)
    g = jax.grad(lambda q: (fj.varlen_attention(q, k, v, cu, cu, causal=True, dropout_p=0.2, seed=8) ** 2).sum())(q)
    dq, _, _ = flashattn.varlen_attention_backward(q, k, v, want, lse, 2 * want, cu, cu, causal=True, dropout_p=0.2,
                                                   seed=8)
    np.testing.assert_allclose(np.asarray(g), dq, rtol=1e-5, atol=1e-6)
    with pytest.raises(NotImplementedError, match="through lse with dropout"):
        jax.grad(lambda q: fj.varlen_attention(q, k, v, cu, cu, dropout_p=0.2, seed=8, return_lse=True)[1].sum())(q)
    with pytest.raises(ValueError, match="needs seed="):
        fj.varlen_attention(q, k, v, cu, cu, dropout_p=0.2)


# Values every front judges alike (python/flashattn/_problem.py: dropout_p_value, _float): a
# dropout_p below 1 that float32 rounds to 1 (reported as "got 1" by the library), a negative
# one too small for float32 (numpy took -1e-50 as off), strings and bools for float options
# (torch and JAX took "0.5" and True as numbers).
BAD_OPTIONS = [(dict(dropout_p=0.9999999999, seed=1), "rounds to 1 in float32"),
               (dict(dropout_p=-1e-50, seed=1), r"\[0, 1\).*-1e-50"),
               (dict(dropout_p="0.5", seed=1), "dropout_p must be a number"),
               (dict(dropout_p=True, seed=1), "dropout_p must be a number"),
               (dict(scale="0.5"), "scale must be a number"), (dict(scale=True), "scale must be a number"),
               (dict(softcap="2"), "softcap must be a number"),
               (dict(softcap=-1e-50), r"softcap must be >= 0 .*got -1e-50"),  # negative, not "rounds to 0"
               (dict(softcap=np.array(True)), "softcap must be a number"),  # 0-d bools as bools (taken as 1.0)
               (dict(scale=np.array(False)), "scale must be a number")]


@pytest.mark.parametrize("kw, message", BAD_OPTIONS)
def test_float_options_judged_alike(rng, kw, message):
    q = randn(rng, (1, 2, 8, 8))
    with pytest.raises(ValueError, match=message):
        flashattn.attention(q, q, q, **kw)
    torch = pytest.importorskip("torch")
    import flashattn.torch as ft
    with pytest.raises(ValueError, match=message):
        ft.attention(torch.tensor(q), torch.tensor(q), torch.tensor(q), **kw)
    pytest.importorskip("jax")
    import flashattn.jax as fj
    with pytest.raises(ValueError, match=message):
        fj.attention(q, q, q, **kw)


def test_keep_rate_and_mask_judge_dropout_p():
    for p, message in ((0.9999999999, "rounds to 1"), (-1e-50, r"\[0, 1\)"), ("0.5", "must be a number")):
        with pytest.raises(ValueError, match=message):
            flashattn.dropout_keep_rate(p)
        with pytest.raises(ValueError, match=message):
            flashattn.dropout_keep_mask(p, 1, 0, 0, 2, 2)
    assert flashattn.dropout_keep_rate(float(np.nextafter(np.float32(1), np.float32(0)))) == 0.0


def test_sdpa_float_arguments_as_torch(rng):
    """The SDPA drop-in takes its float arguments as torch's parser does: a string is a
    TypeError in torch's words, a bool a number."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F
    import flashattn.torch as ft
    q = torch.tensor(randn(rng, (1, 2, 8, 8)))
    for name in ("dropout_p", "scale"):
        with pytest.raises(TypeError, match=f"argument '{name}' must be float, not str"):
            ft.scaled_dot_product_attention(q, q, q, **{name: "0.5"})
    assert torch.allclose(ft.scaled_dot_product_attention(q, q, q, scale=True),
                          F.scaled_dot_product_attention(q, q, q, scale=True), atol=1e-5)
    with pytest.raises(ValueError, match="rounds to 1"):
        ft.scaled_dot_product_attention(q, q, q, dropout_p=0.9999999999)


def test_torch_seed_tensors_judged_as_ints(rng):
    torch = pytest.importorskip("torch")
    import flashattn.torch as ft
    q = torch.tensor(randn(rng, (1, 2, 8, 8)))
    for p in (0.5, 0.0):  # with dropout off a seed is still checked (docs/python.md)
        with pytest.raises(ValueError, match="got -5$"):
            ft.attention(q, q, q, dropout_p=p, seed=torch.tensor(-5))
    with pytest.raises(ValueError, match=f"got {2**63 + 5}$"):
        ft.attention(q, q, q, dropout_p=0.5, seed=torch.tensor(2**63 + 5, dtype=torch.uint64))
    same = ft.attention(q, q, q, dropout_p=0.5, seed=torch.tensor(7, dtype=torch.uint8))
    assert torch.equal(same, ft.attention(q, q, q, dropout_p=0.5, seed=7))


def test_drop_ins_take_what_their_frameworks_take(rng):
    """The drop-ins take bools as their frameworks do (jax.nn's scale=True is 1.0; the float
    options' new str/bool rule once refused it there), and torch's dropout_p=None is its
    TypeError; flashattn.plan's flags take numpy integers 0 and 1 as attention does, and
    flashattn.jax.plan numpy bools as Python's."""
    q = randn(rng, (1, 8, 2, 16))
    pytest.importorskip("jax")
    import jax
    import flashattn.jax as fj
    want = jax.nn.dot_product_attention(q, q, q, scale=1.0)
    for s in (True, np.True_, np.array(True)):
        assert np.allclose(np.asarray(fj.dot_product_attention(q, q, q, scale=s)), np.asarray(want), atol=1e-5)
    plain = fj.plan(q, q, q).forward
    assert fj.plan(q, q, q, sinks=np.False_).forward == plain
    assert fj.plan(q, q, q, sinks=np.True_).forward == fj.plan(q, q, q, sinks=True).forward
    for flag in (np.int64(1), np.int32(0), np.bool_(True)):
        flashattn.plan(batch=1, heads=2, seq_q=8, head_dim=16, causal=flag)
    torch = pytest.importorskip("torch")
    import flashattn.torch as ft
    t = torch.tensor(q.transpose(0, 2, 1, 3).copy())
    with pytest.raises(TypeError, match="argument 'dropout_p' must be float, not NoneType"):
        ft.scaled_dot_product_attention(t, t, t, dropout_p=None)


def test_plan_takes_dropout_and_its_backend_judges_it():
    """flashattn.plan takes attention's dropout arguments and hands them to the library, which
    judges them with the backend: the CPU's plan has the same figures (dropout changes none),
    the CUDA backend, which has no dropout, refuses it in words; flashattn.jax.plan alike (it
    took dropout_p and planned without it)."""
    shape = dict(batch=1, heads=2, seq_q=64, head_dim=32)
    with_drop = flashattn.plan(**shape, dropout_p=0.1, seed=3)
    assert with_drop.forward == flashattn.plan(**shape).forward
    with pytest.raises(ValueError, match="needs seed"):
        flashattn.plan(**shape, dropout_p=0.1)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        flashattn.plan(**shape, dropout_p=1.0, seed=1)
    with pytest.raises((NotImplementedError, ValueError), match="dropout"):
        flashattn.plan(**shape, dropout_p=0.1, seed=3, backend="cuda")
    jax = pytest.importorskip("jax")
    import flashattn.jax as fj
    q = jax.ShapeDtypeStruct((1, 64, 2, 32), jax.numpy.float32)
    assert fj.plan(q, q, q, dropout_p=0.1, seed=True).forward == with_drop.forward
    with pytest.raises((NotImplementedError, ValueError), match="dropout"):
        fj.plan(q, q, q, dropout_p=0.1, seed=True, backend="cuda")
