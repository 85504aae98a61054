"""Inputs of the inference shapes for every front's tests: packed batches (lengths with empty
and length-1 sequences, Sq != Sk, every mask, GQA/MQA) and decoding steps (ragged cache
lengths with 0, new tokens appended, paged caches with shuffled and shared pages). Stale
cache rows hold NaN, so a result that read one shows it."""
import numpy as np

from conftest import randn

# name: (lens_q, lens_k, Hq, Hk, D, Dv, options)
VARLEN = {
    "empty_and_one": ([0, 1, 7, 3, 1], [5, 1, 0, 9, 0], 2, 2, 16, 16, {}),
    "causal": ([5, 17, 1, 30, 9], [9, 17, 4, 30, 4], 2, 2, 16, 16, {"causal": True}),
    "window": ([12, 0, 20], [12, 3, 26], 2, 2, 8, 8, {"window": (4, 2)}),
    "window_causal": ([11, 25], [19, 25], 2, 2, 8, 8, {"window": (6, -1), "causal": True}),
    "gqa": ([7, 13, 2], [9, 13, 21], 6, 2, 16, 16, {"causal": True}),
    "mqa": ([4, 19], [8, 19], 4, 1, 16, 16, {"causal": True}),
    "softcap_alibi": ([9, 14], [15, 14], 4, 2, 16, 16,
                      {"softcap": 3.0, "scale": 0.5, "alibi": True, "causal": True}),
    "dv_differs": ([6, 10], [11, 3], 2, 2, 16, 24, {}),
    "top_left": ([6, 10], [11, 14], 2, 2, 16, 16, {"causal": True, "diag_offset": 0}),
}


def cu(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def alibi(H):
    return (0.5 ** (np.arange(1, H + 1) * 8.0 / H)).astype(np.float32)


def make_varlen(rng, name, dtype="f32"):
    """(q, k, v, cu_q, cu_k, kwargs): packed numpy arrays and the options, named as
    flashattn.varlen_attention and reference_inference take them."""
    lq, lk, Hq, Hk, D, Dv, opt = VARLEN[name]
    cq, ck = cu(lq), cu(lk)
    q = randn(rng, (cq[-1], Hq, D), dtype)
    k = randn(rng, (ck[-1], Hk, D), dtype)
    v = randn(rng, (ck[-1], Hk, Dv), dtype)
    kw = {key: opt[key] for key in ("causal", "window", "softcap", "scale", "diag_offset") if key in opt}
    if opt.get("alibi"):
        kw["alibi_slopes"] = alibi(Hq)
    return q, k, v, cq, ck, kw


# name: (cache_seqlens, Sq_new, Hq, Hk, D, Dv, S_cache_max, append, options)
DECODE = {
    "one_token": ([0, 5, 33, 63], 1, 4, 4, 16, 16, 64, True, {"causal": True}),
    "gqa_8to1": ([7, 0, 40], 1, 16, 2, 32, 32, 48, True, {"causal": True}),
    "mqa_multi": ([0, 12, 29], 4, 4, 1, 16, 16, 33, True, {"causal": True}),
    "no_append": ([1, 0, 31], 3, 4, 2, 16, 16, 32, False, {"causal": True}),
    "no_append_full": ([9, 0, 32], 2, 2, 2, 16, 8, 32, False, {}),
    "shared_pages": ([20, 18, 5], 2, 4, 2, 16, 16, 32, False, {"causal": True}),
    "window": ([20, 3, 45], 2, 4, 2, 16, 16, 50, True, {"causal": True, "window": (8, -1)}),
    "softcap_alibi": ([17, 2], 3, 4, 2, 16, 16, 40, True,
                      {"causal": True, "softcap": 2.0, "alibi": True}),
}


def _options(opt, Hq):
    kw = {key: opt[key] for key in ("causal", "window", "softcap", "scale") if key in opt}
    if opt.get("alibi"):
        kw["alibi_slopes"] = alibi(Hq)
    return kw


def make_decode(rng, name, dtype="f32"):
    """A dense-cache step: dict(q, k_cache, v_cache, k, v, lens, kw) with rows at and past
    each sequence's length NaN (k, v None without appending)."""
    lens, Sq, Hq, Hk, D, Dv, S, append, opt = DECODE[name]
    B = len(lens)
    lens = np.array(lens, np.int32)
    kc = randn(rng, (B, S, Hk, D), dtype)
    vc = randn(rng, (B, S, Hk, Dv), dtype)
    for b, n in enumerate(lens):
        kc[b, n:] = np.nan
        vc[b, n:] = np.nan
    q = randn(rng, (B, Sq, Hq, D), dtype)
    k = randn(rng, (B, Sq, Hk, D), dtype) if append else None
    v = randn(rng, (B, Sq, Hk, Dv), dtype) if append else None
    return dict(q=q, k_cache=kc, v_cache=vc, k=k, v=v, lens=lens, kw=_options(opt, Hq))


def decode_rows(d):
    """Per sequence, the keys and values it attends to, in order (the reference's input)."""
    ks, vs = [], []
    for b, n in enumerate(d["lens"]):
        kb, vb = d["k_cache"][b, :n], d["v_cache"][b, :n]
        if d["k"] is not None:
            kb = np.concatenate([kb, d["k"][b]])
            vb = np.concatenate([vb, d["v"][b]])
        ks.append(kb)
        vs.append(vb)
    return ks, vs


def expected_cache(d, which):
    """The dense cache after appending: the new rows at lens[b].., all else as it was."""
    c = d[which + "_cache"].copy()
    new = d[which]
    if new is not None:
        for b, n in enumerate(d["lens"]):
            c[b, n:n + new.shape[1]] = new[b]
    return c


def page(d, rng, page_size=16, share=False):
    """The same step on a paged cache: pages in shuffled order among spare ones (NaN), the
    table's unused entries -1 (never read); share makes sequence 1 start with sequence 0's
    first page (read-only: only without appending). Adds k_pages, v_pages, table."""
    kc, vc = d["k_cache"], d["v_cache"]
    B, S = kc.shape[:2]
    max_pages = -(-S // page_size)
    need = [-(-(int(n) + (0 if d["k"] is None else d["k"].shape[1])) // page_size) for n in d["lens"]]
    num_pages = sum(need) + 3
    ids = rng.permutation(num_pages)
    kp = np.full((num_pages, page_size) + kc.shape[2:], np.nan, kc.dtype)
    vp = np.full((num_pages, page_size) + vc.shape[2:], np.nan, vc.dtype)
    table = np.full((B, max_pages), -1, np.int32)
    nxt = 0
    for b in range(B):
        for j in range(need[b]):
            table[b, j] = ids[nxt]
            nxt += 1
            rows = slice(j * page_size, min((j + 1) * page_size, S))
            n = rows.stop - rows.start
            kp[table[b, j], :n] = kc[b, rows]
            vp[table[b, j], :n] = vc[b, rows]
    if share:  # read-only sharing: sequence 0's first page is full of its valid rows
        assert d["k"] is None and d["lens"][0] >= page_size
        table[1, 0] = table[0, 0]
        for which in ("k_cache", "v_cache"):
            d[which][1, :page_size] = d[which][0, :page_size]
            d[which][1, d["lens"][1]:] = np.nan
    d.update(k_pages=kp, v_pages=vp, table=table, page_size=page_size)
    return d


def expected_pages(d, which):
    """The paged cache after appending."""
    c = d[which + "_pages"].copy()
    new = d[which]
    if new is not None:
        P = d["page_size"]
        for b, n in enumerate(d["lens"]):
            for t in range(new.shape[1]):
                pos = int(n) + t
                c[d["table"][b, pos // P], pos % P] = new[b, t]
    return c
