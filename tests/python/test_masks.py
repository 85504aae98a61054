"""flashattn.masks: every constructor against its per-element definition (written here from
docs/masks.md, not from the library's code), & and |, at several block sizes; attention with
masks in the numpy front against the float64 reference (the mask as a -inf bias); the plan
exact (flops_useful the popcount). Random cases draw from the run's seed (FA_TEST_SEED)."""
import numpy as np
import pytest

import flashattn
import reference as ref
from conftest import BWD_TOL, FWD_TOL, SEED, randn, rel_err
from flashattn import masks

# (Sq, Sk) with edge blocks, Sq != Sk both ways; (block_q, block_k) with several blocks per row
SIZES = [(37, 37), (23, 41), (50, 19)]
BLOCKS = [(0, 0), (8, 8), (16, 4), (5, 7)]


def _grid(B, H, Sq, Sk):
    return np.ix_(np.arange(B), np.arange(H), np.arange(Sq), np.arange(Sk))


def _pos(Sq, Sk, off):
    """(d, j): query i's key position d = i + off, [1, 1, Sq, 1], and key j, [1, 1, 1, Sk]."""
    off = Sk - Sq if off is None else off
    return np.arange(Sq).reshape(1, 1, Sq, 1) + off, np.arange(Sk).reshape(1, 1, 1, Sk)


def want_causal(Sq, Sk, off):
    d, j = _pos(Sq, Sk, off)
    return j <= d


def want_window(Sq, Sk, off, left, right):
    d, j = _pos(Sq, Sk, off)
    m = np.ones((1, 1, Sq, Sk), bool)
    if left is not None and left >= 0:
        m = m & (j >= d - left)
    if right is not None and right >= 0:
        m = m & (j <= d + right)
    return m


def want_chunked(Sq, Sk, off, C):
    d, j = _pos(Sq, Sk, off)
    return (j <= d) & (j // C == d // C)


def want_prefix(Sq, Sk, off, prefix):
    d, j = _pos(Sq, Sk, off)
    p = np.asarray(prefix).reshape(-1, 1, 1, 1)
    return (j < p) | (j <= d)


def want_documents(S, rows):
    out = []
    for lens in rows:
        doc = np.repeat(np.arange(len(lens)), lens)
        out.append(doc[:, None] == doc[None, :])
    return np.stack(out)[:, None]


def _check(m, want, B, H, Sq, Sk, diag=None):
    want = np.broadcast_to(want, (want.shape[0], want.shape[1], Sq, Sk))
    for block in BLOCKS:
        got = m.build(B, H, Sq, Sk, diag_offset=diag, block=block).to_dense()
        assert got.shape == want.shape, (got.shape, want.shape, block)
        bad = np.argwhere(got != want)
        assert bad.size == 0, f"{m!r} block {block}: {len(bad)} elements differ, first at {bad[0].tolist()}"


@pytest.mark.parametrize("Sq,Sk", SIZES)
def test_constructors(rng, Sq, Sk):
    print(f"seed {SEED}")
    for off in (None, 0, -3, 5):
        _check(masks.causal(off), want_causal(Sq, Sk, off), 2, 3, Sq, Sk)
        left, right = int(rng.integers(0, 12)), int(rng.integers(0, 6))
        for l_, r_ in ((left, right), (None, right), (left, None), (-1, 0), (0, 0)):
            _check(masks.window(l_, r_, off), want_window(Sq, Sk, off, l_, r_), 2, 3, Sq, Sk)
        C = int(rng.integers(1, 20))
        _check(masks.chunked(C, off), want_chunked(Sq, Sk, off, C), 2, 3, Sq, Sk)
        P = rng.integers(0, Sk + 1, 2)
        _check(masks.prefix_lm(P, off), want_prefix(Sq, Sk, off, P), 2, 3, Sq, Sk)
        _check(masks.prefix_lm(int(P[0]), off), want_prefix(Sq, Sk, off, P[:1]), 2, 3, Sq, Sk)


def test_alignment_from_the_call():
    """diag_offset=None takes the call's own diag_offset (bottom-right when it has none)."""
    _check(masks.causal(), want_causal(20, 30, 0), 1, 1, 20, 30, diag=0)
    _check(masks.chunked(6), want_chunked(20, 30, -4, 6), 1, 1, 20, 30, diag=-4)
    _check(masks.causal(3), want_causal(20, 30, 3), 1, 1, 20, 30, diag=0)  # its own wins


def _cuts(rng, S, n):
    cut = np.sort(rng.choice(np.arange(1, S), n - 1, replace=False))
    return np.diff(np.concatenate([[0], cut, [S]])).tolist()


def test_documents(rng):
    S = 45
    rows = [_cuts(rng, S, 4), _cuts(rng, S, 1), [1] * S]
    _check(masks.documents(rows), want_documents(S, rows), 3, 2, S, S)
    one = _cuts(rng, S, 3)
    _check(masks.documents(one), want_documents(S, [one]), 3, 2, S, S)
    with pytest.raises(ValueError):  # lengths that do not sum to seq
        masks.documents([S - 1]).build(1, 1, S, S)
    with pytest.raises(ValueError, match="batch"):
        masks.documents(rows).build(2, 1, S, S)


@pytest.mark.parametrize("Sq,Sk", SIZES)
def test_from_array_and_fn(rng, Sq, Sk):
    B, H = 2, 3
    for shape in [(B, H, Sq, Sk), (1, H, Sq, Sk), (B, 1, Sq, Sk), (Sq, Sk), (B, 1, 1, Sk), (1, 1, Sq, 1)]:
        a = rng.random(shape) < 0.5
        a4 = a.reshape((1,) * (4 - a.ndim) + a.shape)
        _check(masks.from_array(a), a4, B, H, Sq, Sk)
    # all-empty and all-full blocks, single elements
    a = np.zeros((Sq, Sk), bool)
    a[int(rng.integers(Sq)), int(rng.integers(Sk))] = True
    a[:, :8] = True
    _check(masks.from_array(a), a[None, None], B, H, Sq, Sk)

    def fn(b, h, i, j):
        return (i + b * 3 + h) % 5 != j % 4

    b, h, i, j = _grid(B, H, Sq, Sk)
    _check(masks.from_fn(fn), fn(b, h, i, j), B, H, Sq, Sk)
    calls = []
    m = masks.from_fn(lambda b, h, i, j: calls.append(1) or (i >= j))
    _check(m, want_causal(Sq, Sk, 0), B, H, Sq, Sk)
    m.build(B, H, Sq, Sk)
    m.build(B, H, Sq, Sk)
    assert len(calls) == len(BLOCKS)  # once per shape and block size it was bound to, then cached
    assert m.build(B, H, Sq, Sk).dims() == (1, 1, Sq, Sk)  # independent of b and h: shared


def test_and_or_per_head(rng):
    B, H, Sq, Sk = 2, 3, 29, 33
    c, w = masks.causal(0), masks.window(6, 2, 0)
    a = rng.random((B, 1, Sq, Sk)) < 0.7
    fa = masks.from_array(a)
    _check(c & w, want_causal(Sq, Sk, 0) & want_window(Sq, Sk, 0, 6, 2), B, H, Sq, Sk)
    _check(c | w, want_causal(Sq, Sk, 0) | want_window(Sq, Sk, 0, 6, 2), B, H, Sq, Sk)
    _check((c | w) & fa, (want_causal(Sq, Sk, 0) | want_window(Sq, Sk, 0, 6, 2)) & a, B, H, Sq, Sk)
    _check(masks.chunked(7, 0) | fa, want_chunked(Sq, Sk, 0, 7) | a, B, H, Sq, Sk)
    heads = [c, w, c]
    want = np.concatenate([want_causal(Sq, Sk, 0), want_window(Sq, Sk, 0, 6, 2), want_causal(Sq, Sk, 0)], axis=1)
    _check(masks.per_head(heads), want, B, H, Sq, Sk)
    _check(masks.per_head([c] * H), want_causal(Sq, Sk, 0), B, H, Sq, Sk)
    with pytest.raises(TypeError):
        c & np.ones((Sq, Sk), bool)
    with pytest.raises(TypeError):
        bool(c)
    with pytest.raises(ValueError, match="3 masks"):
        masks.per_head(heads).build(B, 2, Sq, Sk)


def test_bad_arguments():
    with pytest.raises(ValueError):
        masks.chunked(0).build(1, 1, 8, 8)
    with pytest.raises(TypeError):
        masks.from_array(np.ones((4, 4)))
    with pytest.raises(ValueError, match="broadcast"):
        masks.from_array(np.ones((3, 5), bool)).build(1, 1, 4, 5)
    with pytest.raises(ValueError, match="integer"):
        masks.window(1.5, 0)
    with pytest.raises(ValueError):
        masks.prefix_lm([1, 2, 3]).build(2, 1, 8, 8)


def _cases(rng, B, H, Sq, Sk):
    """(mask, its per-element definition [B or 1, H or 1, Sq, Sk]) for the attention tests;
    bottom-right alignment (the fronts' default) unless a mask sets its own."""
    a = rng.random((B, 1, Sq, Sk)) < 0.4
    a[0, 0, 1] = False  # a row with no visible key
    C = int(rng.integers(3, 12))
    P = rng.integers(0, Sk + 1, B)
    b, h, i, j = _grid(1, H, Sq, Sk)
    per_head = (i + h) % 3 != j % 2
    return [
        (masks.causal() & masks.chunked(C), want_causal(Sq, Sk, None) & want_chunked(Sq, Sk, None, C)),
        (masks.window(5, 2) | masks.causal(0), want_window(Sq, Sk, None, 5, 2) | want_causal(Sq, Sk, 0)),
        (masks.prefix_lm(P), want_prefix(Sq, Sk, None, P)),
        (masks.from_array(a), a),
        (masks.from_fn(lambda b, h, i, j: (i + h) % 3 != j % 2), per_head),
    ]


@pytest.mark.parametrize("Sq,Sk", [(40, 40), (24, 70)])
def test_attention_with_masks(rng, Sq, Sk):
    """numpy forward and backward with masks, GQA and softcap, against the float64 reference
    with the per-element definition as a -inf bias; the plan exact (flops_useful the popcount)."""
    B, Hq, Hk, D = 2, 4, 2, 16
    q, k, v = randn(rng, (B, Hq, Sq, D)), randn(rng, (B, Hk, Sk, D)), randn(rng, (B, Hk, Sk, D))
    do = randn(rng, (B, Hq, Sq, D))
    cases = _cases(rng, B, Hq, Sq, Sk)
    if Sq == Sk:
        rows = [[7, 20, 13], [40]]
        cases.append((masks.documents(rows) & masks.causal(), want_documents(Sq, rows) & want_causal(Sq, Sk, 0)))
    for m, want in cases:
        bias = np.where(np.broadcast_to(want, (B, Hq, Sq, Sk)), 0.0, -np.inf)
        o, lse = flashattn.attention(q, k, v, mask=m, softcap=8.0, return_lse=True)
        o_ref, lse_ref, _ = ref.forward(q, k, v, bias=bias, softcap=8.0)
        assert rel_err(o, o_ref) <= FWD_TOL["f32"], m
        assert np.array_equal(np.isneginf(lse), np.isneginf(lse_ref)), m
        fin = np.isfinite(lse_ref)
        assert np.abs(lse[fin] - lse_ref[fin]).max() <= 1e-5 * (1 + np.abs(lse_ref[fin]).max()), m
        grads = flashattn.attention_backward(q, k, v, o, lse, do, mask=m, softcap=8.0)
        for g, w in zip(grads, ref.backward(q, k, v, do, bias=bias, softcap=8.0)[:3]):
            assert rel_err(g, w) <= BWD_TOL["f32"], m
        p = flashattn.plan(batch=B, heads=Hq, kv_heads=Hk, seq_q=Sq, seq_k=Sk, head_dim=D, mask=m)
        assert p.exact
        assert p.forward["flops_useful"] == 4 * D * int(np.broadcast_to(want, (B, Hq, Sq, Sk)).sum()), m
    # a mask combines by AND with causal= and window=
    m, want = cases[3]
    o = flashattn.attention(q, k, v, mask=m, causal=True, window=(6, None))
    vis = np.broadcast_to(want, (B, Hq, Sq, Sk)) & want_window(Sq, Sk, None, 6, 0)
    o_ref, _, _ = ref.forward(q, k, v, bias=np.where(vis, 0.0, -np.inf))
    assert rel_err(o, o_ref) <= FWD_TOL["f32"]


def test_plan_skips_blocks():
    """A mask's empty blocks are not run: fewer flops than dense, and a from_array mask that
    hides whole tiles costs what the same mask from a constructor costs."""
    S, D = 512, 32
    dense = flashattn.plan(batch=1, heads=2, seq_q=S, head_dim=D)
    c = flashattn.plan(batch=1, heads=2, seq_q=S, head_dim=D, mask=masks.chunked(128))
    a = flashattn.plan(batch=1, heads=2, seq_q=S, head_dim=D,
                       mask=masks.from_array(masks.chunked(128).to_array(1, 2, S, S)))
    assert c.forward["flops"] < dense.forward["flops"] / 2
    assert (a.forward, a.backward) == (c.forward, c.backward)


def test_plan_of_a_boolean_array_is_the_calls(rng, monkeypatch):
    """flashattn.plan(mask=array) planned the array as masks.from_array (exact, empty blocks
    skipped) while attention(mask=array) runs it as a 0 / -inf bias: the plan's figures were
    not the call's. It now plans what the call runs (as mask_shape=, not exact), and
    masks.from_array(array) is the block-sparse form for both; each plan equals its call's
    counts."""
    import ctypes
    from flashattn import _native
    counted = []
    forward = _native.PlanHandle.forward

    def spy(self, args):
        c = _native.Counts()
        args.counts = ctypes.pointer(c)
        forward(self, args)
        counted.append((c.flops, c.transcendentals))
    monkeypatch.setattr(_native.PlanHandle, "forward", spy)
    B, H, S, D = 1, 2, 256, 16
    arr = np.tril(np.ones((S, S), bool)) & (rng.random((S, S)) < 0.9)
    q, k, v = (randn(rng, (B, H, S, D)) for _ in range(3))
    for m in (arr, masks.from_array(arr)):
        p = flashattn.plan(batch=B, heads=H, seq_q=S, head_dim=D, mask=m, threads=1)
        flashattn.attention(q, k, v, mask=m, threads=1)
        assert counted[-1] == (p.forward["flops"], p.forward["transcendentals"])
        assert p.exact == isinstance(m, masks.Mask)
    b = flashattn.plan(batch=B, heads=H, seq_q=S, head_dim=D, mask_shape=arr.shape, threads=1)
    a = flashattn.plan(batch=B, heads=H, seq_q=S, head_dim=D, mask=arr, threads=1)
    assert (a.forward, a.backward, a.exact) == (b.forward, b.backward, b.exact)
    with pytest.raises(TypeError, match="boolean array"):
        flashattn.plan(batch=B, heads=H, seq_q=S, head_dim=D, mask=arr.astype(np.float32))


def test_zero_sizes_with_a_mask():
    q = np.zeros((1, 2, 0, 8), np.float32)
    k = np.zeros((1, 2, 5, 8), np.float32)
    o = flashattn.attention(q, k, k, mask=masks.causal())
    assert o.shape == (1, 2, 0, 8)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_attention_with_a_mask_in_half_precision(rng, dtype):
    B, H, S, D = 1, 2, 70, 16
    q, k, v = (randn(rng, (B, H, S, D), dtype) for _ in range(3))
    m = masks.chunked(int(rng.integers(5, 30))) | masks.window(3, 3)
    want = want_chunked(S, S, None, m.a.size) | want_window(S, S, None, 3, 3)
    bias = np.where(np.broadcast_to(want, (B, H, S, S)), 0.0, -np.inf)
    o = flashattn.attention(q, k, v, mask=m)
    assert rel_err(o, ref.forward(q, k, v, bias=bias)[0]) <= FWD_TOL[dtype]


def test_copies_and_pickles_of_a_used_mask_build_their_own():
    """A mask once built kept the library's object in its cache; copy.deepcopy duplicated the
    cache's owner, so collecting the copy freed the object under the original (its next use
    read freed memory and the process aborted), and pickle stored the raw pointer (a crash in
    the process that loaded it). Copies and pickles now take the description only."""
    import copy
    import gc
    import pickle
    from flashattn._mask_native import NativeMask
    for m in (masks.chunked(16) & masks.causal(), masks.from_array(np.tril(np.ones((40, 40), bool))),
              masks.documents([10, 30]) | masks.window(3, 0)):
        want = m.to_array(1, 2, 40, 40)
        c = copy.deepcopy(m)
        assert np.array_equal(c.to_array(1, 2, 40, 40), want)
        del c
        gc.collect()
        assert np.array_equal(m.to_array(1, 2, 40, 40), want)  # the original's object still lives
        p = pickle.loads(pickle.dumps(m))
        assert np.array_equal(p.to_array(1, 2, 40, 40), want)
        assert copy.copy(m).to_array(1, 2, 40, 40).shape == want.shape
    a = pickle.loads(pickle.dumps(masks.from_array(np.ones((4, 4), bool))))
    assert not a.array.flags.writeable  # immutable after unpickling too
    built = masks.causal().build(1, 1, 8, 8)
    assert isinstance(built, NativeMask)
    for f in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="cannot be copied or pickled"):
            f(built)


def test_mask_argument_nits_name_the_argument():
    """documents(8) raised Python's "'int' object is not iterable"; to_array took a negative
    batch or heads count."""
    with pytest.raises(TypeError, match=r"one document of 8 keys is \[8\]"):
        masks.documents(8)
    for dims in ((-1, 1, 4, 4), (1, -2, 4, 4)):
        with pytest.raises(ValueError, match="must be >= 0"):
            masks.causal().to_array(*dims)


@pytest.mark.parametrize("B,H", [(0, 2), (2, 0)])
def test_array_masks_on_empty_calls(B, H):
    """A from_fn mask whose predicate uses b or h, or a full-batch from_array, on a call with no
    batch items or heads gives empty outputs, as every other mask does (the zero-size array
    reached the library, which refused it under the name masks.from_array)."""
    q = np.ones((B, H, 8, 4), np.float32)
    for m in (masks.from_fn(lambda b, h, i, j: j <= i + b + h), masks.from_array(np.ones((B, H, 8, 8), bool))):
        assert flashattn.attention(q, q, q, mask=m).shape == (B, H, 8, 4)


def test_jax_mask_over_more_shapes_than_its_cache(rng):
    """One mask object in eager JAX calls over 10 shapes in turn (its cache holds 8): each
    shape builds, pins and compiles once. The cache dropped the oldest build while JAX kept it
    pinned, so each later call at that shape built, pinned and compiled anew (memory without
    bound). Results equal fresh masks'."""
    pytest.importorskip("jax")
    import flashattn.jax as fj
    from flashattn.jax import _attention
    m = masks.causal()
    qs = [randn(rng, (1, s, 2, 8)) for s in range(9, 19)]
    before = len(_attention._PINNED)
    for _ in range(3):
        for q in qs:
            o = fj.attention(q, q, q, mask=m)
    assert len(_attention._PINNED) - before == len(qs)
    assert np.array_equal(np.asarray(o), np.asarray(fj.attention(qs[-1], qs[-1], qs[-1], causal=True)))
