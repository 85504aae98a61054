"""Attention sinks (docs/semantics.md, "Attention sinks") through every front: numpy against
a float64 reference with an extra logit column; torch autograd (o and lse, so the sinks'
gradient through both) against eager torch with that column; JAX grad against a jax.numpy
reference; the varlen and kv-cache entry points; rows without a visible key (o = 0, lse =
sink). The C suite (tests/test_sinks.c) covers dtypes, ISAs, thread counts and counts."""
import numpy as np
import pytest

import flashattn
from conftest import SEED, randn

B, H, HK, SQ, SK, D = 2, 4, 2, 11, 7, 16  # GQA; causal with Sq > Sk: the first rows see no key


def sinks_of(rng):
    s = rng.standard_normal(H).astype(np.float32)
    s[0] = 6.0  # dominates its rows
    return s


def ref_forward(q, k, v, sinks, causal):
    """o and lse in float64: the softmax over the keys plus one column holding the sink."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, 1), np.repeat(v, g, 1)
    s = q @ np.swapaxes(k, 2, 3) / np.sqrt(q.shape[-1])
    sq, sk = s.shape[2], s.shape[3]
    if causal:
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + sk - sq, s, -np.inf)
    col = np.broadcast_to(np.asarray(sinks, np.float64)[None, :, None, None], s.shape[:3] + (1,))
    full = np.concatenate([s, col], -1)
    m = full.max(-1, keepdims=True)
    z = np.exp(full - m).sum(-1, keepdims=True)
    lse = m + np.log(z)
    return np.exp(s - lse) @ v, lse[..., 0]


def test_numpy_forward_and_dsink(rng):
    q, k, v = randn(rng, (B, H, SQ, D)), randn(rng, (B, HK, SK, D)), randn(rng, (B, HK, SK, D))
    sinks = sinks_of(rng)
    o, lse = flashattn.attention(q, k, v, causal=True, sinks=sinks, return_lse=True)
    ro, rl = ref_forward(q, k, v, sinks, True)
    np.testing.assert_allclose(o, ro, atol=1e-5, err_msg=f"seed {SEED}")
    np.testing.assert_allclose(lse, rl, atol=1e-5, rtol=1e-5)
    assert (lse[:, :, :SQ - SK] == sinks[None, :, None]).all(), "rows without keys: lse = sink"
    assert (o[:, :, :SQ - SK] == 0).all()
    do = randn(rng, o.shape)
    dq, dk, dv, ds = flashattn.attention_backward(q, k, v, o, lse, do, causal=True, sinks=sinks)
    # dsink by central differences of sum(o * do) on the reference
    fd = np.empty(H)
    for h in range(H):
        up, down = sinks.astype(np.float64).copy(), sinks.astype(np.float64).copy()
        up[h] += 1e-4
        down[h] -= 1e-4
        fd[h] = ((ref_forward(q, k, v, up, True)[0] - ref_forward(q, k, v, down, True)[0]) * do).sum() / 2e-4
    np.testing.assert_allclose(ds, fd, atol=1e-4 * max(1, np.abs(fd).max()), err_msg=f"seed {SEED}")


def test_plan_counts_the_sink_exps():
    base = flashattn.plan(batch=1, heads=2, seq_q=8, head_dim=16).as_dict()
    sinks = flashattn.plan(batch=1, heads=2, seq_q=8, head_dim=16, sinks=True).as_dict()
    assert sinks["forward"]["transcendentals"] == base["forward"]["transcendentals"] + 2 * 8
    assert sinks["backward"]["transcendentals"] == base["backward"]["transcendentals"] + 2 * 8
    # min_bytes: the sinks read once (4 B a head), and in the backward dsink written once (it
    # was counted twice there); packed batches the same, once for all their sequences
    assert sinks["forward"]["min_bytes"] == base["forward"]["min_bytes"] + 2 * 4
    assert sinks["backward"]["min_bytes"] == base["backward"]["min_bytes"] + 2 * 2 * 4
    cu = np.array([0, 3, 8], np.int32)
    pv = [flashattn.plan_varlen(cu, cu, heads=2, head_dim=16, sinks=s).backward["min_bytes"] for s in (False, True)]
    assert pv[1] == pv[0] + 2 * 2 * 4


def test_numpy_varlen_and_kvcache(rng):
    cu_q, cu_k = np.array([0, 3, 3, 9], np.int32), np.array([0, 0, 5, 12], np.int32)
    q, k, v = randn(rng, (9, H, D)), randn(rng, (12, HK, D)), randn(rng, (12, HK, D))
    sinks = sinks_of(rng)
    o, lse = flashattn.varlen_attention(q, k, v, cu_q, cu_k, causal=True, sinks=sinks, return_lse=True)
    for b in range(3):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if rows.start == rows.stop:
            continue
        tr = lambda x: np.swapaxes(x, 0, 1)[None]  # noqa: E731 - [S, H, D] -> [1, H, S, D]
        ro, rl = ref_forward(tr(q[rows]), tr(k[keys]), tr(v[keys]), sinks, True)
        np.testing.assert_allclose(o[rows], np.swapaxes(ro[0], 0, 1), atol=1e-5)
        np.testing.assert_allclose(lse[:, rows], rl[0], atol=1e-5, rtol=1e-5)
    do = randn(rng, o.shape)
    dq, dk, dv, ds = flashattn.varlen_attention_backward(q, k, v, o, lse, do, cu_q, cu_k, causal=True, sinks=sinks)
    delta = np.einsum("thd,thd->ht", do.astype(np.float64), o.astype(np.float64))
    np.testing.assert_allclose(ds, -(np.exp(sinks[:, None] - lse) * delta).sum(1), rtol=1e-4, atol=1e-5)

    kc, vc = randn(rng, (2, 1100, HK, D)), randn(rng, (2, 1100, HK, D))  # 1000 keys: two split-KV chunks
    qd = randn(rng, (2, 1, H, D))
    o, lse = flashattn.kvcache_attention(qd, kc, vc, cache_seqlens=np.array([0, 1000], np.int32), sinks=sinks,
                                         return_lse=True)
    assert (lse[0, :, 0] == sinks).all() and (o[0] == 0).all()
    ro, rl = ref_forward(np.swapaxes(qd[1:], 1, 2), np.swapaxes(kc[1:, :1000], 1, 2),
                         np.swapaxes(vc[1:, :1000], 1, 2), sinks, False)
    np.testing.assert_allclose(o[1], np.swapaxes(ro[0], 0, 1), atol=1e-5)
    np.testing.assert_allclose(lse[1], rl[0], atol=1e-5, rtol=1e-5)


def test_torch_autograd(rng):
    torch = pytest.importorskip("torch")
    import flashattn.torch as fat

    def leaf(a):
        return torch.from_numpy(np.asarray(a, np.float64)).requires_grad_(True)

    arrays = (randn(rng, (B, H, SQ, D)), randn(rng, (B, HK, SK, D)), randn(rng, (B, HK, SK, D)), sinks_of(rng))
    ours = [leaf(a).float().detach().requires_grad_(True) for a in arrays]
    theirs = [leaf(a) for a in arrays]
    do, dlse = (torch.from_numpy(randn(rng, s)) for s in ((B, H, SQ, D), (B, H, SQ)))

    def reference(q, k, v, s):  # eager torch: the sink as one more logit column, dropped after
        k, v = k.repeat_interleave(H // HK, 1), v.repeat_interleave(H // HK, 1)
        logits = q @ k.transpose(2, 3) / D ** 0.5
        keep = torch.arange(SK)[None, :] <= torch.arange(SQ)[:, None] + SK - SQ
        logits = logits.masked_fill(~keep, float("-inf"))
        logits = torch.cat([logits, s.view(1, -1, 1, 1).expand(B, H, SQ, 1)], -1)
        return torch.softmax(logits, -1)[..., :SK] @ v, torch.logsumexp(logits, -1)

    o, lse = fat.attention(*ours[:3], causal=True, sinks=ours[3], return_lse=True)
    ro, rl = reference(*theirs)
    torch.testing.assert_close(o.double(), ro, atol=1e-5, rtol=0)
    torch.testing.assert_close(lse.double(), rl, atol=1e-5, rtol=1e-5)
    got = torch.autograd.grad((o * do).sum() + (lse * dlse).sum(), ours)
    want = torch.autograd.grad((ro * do.double()).sum() + (rl * dlse.double()).sum(), theirs)
    for name, g, w in zip(("dq", "dk", "dv", "dsink"), got, want):
        torch.testing.assert_close(g.double(), w, atol=5e-5 * max(1.0, w.abs().max().item()), rtol=0,
                                   msg=lambda m, name=name: f"{name} (seed {SEED}): {m}")


def test_jax_grad(rng):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import flashattn.jax as faj

    q, k, v = randn(rng, (B, SQ, H, D)), randn(rng, (B, SK, HK, D)), randn(rng, (B, SK, HK, D))
    sinks, do, dlse = sinks_of(rng), randn(rng, (B, SQ, H, D)), randn(rng, (B, H, SQ))

    def reference(q, k, v, s):
        k, v = jnp.repeat(k, H // HK, 2), jnp.repeat(v, H // HK, 2)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / D ** 0.5
        keep = jnp.arange(SK)[None, :] <= jnp.arange(SQ)[:, None] + SK - SQ
        logits = jnp.where(keep, logits, -jnp.inf)
        logits = jnp.concatenate([logits, jnp.broadcast_to(s[None, :, None, None], (B, H, SQ, 1))], -1)
        p = jax.nn.softmax(logits, -1)[..., :SK]
        return jnp.einsum("bhqk,bkhd->bqhd", p, v), jax.nn.logsumexp(logits, -1)

    def loss(fn):
        return lambda *a: (jnp.sum(fn(*a)[0] * do) + jnp.sum(fn(*a)[1] * dlse))

    ours = lambda q, k, v, s: faj.attention(q, k, v, causal=True, sinks=s, return_lse=True)  # noqa: E731
    o, lse = ours(q, k, v, sinks)
    ro, rl = reference(q, k, v, sinks)
    np.testing.assert_allclose(o, ro, atol=1e-5)
    np.testing.assert_allclose(lse, rl, atol=1e-5, rtol=1e-5)
    got = jax.grad(loss(ours), argnums=(0, 1, 2, 3))(q, k, v, sinks)
    want = jax.grad(loss(reference), argnums=(0, 1, 2, 3))(q, k, v, sinks)
    for name, g, w in zip(("dq", "dk", "dv", "dsink"), got, want):
        np.testing.assert_allclose(g, w, atol=5e-5 * max(1.0, float(np.abs(w).max())), err_msg=f"{name} seed {SEED}")


def test_torch_varlen_and_kvcache(rng):
    torch = pytest.importorskip("torch")
    import flashattn.torch as fat

    cu_q, cu_k = np.array([0, 3, 3, 9], np.int32), np.array([0, 0, 5, 12], np.int32)
    arrays = (randn(rng, (9, H, D)), randn(rng, (12, HK, D)), randn(rng, (12, HK, D)), sinks_of(rng))
    ours = [torch.from_numpy(a).requires_grad_(True) for a in arrays]
    do, dlse = torch.from_numpy(randn(rng, (9, H, D))), torch.from_numpy(randn(rng, (H, 9)))
    o, lse = fat.varlen_attention(*ours[:3], torch.from_numpy(cu_q), torch.from_numpy(cu_k), causal=True,
                                  sinks=ours[3], return_lse=True)
    got = torch.autograd.grad((o * do).sum() + (lse * dlse).sum(), ours)
    # the same sequences one at a time through the dense op (tested above against eager torch)
    theirs = [torch.from_numpy(a).requires_grad_(True) for a in arrays]
    loss = 0
    for b in range(3):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if rows.start == rows.stop:
            continue
        bhsd = lambda x: x.transpose(0, 1)[None]  # noqa: E731
        ob, lb = fat.attention(bhsd(theirs[0][rows]), bhsd(theirs[1][keys]), bhsd(theirs[2][keys]), causal=True,
                               sinks=theirs[3], return_lse=True)
        loss = loss + (ob[0].transpose(0, 1) * do[rows]).sum() + (lb[0] * dlse[:, rows]).sum()
    want = torch.autograd.grad(loss, theirs)
    for name, g, w in zip(("dq", "dk", "dv", "dsink"), got, want):
        torch.testing.assert_close(g, w, atol=5e-5 * max(1.0, w.abs().max().item()), rtol=0,
                                   msg=lambda m, name=name: f"varlen {name} (seed {SEED}): {m}")

    sinks = torch.from_numpy(arrays[3])
    kc, vc = torch.from_numpy(randn(rng, (2, 700, HK, D))), torch.from_numpy(randn(rng, (2, 700, HK, D)))
    qd = torch.from_numpy(randn(rng, (2, 1, H, D)))
    o, lse = fat.kvcache_attention(qd, kc, vc, cache_seqlens=torch.tensor([0, 600], dtype=torch.int32), sinks=sinks,
                                   return_lse=True)
    assert torch.equal(lse[0, :, 0], sinks) and not o[0].any()
    want_o, want_lse = flashattn.kvcache_attention(qd.numpy(), kc.numpy(), vc.numpy(),
                                                   cache_seqlens=np.array([0, 600], np.int32), sinks=arrays[3],
                                                   return_lse=True)
    np.testing.assert_array_equal(o.numpy(), want_o)
    np.testing.assert_array_equal(lse.numpy(), want_lse)


def test_torch_varlen_capacity_rows_with_sinks_and_an_lse_gradient(rng):
    """Rows past cu_seqlens_q's end (lse -inf) gave dsink NaN once a gradient reached lse
    (exp(sink - lse) x their 0): the gradients are those of the tensors cut to the sums' ends,
    and the capacity rows get zeros."""
    torch = pytest.importorskip("torch")
    import flashattn.torch as fat

    cu = torch.tensor([0, 5, 9], dtype=torch.int32)
    arrays = (randn(rng, (11, H, D)), randn(rng, (11, HK, D)), randn(rng, (11, HK, D)), sinks_of(rng))
    do, dlse = torch.from_numpy(randn(rng, (11, H, D))), torch.from_numpy(randn(rng, (H, 11)))
    dlse[:, 9:] = 0  # what a loss over the real rows' lse passes for the capacity rows

    def grads(n):
        xs = [torch.from_numpy(a[:n] if i < 3 else a).requires_grad_(True) for i, a in enumerate(arrays)]
        o, lse = fat.varlen_attention(*xs[:3], cu, cu, sinks=xs[3], return_lse=True)
        return torch.autograd.grad((o * do[:n]).sum() + (lse * dlse[:, :n]).sum(), xs)
    got, want = grads(11), grads(9)
    assert torch.isfinite(got[3]).all(), f"dsink {got[3]} (seed {SEED})"
    torch.testing.assert_close(got[3], want[3], rtol=0, atol=0)
    for g, w in zip(got[:3], want[:3]):
        torch.testing.assert_close(g[:9], w, rtol=0, atol=0)
        assert not g[9:].any()


def test_jax_varlen_and_kvcache(rng):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import flashattn.jax as faj

    cu_q, cu_k = np.array([0, 3, 3, 9], np.int32), np.array([0, 0, 5, 12], np.int32)
    q, k, v, sinks = randn(rng, (9, H, D)), randn(rng, (12, HK, D)), randn(rng, (12, HK, D)), sinks_of(rng)
    do, dlse = randn(rng, (9, H, D)), randn(rng, (H, 9))

    def packed(q, k, v, s):
        o, lse = faj.varlen_attention(q, k, v, cu_q, cu_k, causal=True, sinks=s, return_lse=True)
        return jnp.sum(o * do) + jnp.sum(lse * dlse)

    def per_sequence(q, k, v, s):  # the dense op on each sequence (tested above against jax.numpy)
        loss = 0.0
        for b in range(3):
            r0, r1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
            if r0 == r1:
                continue
            o, lse = faj.attention(q[None, r0:r1], k[None, k0:k1], v[None, k0:k1], causal=True, sinks=s,
                                   return_lse=True)
            loss = loss + jnp.sum(o[0] * do[r0:r1]) + jnp.sum(lse[0] * dlse[:, r0:r1])
        return loss

    got = jax.grad(packed, argnums=(0, 1, 2, 3))(q, k, v, sinks)
    want = jax.grad(per_sequence, argnums=(0, 1, 2, 3))(q, k, v, sinks)
    for name, g, w in zip(("dq", "dk", "dv", "dsink"), got, want):
        np.testing.assert_allclose(g, w, atol=5e-5 * max(1.0, float(np.abs(w).max())),
                                   err_msg=f"varlen {name} seed {SEED}")
    o, lse = faj.varlen_attention(q, k, v, cu_q, cu_k, causal=True, sinks=sinks, return_lse=True)
    want_o, want_lse = flashattn.varlen_attention(q, k, v, cu_q, cu_k, causal=True, sinks=sinks, return_lse=True)
    np.testing.assert_array_equal(np.asarray(o), want_o)
    np.testing.assert_array_equal(np.asarray(lse), want_lse)

    kc, vc, qd = randn(rng, (2, 700, HK, D)), randn(rng, (2, 700, HK, D)), randn(rng, (2, 1, H, D))
    lens = np.array([0, 600], np.int32)
    o, lse, _, _ = faj.kvcache_attention(qd, kc, vc, cache_seqlens=lens, sinks=sinks, return_lse=True)
    want_o, want_lse = flashattn.kvcache_attention(qd, kc, vc, cache_seqlens=lens, sinks=sinks, return_lse=True)
    np.testing.assert_array_equal(np.asarray(o), want_o)
    np.testing.assert_array_equal(np.asarray(lse), want_lse)
    assert (np.asarray(lse)[0, :, 0] == sinks).all()


def test_jax_cost_estimate_counts_the_sinks():
    jax = pytest.importorskip("jax")
    pytest.importorskip("jax.experimental.pallas")
    import flashattn.jax as faj

    q = jax.ShapeDtypeStruct((1, 64, 2, 16), "float32")
    base = faj.cost_estimate(q, q, q, causal=True)
    with_sinks = faj.cost_estimate(q, q, q, causal=True, sinks=True)
    assert with_sinks.transcendentals == base.transcendentals + 2 * 64
    assert with_sinks.flops == base.flops


def test_jax_vmap_keeps_dsink_per_example(rng):
    """Under vmap the FFI handler folds the vmapped dim into the batch, except in the
    backward with sinks, whose dsink sums over the batch: one call per example there."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import flashattn.jax as faj

    q, k, v = randn(rng, (3, 1, SQ, H, D)), randn(rng, (3, 1, SK, HK, D)), randn(rng, (3, 1, SK, HK, D))
    sinks = sinks_of(rng)
    f = lambda q, k, v, s: jnp.sum(faj.attention(q, k, v, causal=True, sinks=s) ** 2)  # noqa: E731
    got = jax.vmap(jax.grad(f, argnums=(0, 3)), in_axes=(0, 0, 0, None))(q, k, v, sinks)
    for i in range(3):
        want = jax.grad(f, argnums=(0, 3))(q[i], k[i], v[i], sinks)
        np.testing.assert_array_equal(got[0][i], want[0])
        np.testing.assert_array_equal(got[1][i], want[1])


def test_nan_in_do_of_rows_without_keys_reaches_dsink(rng):
    """docs/nonfinite.md: NaN in do at any row of head h makes dsink_h NaN, a row without keys
    included, the same whether the row's keys are all hidden, the problem has none (Sk = 0:
    it gave 0) or a packed sequence has none (its rows were skipped); finite do gives 0."""
    sinks = sinks_of(rng)
    q = randn(rng, (1, H, 3, D))
    kv = {"hidden": [randn(rng, (1, HK, 5, D)) for _ in range(2)], "no keys": [randn(rng, (1, HK, 0, D))] * 2}
    for name, (k, v) in kv.items():
        m = np.zeros((3, k.shape[2]), bool)
        o, lse = flashattn.attention(q, k, v, sinks=sinks, return_lse=True, mask=m if name == "hidden" else None)
        for poison in (False, True):
            do = randn(rng, o.shape)
            if poison:
                do[0, 1, 2, 0] = np.nan
            *_, ds = flashattn.attention_backward(q, k, v, o, lse, do, sinks=sinks, mask=m if name == "hidden" else None)
            want = [0, np.nan, 0, 0] if poison else [0, 0, 0, 0]
            np.testing.assert_array_equal(ds, np.float32(want), err_msg=f"{name}, NaN in do: {poison}")
    # packed: sequence 0 has no keys, sequence 1 has; NaN in sequence 0's do reaches dsink
    qp, kp, vp = randn(rng, (7, H, D)), randn(rng, (4, HK, D)), randn(rng, (4, HK, D))
    cq, ck = np.array([0, 3, 7], np.int32), np.array([0, 0, 4], np.int32)
    o, lse = flashattn.varlen_attention(qp, kp, vp, cq, ck, sinks=sinks, return_lse=True)
    do = randn(rng, o.shape)
    *_, ds = flashattn.varlen_attention_backward(qp, kp, vp, o, lse, do, cq, ck, sinks=sinks)
    assert np.isfinite(ds).all()
    do[1, 2, 0] = np.nan  # a row of sequence 0, head 2
    *_, ds_nan = flashattn.varlen_attention_backward(qp, kp, vp, o, lse, do, cq, ck, sinks=sinks)
    assert np.isnan(ds_nan[2]) and np.array_equal(np.delete(ds_nan, 2), np.delete(ds, 2)), ds_nan


@pytest.mark.parametrize("front", ["torch", "jax"])
def test_nan_in_do_without_keys_reaches_dsink_in_every_front(rng, front):
    """The fronts fill problems without keys themselves (no library call): their dsink was 0
    whatever do held, while the library's is NaN there (docs/nonfinite.md). Dense and packed,
    Sk = 0; finite do still gives 0, and o stays +0."""
    sinks = np.array([0.5, -1.0, 2.0, 0.25], np.float32)
    q = randn(rng, (1, 3, H, D))  # bshd
    k = np.zeros((1, 0, H, D), np.float32)
    cu, cuk = np.array([0, 3], np.int32), np.array([0, 0], np.int32)
    for poison in (False, True):
        do = randn(rng, q.shape)
        if poison:
            do[0, 2, 1, 3] = np.nan
        want = np.float32([0, np.nan, 0, 0] if poison else [0, 0, 0, 0])
        if front == "torch":
            torch = pytest.importorskip("torch")
            import flashattn.torch as fat
            got = []
            for packed in (False, True):
                s = torch.from_numpy(sinks).requires_grad_()
                if packed:
                    o = fat.varlen_attention(torch.from_numpy(q[0]), torch.from_numpy(k[0]), torch.from_numpy(k[0]),
                                             torch.from_numpy(cu), torch.from_numpy(cuk), sinks=s)
                    o.backward(torch.from_numpy(do[0]))
                else:
                    o = fat.attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(k), sinks=s,
                                      layout="bshd")
                    o.backward(torch.from_numpy(do))
                assert not torch.signbit(o).any()
                got.append(s.grad.numpy())
        else:
            jax = pytest.importorskip("jax")
            import jax.numpy as jnp
            import flashattn.jax as fj
            qj, kj = jnp.asarray(q), jnp.asarray(k)
            got = [np.asarray(jax.grad(lambda s: (fj.attention(qj, kj, kj, sinks=s) * do).sum())(jnp.asarray(sinks))),
                   np.asarray(jax.grad(lambda s: (fj.varlen_attention(qj[0], kj[0], kj[0], jnp.asarray(cu), jnp.asarray(cuk),
                                                                      sinks=s) * do[0]).sum())(jnp.asarray(sinks)))]
        for g, what in zip(got, ("dense", "packed")):
            np.testing.assert_array_equal(g, want, err_msg=f"{front} {what}, NaN in do: {poison}")


@pytest.mark.parametrize("front", ["torch", "jax"])
def test_non_finite_sinks_without_keys_are_refused_as_by_the_library(front):
    """With no keys the fronts fill the outputs themselves: an inf or NaN sink went through
    (torch: o = 0, lse = inf; JAX: NaN in o), while numpy and every call with keys refuse it
    (docs/semantics.md, "Attention sinks")."""
    q = np.ones((1, 3, H, D), np.float32)  # bshd
    k = np.zeros((1, 0, H, D), np.float32)
    for bad in (np.inf, np.nan):
        s = np.zeros(H, np.float32)
        s[1] = bad
        if front == "torch":
            torch = pytest.importorskip("torch")
            import flashattn.torch as fat
            with pytest.raises(ValueError, match=r"sinks\[1\] \(head 1\) is (inf|nan); sinks must be finite"):
                fat.attention(*(torch.from_numpy(x) for x in (q, k, k)), sinks=torch.from_numpy(s), layout="bshd")
            with pytest.raises(ValueError, match=r"sinks\[1\]"):
                fat.varlen_attention(*(torch.from_numpy(x[0]) for x in (q, k, k)), torch.tensor([0, 3], dtype=torch.int32),
                                     torch.tensor([0, 0], dtype=torch.int32), sinks=torch.from_numpy(s))
        else:
            pytest.importorskip("jax")
            import flashattn.jax as fj
            with pytest.raises(ValueError, match=r"sinks\[1\] \(head 1\) is (inf|nan); sinks must be finite"):
                fj.attention(q, k, k, sinks=s)
            with pytest.raises(ValueError, match=r"sinks\[1\]"):
                fj.varlen_attention(q[0], k[0], k[0], np.array([0, 3], np.int32), np.array([0, 0], np.int32), sinks=s)
