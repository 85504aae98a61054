"""The numpy fronts of the inference shapes against the per-sequence float64 reference
(reference_inference.py): packed batches forward and backward, kv-cache decoding with and
without appending, paged caches, outputs into caller arrays, and bad input."""
import numpy as np
import pytest

import flashattn
import reference_inference as ref
from conftest import BWD_TOL, SEED, check, check_lse, fwd_tol, randn
from inference_cases import (DECODE, VARLEN, decode_rows, expected_cache, expected_pages,
                             make_decode, make_varlen, page)

DTYPES = ["f32", "f16", "bf16"]


def _bitwise_equal(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
        np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


# ---- packed variable-length batches ---------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(VARLEN))
def test_varlen_forward_matches_reference(rng, case, dtype):
    q, k, v, cq, ck, kw = make_varlen(rng, case, dtype)
    o, lse = flashattn.varlen_attention(q, k, v, cq, ck, return_lse=True, **kw)
    assert o.dtype == q.dtype and o.shape == q.shape[:2] + (v.shape[2],)
    o_ref, lse_ref = ref.varlen(q, k, v, cq, ck, **kw)
    check("o", o, o_ref, fwd_tol(dtype, lse_ref))
    check_lse(lse, lse_ref)
    assert (np.asarray(o, np.float64)[np.isinf(lse_ref).T] == 0).all()  # rows with no key


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(VARLEN))
def test_varlen_backward_matches_reference(rng, case, dtype):
    q, k, v, cq, ck, kw = make_varlen(rng, case, dtype)
    o, lse = flashattn.varlen_attention(q, k, v, cq, ck, return_lse=True, **kw)
    do = randn(rng, o.shape, dtype)
    grads = flashattn.varlen_attention_backward(q, k, v, o, lse, do, cq, ck, **kw)
    _, ref_grads = ref.varlen(q, k, v, cq, ck, do=do, o_saved=o, **kw)
    for name, g, r, x in zip(("dq", "dk", "dv"), grads, ref_grads, (q, k, v)):
        assert g.shape == x.shape and g.dtype == x.dtype
        check(name, g, r, BWD_TOL[dtype])


def test_varlen_packed_qkv_views_and_out(rng):
    """q, k, v sliced from one packed [T, 3, H, D] array go in through their strides; o
    lands in a caller array (poisoned first)."""
    lens = [3, 0, 11, 1]
    cq = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    qkv = randn(rng, (cq[-1], 3, 4, 16))
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    out = np.full((cq[-1], 4, 16), np.nan, np.float32)
    o = flashattn.varlen_attention(q, k, v, cq, cq, causal=True, out=out)
    assert o is out
    o_ref, lse_ref = ref.varlen(q, k, v, cq, cq, causal=True)
    check("o", o, o_ref, fwd_tol("f32", lse_ref))
    do = randn(rng, o.shape)
    dq, dk, dv = flashattn.varlen_attention_backward(q, k, v, o, _lse(q, k, v, cq), do, cq, cq, causal=True)
    _, (rq, rk, rv) = ref.varlen(q, k, v, cq, cq, do=do, causal=True)
    for name, g, r in (("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
        check(name, g, r, BWD_TOL["f32"])


def _lse(q, k, v, cq):
    return flashattn.varlen_attention(q, k, v, cq, cq, causal=True, return_lse=True)[1]


def test_varlen_single_sequence_equals_dense(rng):
    """One sequence packed is the dense problem with batch 1 (both through the library)."""
    q, k, v = randn(rng, (1, 4, 21, 16)), randn(rng, (1, 2, 30, 16)), randn(rng, (1, 2, 30, 16))
    dense = flashattn.attention(q, k, v, causal=True, window=(7, -1))
    packed = flashattn.varlen_attention(q[0].transpose(1, 0, 2), k[0].transpose(1, 0, 2),
                                        v[0].transpose(1, 0, 2), [0, 21], [0, 30], causal=True,
                                        window=(7, -1))
    np.testing.assert_allclose(packed, dense[0].transpose(1, 0, 2), rtol=0, atol=1e-6)


# ---- kv-cache decoding ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [c for c in DECODE if c != "shared_pages"])
def test_decode_matches_reference_and_appends(rng, case, dtype):
    d = make_decode(rng, case, dtype)
    want_k, want_v = expected_cache(d, "k"), expected_cache(d, "v")
    ks, vs = decode_rows(d)
    o, lse = flashattn.kvcache_attention(d["q"], d["k_cache"], d["v_cache"], d["k"], d["v"],
                                         cache_seqlens=d["lens"], return_lse=True, **d["kw"])
    B, Sq, Hq, _ = d["q"].shape
    assert o.shape == (B, Sq, Hq, d["v_cache"].shape[3]) and lse.shape == (B, Hq, Sq)
    o_ref, lse_ref = ref.decode(d["q"], ks, vs, **d["kw"])
    check("o", o, o_ref, fwd_tol(dtype, lse_ref))
    check_lse(lse, lse_ref)
    # the new rows are in place, every other byte (stale NaN rows too) as it was
    assert _bitwise_equal(d["k_cache"], want_k) and _bitwise_equal(d["v_cache"], want_v)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("case", ["one_token", "gqa_8to1", "mqa_multi", "no_append", "shared_pages"])
def test_paged_decode_matches_reference(rng, case, dtype):
    d = page(make_decode(rng, case, dtype), rng, share=case == "shared_pages")
    want_k, want_v = expected_pages(d, "k"), expected_pages(d, "v")
    ks, vs = decode_rows(d)
    table = d["table"].copy()
    o, lse = flashattn.kvcache_attention(d["q"], d["k_pages"], d["v_pages"], d["k"], d["v"],
                                         cache_seqlens=d["lens"], block_table=table,
                                         return_lse=True, **d["kw"])
    o_ref, lse_ref = ref.decode(d["q"], ks, vs, **d["kw"])
    check("o", o, o_ref, fwd_tol(dtype, lse_ref))
    check_lse(lse, lse_ref)
    assert _bitwise_equal(d["k_pages"], want_k) and _bitwise_equal(d["v_pages"], want_v)
    assert np.array_equal(table, d["table"])


def test_decode_cache_seqlens_int_none_and_out(rng):
    """FlashAttention's forms: cache_seqlens an int (every sequence) or None (full caches)."""
    kc, vc = randn(rng, (2, 24, 2, 16)), randn(rng, (2, 24, 2, 16))
    q = randn(rng, (2, 1, 4, 16))
    out = np.full((2, 1, 4, 16), np.nan, np.float32)
    o = flashattn.kvcache_attention(q, kc, vc, cache_seqlens=10, out=out)
    assert o is out
    o_ref, _ = ref.decode(q, [kc[0, :10], kc[1, :10]], [vc[0, :10], vc[1, :10]])
    check("o", o, o_ref, 1e-5)
    o = flashattn.kvcache_attention(q, kc, vc)
    o_ref, _ = ref.decode(q, list(kc), list(vc))
    check("o", o, o_ref, 1e-5)


def test_decode_steps_grow_the_cache(rng):
    """Three one-token steps appended one after another equal one dense causal problem."""
    B, S, Hq, Hk, D = 2, 40, 4, 2, 16
    kc, vc = randn(rng, (B, S, Hk, D)), randn(rng, (B, S, Hk, D))
    lens = np.array([5, 17], np.int32)
    for _ in range(3):
        q, kn, vn = randn(rng, (B, 1, Hq, D)), randn(rng, (B, 1, Hk, D)), randn(rng, (B, 1, Hk, D))
        o = flashattn.kvcache_attention(q, kc, vc, kn, vn, cache_seqlens=lens, causal=True)
        lens = lens + 1
        o_ref, _ = ref.decode(q, [kc[b, :lens[b]] for b in range(B)], [vc[b, :lens[b]] for b in range(B)])
        check("o", o, o_ref, 1e-5)


# ---- bad input -------------------------------------------------------------------------

def test_varlen_bad_lengths_name_the_argument(rng):
    q, k, v, cq, ck, kw = make_varlen(rng, "causal")
    bad = cq.copy()
    bad[2] = bad[1] - 1
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be non-decreasing"):
        flashattn.varlen_attention(q, k, v, bad, ck)
    past = ck.copy()
    past[-1] += 1
    with pytest.raises(ValueError, match=r"cu_seqlens_k\[5\] = \d+ reaches past"):
        flashattn.varlen_attention(q, k, v, cq, past)
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[0\] must be 0"):
        flashattn.varlen_attention(q, k, v, cq + 1, ck)
    with pytest.raises(ValueError, match=r"cu_seqlens_q and cu_seqlens_k must both be \[batch \+ 1\]"):
        flashattn.varlen_attention(q, k, v, cq[:-1], ck)
    with pytest.raises(ValueError, match=r"max_seqlen_q = 4 but a sequence has 30 rows"):
        flashattn.varlen_attention(q, k, v, cq, ck, max_seqlen_q=4)
    with pytest.raises(ValueError, match=r"cu_seqlens_k must be integers"):
        flashattn.varlen_attention(q, k, v, cq, ck.astype(np.float32))
    with pytest.raises(ValueError, match=r"q's heads \(2\) are not a multiple"):
        flashattn.varlen_attention(q, k[:, :1].repeat(3, 1), v[:, :1].repeat(3, 1), cq, ck)
    with pytest.raises(ValueError, match=r"lse must be float32 of shape \[Hq, total_q\]"):
        o = flashattn.varlen_attention(q, k, v, cq, ck)
        flashattn.varlen_attention_backward(q, k, v, o, np.zeros((3, 3), np.float32), o, cq, ck)


def _untouched_after(fn, *caches):
    before = [c.copy() for c in caches]
    with pytest.raises(ValueError) as err:
        fn()
    for c, b in zip(caches, before):
        assert _bitwise_equal(c, b), "a failed call wrote into the cache"
    return str(err.value)


def test_decode_bad_input_names_the_argument_and_leaves_the_cache(rng):
    d = make_decode(rng, "one_token")
    args = (d["q"], d["k_cache"], d["v_cache"], d["k"], d["v"])
    over = d["lens"].copy()
    over[3] = 64  # + 1 new token > S_cache_max
    msg = _untouched_after(lambda: flashattn.kvcache_attention(*args, cache_seqlens=over),
                           d["k_cache"], d["v_cache"])
    assert "cache_seqlens[3] = 64 plus 1 new tokens exceeds the cache capacity 64" in msg
    msg = _untouched_after(lambda: flashattn.kvcache_attention(*args, cache_seqlens=-d["lens"] - 1),
                           d["k_cache"], d["v_cache"])
    assert "cache_seqlens[0] = -1 is negative" in msg
    with pytest.raises(ValueError, match=r"cache_seqlens must have shape \[batch\] = \[4\]"):
        flashattn.kvcache_attention(*args, cache_seqlens=d["lens"][:3])
    with pytest.raises(ValueError, match=r"k and v \(the new tokens\) go together"):
        flashattn.kvcache_attention(*args[:4], cache_seqlens=d["lens"])
    with pytest.raises(ValueError, match=r"new k must have shape \[B, Sq, Hk, D\]"):
        flashattn.kvcache_attention(*args[:3], d["k"][:, :, :1], d["v"], cache_seqlens=d["lens"])
    ro = d["k_cache"].copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"k_cache is written in place"):
        flashattn.kvcache_attention(d["q"], ro, d["v_cache"], d["k"], d["v"], cache_seqlens=d["lens"])


def test_paged_bad_input_names_the_argument_and_leaves_the_cache(rng):
    d = page(make_decode(rng, "one_token"), rng)
    call = lambda table, lens=d["lens"]: flashattn.kvcache_attention(  # noqa: E731
        d["q"], d["k_pages"], d["v_pages"], d["k"], d["v"], cache_seqlens=lens, block_table=table)
    bad = d["table"].copy()
    bad[2, 1] = d["k_pages"].shape[0]
    msg = _untouched_after(lambda: call(bad), d["k_pages"], d["v_pages"])
    assert f"block_table[2][1] = {bad[2, 1]} is out of range [0, {bad[2, 1]}) (num_pages)" in msg
    bad = d["table"].copy()
    bad[3, 0] = -2
    msg = _untouched_after(lambda: call(bad), d["k_pages"], d["v_pages"])
    assert "block_table[3][0] = -2 is out of range" in msg
    msg = _untouched_after(lambda: call(d["table"][:, :1], np.array([0, 5, 15, 16], np.int32)),
                           d["k_pages"], d["v_pages"])
    assert "cache_seqlens[3] = 16 plus 1 new tokens exceeds the cache capacity 16 (max_pages x page_size)" in msg
    with pytest.raises(ValueError, match=r"block_table must have shape \[batch, max_pages\] with batch = 4"):
        call(d["table"][:3])
    d2 = make_decode(rng, "no_append")
    pages = d2["k_cache"].reshape(-1, 8, *d2["k_cache"].shape[2:])  # page_size 8: not a multiple of 16
    with pytest.raises(ValueError, match=r"page_size must be a positive multiple of 16, got 8"):
        flashattn.kvcache_attention(d2["q"], pages, pages, cache_seqlens=d2["lens"],
                                    block_table=np.zeros((3, 4), np.int32))



# ---- random configurations -------------------------------------------------------------

def _random_options(rng):
    kw = {}
    if rng.random() < 0.5:
        kw["causal"] = True
    if rng.random() < 0.4:
        kw["window"] = (int(rng.integers(-1, 12)), int(rng.integers(-1, 6)))
    if rng.random() < 0.3:
        kw["softcap"] = float(rng.uniform(1, 5))
    return kw


@pytest.mark.parametrize("draw", range(8))
def test_varlen_random_configurations(rng, draw):
    """Random batches (empty sequences likely), heads, dims and masks, forward and backward."""
    B = int(rng.integers(1, 6))
    lq = [int(rng.integers(0, 40)) if rng.random() > 0.2 else 0 for _ in range(B)]
    lk = [int(rng.integers(0, 40)) if rng.random() > 0.2 else 0 for _ in range(B)]
    # at least one packed row of each, so that the comparisons below have elements (a batch
    # of only empty sequences is test_empty.py's); sequence 0 carries it
    lq[0], lk[0] = max(lq[0], 1), max(lk[0], 1)
    Hk, g, D = int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.choice([8, 16, 32]))
    cq, ck = (np.concatenate([[0], np.cumsum(x)]).astype(np.int32) for x in (lq, lk))
    kw = _random_options(rng)
    what = f"lens_q {lq} lens_k {lk} Hq {Hk * g} Hk {Hk} D {D} {kw} (seed {SEED})"
    q, k, v = randn(rng, (cq[-1], Hk * g, D)), randn(rng, (ck[-1], Hk, D)), randn(rng, (ck[-1], Hk, D))
    o, lse = flashattn.varlen_attention(q, k, v, cq, ck, return_lse=True, **kw)
    do = randn(rng, o.shape)
    (o_ref, lse_ref), ref_grads = ref.varlen(q, k, v, cq, ck, do=do, o_saved=o, **kw)
    check(f"o of {what}", o, o_ref, fwd_tol("f32", lse_ref))
    check_lse(lse, lse_ref)
    grads = flashattn.varlen_attention_backward(q, k, v, o, lse, do, cq, ck, **kw)
    for name, gr, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        # relative to max(max|ref|, 1): where every row sees one key (Sk_b = 1, or a window
        # of width 1) p = 1 and dq is exactly 0 in exact arithmetic, so the library's f32
        # roundoff (~1e-7) over max|ref| (~0) would be no measure of anything
        gr = np.asarray(gr, np.float64)
        assert not np.isnan(gr).any(), f"NaN in {name} of {what}"
        err = np.abs(gr - r).max() / max(np.abs(r).max(), 1.0)
        assert err <= BWD_TOL["f32"], f"{name} of {what}: error {err:.2e} > {BWD_TOL['f32']:.1e}"


@pytest.mark.parametrize("draw", range(8))
def test_decode_random_configurations(rng, draw):
    """Random ragged caches, new tokens or not, dense or paged, masks."""
    B, Sq = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    Hk, g, D = int(rng.integers(1, 3)), int(rng.choice([1, 2, 4])), int(rng.choice([8, 16]))
    append = bool(rng.random() < 0.6)
    S = 16 * int(rng.integers(1, 4))
    lens = rng.integers(0, S - (Sq if append else 0) + 1, size=B).astype(np.int32)
    lens[rng.random(B) < 0.25] = 0
    kw = _random_options(rng)
    kc, vc = randn(rng, (B, S, Hk, D)), randn(rng, (B, S, Hk, D))
    for b, n in enumerate(lens):
        kc[b, n:] = vc[b, n:] = np.nan
    d = dict(q=randn(rng, (B, Sq, Hk * g, D)), k_cache=kc, v_cache=vc, lens=lens, kw=kw,
             k=randn(rng, (B, Sq, Hk, D)) if append else None, v=randn(rng, (B, Sq, Hk, D)) if append else None)
    paged = bool(rng.random() < 0.5)
    what = f"B {B} Sq {Sq} Hq {Hk * g} Hk {Hk} D {D} S {S} lens {lens.tolist()} append {append} paged {paged} {kw} (seed {SEED})"
    o_ref, lse_ref = ref.decode(d["q"], *decode_rows(d), **kw)
    if paged:
        page(d, rng)
        want = expected_pages(d, "k")
        o, lse = flashattn.kvcache_attention(d["q"], d["k_pages"], d["v_pages"], d["k"], d["v"], lens,
                                             d["table"], return_lse=True, **kw)
        assert _bitwise_equal(d["k_pages"], want), what
    else:
        want = expected_cache(d, "k")
        o, lse = flashattn.kvcache_attention(d["q"], kc, vc, d["k"], d["v"], lens, return_lse=True, **kw)
        assert _bitwise_equal(kc, want), what
    check(f"o of {what}", o, o_ref, fwd_tol("f32", lse_ref))
    check_lse(lse, lse_ref)


# ---- plans of the inference shapes ------------------------------------------------------

@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window": (4, 2), "softcap": 2.0}])
def test_plan_varlen_forward_is_the_sum_of_the_sequences(kw):
    """README: each sequence runs as its own dense problem, so the forward's cost is the sum
    of the sequences' dense costs; a sequence with no queries costs nothing. (One with
    queries but no keys still writes its rows, o = 0 and lse = -inf, which no dense plan of 0
    keys describes: not drawn here.)"""
    lq, lk = [5, 0, 17, 1, 30, 0], [9, 3, 17, 4, 30, 0]
    cq, ck = (np.concatenate([[0], np.cumsum(x)]) for x in (lq, lk))
    got = flashattn.plan_varlen(cq, ck, heads=4, kv_heads=2, head_dim=16, **kw)
    fields = ("flops", "flops_useful", "transcendentals", "bytes_accessed")
    total = dict.fromkeys(fields, 0)
    for a, b in zip(lq, lk):
        if a and b:
            dense = flashattn.plan(batch=1, heads=4, kv_heads=2, seq_q=a, seq_k=b, head_dim=16, **kw).forward
            for f in fields:
                total[f] += dense[f]
    assert {f: got.forward[f] for f in fields} == total
    assert got.exact and got.backward["flops"] > 0


def test_plan_kvcache_flops_and_bytes():
    """A decoding step does the dense problems' flops; its bytes cover every cache row read
    (each once), and a backward does not exist (.backward is None)."""
    lens, Sq, Hq, Hk, D = [3, 0, 40], 2, 8, 2, 16
    for new in (False, True):
        for paged in (False, True):
            shape = dict(page_size=16, num_pages=12, max_pages=4) if paged else dict(cache_len=64)
            got = flashattn.plan_kvcache(lens, seq_q=Sq, heads=Hq, kv_heads=Hk, head_dim=D, new_kv=new,
                                         causal=True, **shape)
            keys = [n + (Sq if new else 0) for n in lens]
            flops = sum(flashattn.plan(batch=1, heads=Hq, kv_heads=Hk, seq_q=Sq, seq_k=n, head_dim=D,
                                       causal=True).forward["flops"] for n in keys if n)
            assert got.forward["flops"] == flops
            assert got.forward["bytes_accessed"] >= sum(keys) * Hk * 2 * D * 4
            assert got.backward is None
    with pytest.raises(ValueError, match=r"cache_seqlens\[2\] = 40 plus 2 new tokens exceeds the cache capacity 32"):
        flashattn.plan_kvcache(lens, seq_q=2, heads=Hq, kv_heads=Hk, head_dim=D, new_kv=True,
                               page_size=16, num_pages=12, max_pages=2)
    with pytest.raises(ValueError, match=r"give cache_len \(dense caches\) or page_size"):
        flashattn.plan_kvcache(lens, seq_q=1, heads=Hq, head_dim=D)
    with pytest.raises(ValueError, match=r"cu_seqlens_k\[0\] must be 0"):
        flashattn.plan_varlen([0, 4], [1, 4], heads=2, head_dim=8)
