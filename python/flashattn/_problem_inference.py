"""fa_problem for the inference shapes (README, "Inference shapes"), shared by every front: packed
variable-length batches (cu_seqlens) and kv-cache decoding (cache_seqlens, paged or not).

The fronts hand over shapes and element strides in their tensors' own order (packed
[total, H, D]; decode [B, S, H, D]; paged caches [num_pages, page_size, H, D]) and the
length arrays as int32 numpy arrays; this module checks what only the tensors' shapes can
tell (that q, k and v agree), maps dims and strides to the library's [B, H, S, D], and leaves
every value check (prefix sums, lengths, capacity, pages) to the library, whose messages
name the argument.
"""
import numpy as np

from . import _native
from ._problem import _int, check_not_masked, make_problem, set_dropout


def int32_lengths(name, a, shape_desc, ndim=1):
    """An int32 contiguous numpy copy (or view) of a host length array or table."""
    check_not_masked(name, a)
    a = np.asarray(a)
    if a.size == 0 and a.dtype == np.float64:  # [] is float64 to numpy, though no float was given
        a = a.astype(np.int64)
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name} must be integers {shape_desc}, got dtype {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dim{'s' if ndim > 1 else ''} {shape_desc}, got shape {a.shape}")
    if a.dtype != np.int32:
        if a.size and (a.min() < -(2**31) or a.max() >= 2**31):
            raise ValueError(f"{name} values must fit int32")
        a = a.astype(np.int32)
    return np.ascontiguousarray(a)


def _packed_strides(st):
    """[total, H, D] element strides as [B, H, S, D] (batch stride unused: 0)."""
    return (0, st[1], st[0], st[2])


def _bshd_strides(st):
    return (st[0], st[2], st[1], st[3])


def check_varlen_shapes(q_shape, k_shape, v_shape):
    """q [total_q, Hq, D], k [total_k, Hk, D], v [total_k, Hk, Dv]."""
    for name, s in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
        if len(s) != 3:
            raise ValueError(f"{name} must have 3 dims [total, heads, head_dim] (packed), got shape {tuple(s)}")
    if v_shape[:2] != k_shape[:2]:
        raise ValueError(f"k {tuple(k_shape)} and v {tuple(v_shape)} must agree in [total_k, heads]")
    if k_shape[2] != q_shape[2]:
        raise ValueError(f"k has head_dim {k_shape[2]} but q has {q_shape[2]}")
    if k_shape[1] == 0 and q_shape[1] > 0:
        raise ValueError(f"k and v have 0 heads but q has {q_shape[1]} (each query head reads a kv head)")
    if k_shape[1] > 0 and q_shape[1] % k_shape[1]:
        raise ValueError(f"q's heads ({q_shape[1]}) are not a multiple of k's and v's heads ({k_shape[1]})")


def varlen_problem(*, q_shape, k_shape, v_shape, q_stride, k_stride, v_stride, o_stride, dtype,
                   cu_seqlens_q, cu_seqlens_k, causal=False, window=None, softcap=None,
                   scale=None, alibi=False, diag_offset=None, sinks=False, lengths_per_call=False,
                   dropout=(None, None, None)):
    """The problem of a packed batch; cu_seqlens_* int32 numpy arrays [B + 1] that the
    caller keeps alive until the plan exists (the plan copies them). lengths_per_call: a
    plan from capacities (the packed tensors' rows) that takes the prefix sums with each
    forward call (fa_forward_args); cu_seqlens_* then only give the batch. dropout:
    (dropout_p, seed, dropout_offset) as set_dropout takes them (b, i, j count within each
    sequence, docs/semantics.md, "Dropout", so the forward's plan and the backward's agree)."""
    check_varlen_shapes(q_shape, k_shape, v_shape)
    if cu_seqlens_q.shape != cu_seqlens_k.shape or cu_seqlens_q.size < 1:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must both be [batch + 1], got shapes "
                         f"{cu_seqlens_q.shape} and {cu_seqlens_k.shape}")
    B = cu_seqlens_q.size - 1
    (Tq, Hq, D), (Tk, Hk, _), Dv = q_shape, k_shape, v_shape[2]
    p = make_problem(q_dims=(B, Hq, Tq, D), k_dims=(B, Hk, Tk, D), v_dims=(B, Hk, Tk, Dv),
                     dtype=dtype, causal=causal, window=window, softcap=softcap, scale=scale,
                     alibi=alibi, diag_offset=diag_offset, sinks=sinks, takes_masks=False,
                     q_stride=_packed_strides(q_stride), k_stride=_packed_strides(k_stride),
                     v_stride=_packed_strides(v_stride), o_stride=_packed_strides(o_stride))
    set_dropout(p, *dropout)
    if lengths_per_call:
        p.lengths_per_call = _native.LENGTHS_PACKED
    else:
        p.cu_seqlens_q = cu_seqlens_q.ctypes.data
        p.cu_seqlens_k = cu_seqlens_k.ctypes.data
    return p


def check_max_seqlen(name, max_seqlen, cu):
    """FlashAttention's max_seqlen_q/k: optional here (the library needs no bound), but a
    bound below a sequence's length is the caller's mistake and is said so. An integer that
    fits int64, by the rule of every integer option (_problem._int: 4.9, "7", True and 2**70
    are refused, in every front)."""
    if max_seqlen is None:
        return
    max_seqlen = _int(name, max_seqlen)
    if cu.size < 2:
        return
    longest = int(np.max(np.diff(cu.astype(np.int64))))
    if longest > max_seqlen:
        raise ValueError(f"{name} = {max_seqlen} but a sequence has {longest} rows")


def check_decode_shapes(q_shape, kc_shape, vc_shape, new_shapes, paged):
    """q [B, Sq, Hq, D]; caches [B, S_cache, Hk, D] (or [num_pages, page_size, Hk, D]);
    new_shapes (k_new, v_new) [B, Sq, Hk, D] / [.., Dv] or None."""
    for name, s in (("q", q_shape), ("k_cache", kc_shape), ("v_cache", vc_shape)):
        if len(s) != 4:
            raise ValueError(f"{name} must have 4 dims, got shape {tuple(s)}")
    B, Sq, Hq, D = q_shape
    rows = "[num_pages, page_size, heads, head_dim]" if paged else "[batch, S_cache_max, heads, head_dim]"
    if tuple(vc_shape[:3]) != tuple(kc_shape[:3]):
        raise ValueError(f"k_cache {tuple(kc_shape)} and v_cache {tuple(vc_shape)} must agree in all but "
                         f"head_dim ({rows})")
    if not paged and kc_shape[0] != B:
        raise ValueError(f"k_cache has batch {kc_shape[0]} but q has {B}")
    if kc_shape[3] != D:
        raise ValueError(f"k_cache has head_dim {kc_shape[3]} but q has {D}")
    Hk = kc_shape[2]
    if Hk == 0 and Hq > 0:
        raise ValueError(f"the caches have 0 heads but q has {Hq} (each query head reads a kv head)")
    if Hk > 0 and Hq % Hk:
        raise ValueError(f"q's heads ({Hq}) are not a multiple of the caches' heads ({Hk})")
    if new_shapes is not None:
        want_k, want_v = (B, Sq, Hk, D), (B, Sq, Hk, vc_shape[3])
        for name, s, want, d in (("k", new_shapes[0], want_k, "D"), ("v", new_shapes[1], want_v, "Dv")):
            if tuple(s) != want:
                raise ValueError(f"new {name} must have shape [B, Sq, Hk, {d}] = {want}, got {tuple(s)}")


def check_prefix(k_prefix, v_prefix, kc_shape, vc_shape, dtype):
    """(k_prefix, v_prefix, P), the one check of every front: k_prefix and v_prefix (arrays
    or tensors of any framework: .shape, .dtype) go together, are [P, Hk, D] / [P, Hk, Dv]
    (the caches' heads and head dims) and have the problem's dtype (q's; a quantized cache's
    prefix too, which the library then refuses). An empty prefix (P = 0) is no prefix:
    (None, None, 0), as none given (the library refuses prefix pointers with no length)."""
    if (k_prefix is None) != (v_prefix is None):
        raise ValueError("k_prefix and v_prefix (the shared prefix) go together: pass both or neither")
    if k_prefix is None:
        return None, None, 0
    ks, vs = tuple(k_prefix.shape), tuple(v_prefix.shape)
    want_k, want_v = (ks[:1] or (0,)) + tuple(kc_shape[2:]), (ks[:1] or (0,)) + tuple(vc_shape[2:])
    if ks != want_k or vs != want_v:
        raise ValueError(f"k_prefix and v_prefix must be [P, Hk, D] = {want_k} and {want_v} (the caches' heads and "
                         f"head dims), got {ks} and {vs}")
    if k_prefix.dtype != dtype or v_prefix.dtype != dtype:
        raise ValueError(f"k_prefix and v_prefix must have q's dtype {dtype}, got {k_prefix.dtype} and "
                         f"{v_prefix.dtype}")
    return (k_prefix, v_prefix, ks[0]) if ks[0] else (None, None, 0)


def decode_problem(*, q_shape, kc_shape, vc_shape, q_stride, kc_stride, vc_stride, o_stride,
                   dtype, cache_seqlens, has_new_kv, max_pages=None, causal=False,
                   window=None, softcap=None, scale=None, alibi=False, sinks=False, lengths_per_call=False,
                   shared_prefix_len=0, cache_dtype=None):
    """The problem of one decoding step; cache_seqlens an int32 numpy array [B] kept alive by
    the caller until the plan exists. lengths_per_call (or cache_seqlens None): a plan from
    capacities that takes the lengths with each call (cache_seqlens, if given, is only
    checked for its shape). max_pages (the block table's width) makes it paged;
    cache_dtype (a fa_dtype code, _quant.cache_dtype_code) a quantized cache."""
    paged = max_pages is not None
    B, Sq, Hq, D = q_shape
    if cache_seqlens is not None and cache_seqlens.shape != (B,):
        raise ValueError(f"cache_seqlens must have shape [batch] = [{B}], got {cache_seqlens.shape}")
    Hk, Dv = kc_shape[2], vc_shape[3]
    Sk = max_pages * kc_shape[1] if paged else kc_shape[1]
    p = make_problem(q_dims=(B, Hq, Sq, D), k_dims=(B, Hk, Sk, D), v_dims=(B, Hk, Sk, Dv),
                     dtype=dtype, causal=causal, window=window, softcap=softcap, scale=scale,
                     alibi=alibi, sinks=sinks, q_stride=_bshd_strides(q_stride), k_stride=_bshd_strides(kc_stride),
                     v_stride=_bshd_strides(vc_stride), o_stride=_bshd_strides(o_stride))
    if cache_seqlens is None or lengths_per_call:
        p.lengths_per_call = _native.LENGTHS_CACHE
    else:
        p.cache_seqlens = cache_seqlens.ctypes.data
    p.has_new_kv = int(bool(has_new_kv))
    p.shared_prefix_len = shared_prefix_len
    if paged:
        p.page_size, p.num_pages, p.max_pages = kc_shape[1], kc_shape[0], max_pages
    if cache_dtype is not None:
        p.has_cache_dtype, p.cache_dtype = 1, cache_dtype
    return p


def cache_scale_shape(kc_shape):
    """The scales of a quantized cache: one per (row, kv head), [B, S_cache, Hk] or
    [num_pages, page_size, Hk]."""
    return tuple(kc_shape[:3])


def check_scale_dtype(name, dtype):
    """Every front's rule for a quantized cache's scales: float32 as they are, like the codes
    beside them (a conversion would round a float64 scale, turn a boolean into 1.0 or drop an
    imaginary part; torch's tensors are checked the same way)."""
    if str(dtype) != "float32":
        raise ValueError(f"{name} must be float32 (one scale per cache row and kv head), got dtype {dtype}")
