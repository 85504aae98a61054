"""Dropout under torch.func.vmap (docs/python.md, "Autograd"; docs/semantics.md, "Dropout"):
with one seed for every mapped element, element n draws the masks of batch items n * B + b
of one batched call (a packed batch: of every element's sequences in turn), as JAX's vmap
does, in the forward and in the backward that regenerates them, nested vmaps too (the
flattened index over the levels that share the seed); a vmapped seed gives each element its
own masks, from b = 0; seed=None follows torch's randomness= (they once drew one mask for
every element: each element's call ran at batch index 0 with the same seed)."""
import numpy as np
import pytest

import flashattn
from conftest import randn

torch = pytest.importorskip("torch")
import flashattn.torch as ft  # noqa: E402

P, SEED = 0.4, 1234


def t(x):
    return torch.tensor(x)


def flat(x, lead):
    """x [*lead, B, ...] as one batch [prod(lead) * B, ...] (row-major, as one batched call)."""
    return np.ascontiguousarray(x).reshape((-1,) + x.shape[len(lead) + 1:])


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_dense_vmap_draws_one_batched_calls_masks(rng, layout):
    N, B, H, S, D = 3, 2, 2, 9, 8
    shape = (N, B, H, S, D) if layout == "bhsd" else (N, B, S, H, D)
    q, k, v, w = (randn(rng, shape) for _ in range(4))
    o = torch.func.vmap(lambda a, b, c: ft.attention(a, b, c, layout=layout, dropout_p=P, seed=SEED))(
        t(q), t(k), t(v))
    ob, lse = flashattn.attention(*(flat(x, (N,)) for x in (q, k, v)), layout=layout, dropout_p=P, seed=SEED,
                                  return_lse=True)
    np.testing.assert_array_equal(o.numpy(), ob.reshape(shape))
    assert not torch.equal(o[0], o[1])  # same data would give the same o only with the same masks
    # the backward regenerates the same masks: per-element gradients (vmap of grad) and the
    # gradient of the vmapped call (grad of vmap) are the batched backward's
    want = flashattn.attention_backward(*(flat(x, (N,)) for x in (q, k, v)), ob, lse, flat(w, (N,)),
                                        layout=layout, dropout_p=P, seed=SEED)

    def loss(a, b, c, w):
        return (ft.attention(a, b, c, layout=layout, dropout_p=P, seed=SEED) * w).sum()
    per = torch.func.vmap(torch.func.grad(loss, argnums=(0, 1, 2)))(t(q), t(k), t(v), t(w))
    for g, r in zip(per, want):
        np.testing.assert_array_equal(g.numpy(), r.reshape(shape))
    whole = torch.func.grad(lambda a, b, c: (torch.func.vmap(
        lambda x, y, z: ft.attention(x, y, z, layout=layout, dropout_p=P, seed=SEED))(a, b, c) * t(w)).sum(),
        argnums=(0, 1, 2))(t(q), t(k), t(v))
    for g, r in zip(whole, want):
        np.testing.assert_array_equal(g.numpy(), r.reshape(shape))


def test_dense_vmap_with_unmapped_k_v_and_same_data(rng):
    """The failing case as a user met it: the same q in every element, k and v shared."""
    N, B, H, S, D = 2, 1, 1, 16, 8
    q = np.repeat(randn(rng, (1, B, H, S, D)), N, 0)
    k, v = randn(rng, (B, H, S, D)), np.ones((B, H, S, D), np.float32)
    o = torch.func.vmap(lambda a: ft.attention(a, t(k), t(v), dropout_p=0.5, seed=SEED))(t(q))
    assert not torch.equal(o[0], o[1])
    ob = flashattn.attention(flat(q, (N,)), np.concatenate([k] * N), np.concatenate([v] * N), dropout_p=0.5,
                             seed=SEED)
    np.testing.assert_array_equal(o.numpy(), ob.reshape(q.shape))


def test_nested_vmaps_count_the_flattened_index(rng):
    N1, N2, B, H, S, D = 2, 3, 2, 2, 7, 8
    shape = (N1, N2, B, H, S, D)
    q, k, v, w = (randn(rng, shape) for _ in range(4))

    def f(a, b, c):
        return ft.attention(a, b, c, dropout_p=P, seed=SEED)
    o = torch.func.vmap(torch.func.vmap(f))(t(q), t(k), t(v))
    ob, lse = flashattn.attention(*(flat(x, (N1, N2)) for x in (q, k, v)), dropout_p=P, seed=SEED, return_lse=True)
    np.testing.assert_array_equal(o.numpy(), ob.reshape(shape))
    want = flashattn.attention_backward(*(flat(x, (N1, N2)) for x in (q, k, v)), ob, lse, flat(w, (N1, N2)),
                                        dropout_p=P, seed=SEED)
    per = torch.func.vmap(torch.func.vmap(torch.func.grad(lambda a, b, c, w: (f(a, b, c) * w).sum(),
                                                          argnums=(0, 1, 2))))(t(q), t(k), t(v), t(w))
    for g, r in zip(per, want):
        np.testing.assert_array_equal(g.numpy(), r.reshape(shape))


def test_a_vmapped_seed_gives_each_element_its_own_masks(rng):
    N1, N2, B, H, S, D = 2, 3, 2, 1, 9, 8
    q, k, v = (randn(rng, (N1, N2, B, H, S, D)) for _ in range(3))
    seeds = torch.tensor([11, 12, 13])
    # mapped at the only level: element n runs with seed n's masks from b = 0
    o = torch.func.vmap(lambda a, b, c, s: ft.attention(a, b, c, dropout_p=P, seed=s))(
        t(q[0]), t(k[0]), t(v[0]), seeds)
    for n in range(N2):
        np.testing.assert_array_equal(o[n].numpy(), flashattn.attention(q[0, n], k[0, n], v[0, n], dropout_p=P,
                                                                         seed=int(seeds[n])))
    # mapped along the outer level, shared along the inner one: the inner index counts
    o = torch.func.vmap(lambda a, b, c, s: torch.func.vmap(
        lambda x, y, z: ft.attention(x, y, z, dropout_p=P, seed=s))(a, b, c))(t(q), t(k), t(v), seeds[:N1])
    for m in range(N1):
        want = flashattn.attention(*(flat(x[m], (N2,)) for x in (q, k, v)), dropout_p=P, seed=int(seeds[m]))
        np.testing.assert_array_equal(o[m].numpy(), want.reshape(q.shape[1:]))
    # mapped along the inner level, shared along the outer one: the outer index counts
    o = torch.func.vmap(lambda a, b, c: torch.func.vmap(
        lambda x, y, z, s: ft.attention(x, y, z, dropout_p=P, seed=s))(a, b, c, seeds))(t(q), t(k), t(v))
    for n in range(N2):
        want = flashattn.attention(*(flat(x[:, n], (N1,)) for x in (q, k, v)), dropout_p=P, seed=int(seeds[n]))
        np.testing.assert_array_equal(o[:, n].numpy(), want.reshape(q[:, n].shape))


def test_randomness_modes_with_a_drawn_seed(rng):
    """seed=None draws the seed with torch.randint inside the vmap: randomness="error" (the
    default) refuses it (torch's RuntimeError), "same" draws one seed (one batched call's
    masks, as an explicit seed), "different" one seed per element (each its own masks)."""
    N, B, H, S, D = 3, 2, 1, 8, 8
    q, k, v = (randn(rng, (N, B, H, S, D)) for _ in range(3))

    def f(a, b, c):
        return ft.attention(a, b, c, dropout_p=P)
    with pytest.raises(RuntimeError, match="randomness"):
        torch.func.vmap(f)(t(q), t(k), t(v))
    torch.manual_seed(7)
    o = torch.func.vmap(f, randomness="same")(t(q), t(k), t(v))
    torch.manual_seed(7)
    want = flashattn.attention(*(flat(x, (N,)) for x in (q, k, v)), dropout_p=P, seed=ft.dropout_seed())
    np.testing.assert_array_equal(o.numpy(), want.reshape(q.shape))
    torch.manual_seed(7)
    o = torch.func.vmap(f, randomness="different")(t(q), t(k), t(v))
    torch.manual_seed(7)
    seeds = torch.func.vmap(lambda a: torch.randint(0, 2**62, ()), randomness="different")(t(q))
    assert len(set(seeds.tolist())) == N
    for n in range(N):
        np.testing.assert_array_equal(o[n].numpy(), flashattn.attention(q[n], k[n], v[n], dropout_p=P,
                                                                         seed=int(seeds[n])))


@pytest.mark.parametrize("mapped_lengths", [False, True])
def test_varlen_vmap_draws_one_packed_batchs_masks(rng, mapped_lengths):
    """Element n's sequences draw at b = n * batch + s: one packed batch of every element's
    sequences in turn, forward and gradients."""
    N, H, D = 3, 2, 8
    lens = [[5, 0, 4], [2, 6, 1], [3, 3, 3]] if mapped_lengths else [[5, 0, 4]] * N
    T = sum(lens[0])
    cu = np.array([np.cumsum([0] + x) for x in lens], np.int32)  # [N, batch + 1]
    q, k, v, w = (randn(rng, (N, T, H, D)) for _ in range(4))
    cu_all = np.concatenate([cu[n, :-1] + n * T for n in range(N)] + [[N * T]]).astype(np.int32)
    cat = [x.reshape(N * T, H, D) for x in (q, k, v)]
    ob, lse = flashattn.varlen_attention(*cat, cu_all, cu_all, causal=True, dropout_p=P, seed=SEED, return_lse=True)
    want = flashattn.varlen_attention_backward(*cat, ob, lse, w.reshape(N * T, H, D), cu_all, cu_all, causal=True,
                                               dropout_p=P, seed=SEED)

    def f(a, b, c, cq):
        return ft.varlen_attention(a, b, c, cq, cq, causal=True, dropout_p=P, seed=SEED)
    if mapped_lengths:
        run = torch.func.vmap(f)
        lengths = t(cu)
    else:
        run = torch.func.vmap(f, in_dims=(0, 0, 0, None))
        lengths = t(cu[0])
    o = run(t(q), t(k), t(v), lengths)
    np.testing.assert_array_equal(o.numpy(), ob.reshape(q.shape))
    # the backward of the vmapped call, through loss.backward()
    x = [t(a).requires_grad_() for a in (q, k, v)]
    (run(*x, lengths) * t(w)).sum().backward()
    for g, r in zip(x, want):
        np.testing.assert_array_equal(g.grad.numpy(), r.reshape(q.shape))


def test_varlen_vmap_over_a_dim_of_size_zero_gives_empty_results(rng):
    cu = t(np.array([0, 3, 5], np.int32))
    qs = torch.randn(0, 5, 2, 8)
    o = torch.func.vmap(lambda a: ft.varlen_attention(a, a, a, cu, cu, dropout_p=P, seed=SEED))(qs)
    assert o.shape == (0, 5, 2, 8) and o.dtype == qs.dtype


def test_torch_vmap_draws_what_jax_vmap_draws(rng):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import flashattn.jax as fj
    N, B, H, S, D = 2, 2, 2, 8, 8
    q, k, v = (randn(rng, (N, B, H, S, D)) for _ in range(3))
    ot = torch.func.vmap(lambda a, b, c: ft.attention(a, b, c, dropout_p=P, seed=SEED))(t(q), t(k), t(v))
    oj = jax.vmap(lambda a, b, c: fj.attention(a, b, c, layout="bhsd", dropout_p=P, seed=SEED))(
        jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
    np.testing.assert_array_equal(ot.numpy(), np.asarray(oj))
