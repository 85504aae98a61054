"""Problems every front is tested on: each mask, GQA/MQA, Sq != Sk, softcap, ALiBi, bias,
segments. make(rng, name, dtype) draws fresh inputs ([B, H, S, D] numpy arrays) and the
keyword options, named as flashattn.attention and the reference take them."""
import numpy as np

from conftest import randn

# name: (B, Hq, Hk, Sq, Sk, D, Dv, options)
CASES = {
    "plain": (2, 4, 4, 33, 33, 16, 16, {}),
    "causal": (2, 4, 4, 33, 33, 16, 16, {"causal": True}),
    "causal_sq_lt_sk": (1, 2, 2, 17, 40, 16, 16, {"causal": True}),
    "causal_sq_gt_sk": (1, 2, 2, 40, 17, 16, 16, {"causal": True}),  # rows with no key
    "window": (2, 2, 2, 37, 37, 8, 8, {"window": (5, 3)}),
    "window_causal": (1, 2, 2, 37, 45, 8, 8, {"window": (6, -1), "causal": True}),
    "gqa": (2, 6, 2, 21, 29, 16, 16, {}),
    "mqa": (2, 4, 1, 21, 21, 16, 16, {"causal": True}),
    "dv_differs": (1, 2, 2, 19, 23, 16, 24, {}),
    "scale": (1, 2, 2, 19, 23, 16, 16, {"scale": 0.3}),
    "softcap": (1, 2, 2, 25, 25, 16, 16, {"softcap": 2.5, "scale": 1.0}),
    "alibi": (2, 4, 4, 30, 30, 16, 16, {"alibi": True, "causal": True}),
    "bias_full": (2, 3, 3, 20, 24, 16, 16, {"bias": (2, 3, 20, 24)}),
    "bias_heads": (2, 3, 3, 20, 24, 16, 16, {"bias": (1, 3, 20, 24)}),
    "bias_2d": (2, 3, 3, 20, 24, 16, 16, {"bias": (20, 24)}),
    "bias_neg_inf": (1, 2, 2, 20, 24, 16, 16, {"bias": (1, 2, 20, 24), "neg_inf": True}),
    "segments": (2, 2, 2, 31, 27, 16, 16, {"segments": True}),
    "top_left": (1, 2, 2, 17, 40, 16, 16, {"causal": True, "diag_offset": 0, "alibi": True}),
    "block_offset": (1, 2, 2, 24, 30, 16, 16, {"window": (4, 2), "diag_offset": 9}),
    "everything": (2, 4, 2, 29, 35, 16, 8, {"causal": True, "window": (9, 2), "softcap": 4.0,
                                             "alibi": True, "bias": (2, 1, 29, 35), "segments": True}),
}


def segment_ids(rng, B, S, n):
    """Sorted ids (packed documents): n segments per row, each non-empty where S allows."""
    ids = np.zeros((B, S), np.int32)
    for b in range(B):
        cuts = np.sort(rng.choice(np.arange(1, S), size=min(n - 1, S - 1), replace=False))
        ids[b] = np.searchsorted(cuts, np.arange(S), side="right")
    return ids


def make(rng, name, dtype="f32"):
    """(q, k, v, kwargs) for case name: q, k, v in dtype, [B, H, S, D]."""
    B, Hq, Hk, Sq, Sk, D, Dv, opt = CASES[name]
    q = randn(rng, (B, Hq, Sq, D), dtype)
    k = randn(rng, (B, Hk, Sk, D), dtype)
    v = randn(rng, (B, Hk, Sk, Dv), dtype)
    kw = {key: opt[key] for key in ("causal", "window", "softcap", "scale", "diag_offset") if key in opt}
    if opt.get("alibi"):
        kw["alibi_slopes"] = (0.5 ** (np.arange(1, Hq + 1) * 8.0 / Hq)).astype(np.float32)
    if "bias" in opt:
        bias = rng.standard_normal(opt["bias"]).astype(np.float32)
        if opt.get("neg_inf"):
            bias[rng.random(bias.shape) < 0.2] = -np.inf
        kw["bias"] = bias
    if opt.get("segments"):
        kw["q_segment_ids"] = segment_ids(rng, B, Sq, 3)
        # the same documents over the keys, scaled to Sk
        kw["kv_segment_ids"] = segment_ids(rng, B, Sk, 3)
    return q, k, v, kw


def bshd(a):
    """A [B, H, S, D] array as a [B, S, H, D] view (no copy), for layout="bshd"."""
    return np.swapaxes(a, 1, 2)
