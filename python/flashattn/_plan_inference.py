"""flashattn.plan_varlen and flashattn.plan_kvcache: the analytic cost of the inference
shapes from their lengths and shapes (no tensors), as flashattn.plan gives the dense one.
The lengths are plan inputs (docs/semantics.md): the plan reads them once, in O(batch)."""
import numpy as np

from . import _native
from ._plan import Plan
from ._problem import _int, make_options, public_dtype
from ._problem_inference import decode_problem, int32_lengths, varlen_problem
from ._quant import cache_dtype_code

_DENSE = (0, 0, 0, 0)  # all-zero strides: the library's default packed / cache layouts


def plan_varlen(cu_seqlens_q, cu_seqlens_k, *, heads, head_dim, kv_heads=None, head_dim_v=None,
                dtype="f32", causal=False, window=(-1, -1), softcap=0.0, scale=None, alibi=False,
                diag_offset=None, backend="auto", threads=0, block_q=0, block_k=0, batch=None, total_q=None,
                total_k=None, sinks=False):
    """The Plan of varlen_attention over a packed batch: cu_seqlens_q, cu_seqlens_k int
    [batch + 1] prefix sums; q [total_q, heads, head_dim], k [total_k, kv_heads, head_dim],
    v [total_k, kv_heads, head_dim_v]. The cost is the sum of the sequences' own costs, for
    the forward and the backward. Bad lengths raise ValueError with the library's message.

    Or cu_seqlens_q and cu_seqlens_k None with batch, total_q and total_k (default total_q):
    the plan from capacities that varlen_attention's forward reuses for every call of those
    shapes (lengths per call). Its figures are the largest any call can have (every row and
    key in one sequence); plan.cost_lengths(cu_seqlens_q=, cu_seqlens_k=) is one call's
    exact cost (prefix sums ending at or below the capacities). sinks: the calls have attention
    sinks (one more exp per row; dsink in the backward), as flashattn.plan's."""
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k go together: pass both or neither")
    per_call = cu_seqlens_q is None
    capacities = (batch, total_q, total_k)
    if (per_call and (batch is None or total_q is None)) or (not per_call and capacities != (None,) * 3):
        raise ValueError("give cu_seqlens_q and cu_seqlens_k (a plan of those lengths) or batch, total_q and "
                         "total_k (lengths per call), not both")
    if per_call:
        total_k = total_q if total_k is None else total_k
        batch = _int("batch", batch)
        if batch < 0:
            raise ValueError(f"batch = {batch} is negative")
        if batch >= 2**31 - 1:  # before the arrays below: cu_seqlens are int32 [batch + 1]
            raise ValueError(f"batch = {batch} is too large: cu_seqlens_q and cu_seqlens_k are int32 [batch + 1]")
        cu_q = cu_k = np.zeros(batch + 1, np.int32)  # only their size counts: the batch
        tq, tk = total_q, total_k
    else:
        cu_q = int32_lengths("cu_seqlens_q", cu_seqlens_q, "[batch + 1]")
        cu_k = int32_lengths("cu_seqlens_k", cu_seqlens_k, "[batch + 1]")
        tq, tk = (int(cu[-1]) if cu.size else 0 for cu in (cu_q, cu_k))
    kv_heads = heads if kv_heads is None else kv_heads
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    p = varlen_problem(q_shape=(tq, heads, head_dim), k_shape=(tk, kv_heads, head_dim),
                       v_shape=(tk, kv_heads, head_dim_v), q_stride=(0, 0, 0), k_stride=(0, 0, 0),
                       v_stride=(0, 0, 0), o_stride=(0, 0, 0), dtype=public_dtype(dtype), cu_seqlens_q=cu_q,
                       cu_seqlens_k=cu_k, causal=causal, window=window, softcap=softcap, scale=scale,
                       alibi=alibi, diag_offset=diag_offset, sinks=bool(sinks), lengths_per_call=per_call)
    return Plan(_native.plan_handle(p, make_options(backend, threads, block_q, block_k)))


def plan_kvcache(cache_seqlens, *, seq_q, heads, head_dim, cache_len=None, kv_heads=None,
                 head_dim_v=None, new_kv=False, page_size=None, num_pages=None, max_pages=None,
                 dtype="f32", causal=False, window=(-1, -1), softcap=0.0, scale=None, alibi=False,
                 backend="auto", threads=0, batch=None, cache_dtype=None, sinks=False, prefix_len=0):
    """The Plan of one kvcache_attention step: cache_seqlens int [batch], or None with batch=
    for a plan from capacities (lengths per call: its figures are those of full caches, and
    plan.cost_lengths(cache_seqlens) gives a step's exact cost); q [batch, seq_q,
    heads, head_dim]; caches [batch, cache_len, kv_heads, head_dim] (head_dim_v for v), or
    paged: page_size, num_pages and max_pages (the block table's width) instead of
    cache_len; new_kv: seq_q new tokens are appended. Forward only (.backward is None). Its
    bytes are the cache bytes read: decoding is bound by them, not flops.
    cache_dtype "int8" or "fp8": a quantized cache (1-byte codes and an f32 scale per row
    and kv head, docs/caches.md). sinks: the steps have attention sinks; prefix_len: the
    keys of a shared prefix (k_prefix, v_prefix) every sequence attends to first."""
    if (cache_seqlens is None) == (batch is None):
        raise ValueError("give cache_seqlens (a plan of those lengths) or batch (lengths per call), not both")
    lens = None if cache_seqlens is None else int32_lengths("cache_seqlens", cache_seqlens, "[batch]")
    B = batch if lens is None else lens.size
    kv_heads = heads if kv_heads is None else kv_heads
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    paged = page_size is not None
    if paged == (cache_len is not None):
        raise ValueError("give cache_len (dense caches) or page_size, num_pages and max_pages (paged), not both")
    if paged and (num_pages is None or max_pages is None):
        raise ValueError("paged caches need page_size, num_pages and max_pages")
    rows = (num_pages, page_size) if paged else (B, cache_len)
    p = decode_problem(q_shape=(B, seq_q, heads, head_dim), kc_shape=rows + (kv_heads, head_dim),
                       vc_shape=rows + (kv_heads, head_dim_v), q_stride=_DENSE, kc_stride=_DENSE,
                       vc_stride=_DENSE, o_stride=_DENSE, dtype=public_dtype(dtype), cache_seqlens=lens,
                       has_new_kv=new_kv, max_pages=max_pages if paged else None, causal=causal,
                       window=window, softcap=softcap, scale=scale, alibi=alibi,
                       cache_dtype=cache_dtype_code(cache_dtype), sinks=bool(sinks),
                       shared_prefix_len=_int("prefix_len", prefix_len))
    return Plan(_native.plan_handle(p, make_options(backend, threads)))
