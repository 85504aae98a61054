"""The numpy front for the inference shapes: packed variable-length batches
(flashattn.varlen_attention and its backward) and kv-cache decoding
(flashattn.kvcache_attention, paged caches too), in the manner of FlashAttention's
flash_attn_varlen_func and flash_attn_with_kvcache.

Thin: arrays are mapped to the library's problem (python/flashattn/_problem_inference.py)
and every value (prefix sums, lengths, capacity, page ids) is judged by the library, whose
message comes back as ValueError."""
import numpy as np

from . import _native
from ._numpy import (_check_out, _dtype_name, _elem_strides, _empty, _floats, _grad_buffer, _readable,
                     backward_inputs, dtype_error, head_floats)
from ._problem import flag, make_options
from ._quant import cache_code_dtypes, cache_dtype_code
from ._problem_inference import (cache_scale_shape, check_decode_shapes, check_max_seqlen, check_prefix,
                                 check_scale_dtype, decode_problem, int32_lengths, varlen_problem)
from . import _layout


def _one_dtype(**arrays):
    dts = {a.dtype for a in arrays.values()}
    names = ", ".join(arrays)
    if len(dts) != 1:
        raise ValueError(f"{names} must have one dtype, got {', '.join(str(a.dtype) for a in arrays.values())}")
    name = _dtype_name(next(iter(dts)))
    if name is None:
        raise ValueError(dtype_error(names, next(iter(dts))))
    return name


def _slopes(alibi_slopes, H):
    if alibi_slopes is None:
        return None
    s = np.ascontiguousarray(_floats("alibi_slopes", alibi_slopes, f"[H] = [{H}]"))
    if s.shape != (H,):
        raise ValueError(f"alibi_slopes must have shape [H] = [{H}], got {s.shape}")
    return s


class _Varlen:
    """What both passes of a packed batch share: checked q, k, v, lengths, options."""

    def __init__(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                 window, softcap, scale, alibi_slopes, diag_offset, sinks=None, dropout=(None, None, None),
                 threads=0):
        q, k, v = (_readable(n, a, 3) for n, a in (("q", q), ("k", k), ("v", v)))
        self.dtype = _one_dtype(q=q, k=k, v=v)
        self.cu_q = int32_lengths("cu_seqlens_q", cu_seqlens_q, "[batch + 1]")
        self.cu_k = int32_lengths("cu_seqlens_k", cu_seqlens_k, "[batch + 1]")
        check_max_seqlen("max_seqlen_q", max_seqlen_q, self.cu_q)
        check_max_seqlen("max_seqlen_k", max_seqlen_k, self.cu_k)
        self.q, self.k, self.v = q, k, v
        self.slopes = _slopes(alibi_slopes, q.shape[1])
        self.sinks = head_floats("sinks", sinks, q.shape[1])
        self.opts = dict(causal=causal, window=window, softcap=softcap, scale=scale,
                         alibi=alibi_slopes is not None, diag_offset=diag_offset, sinks=sinks is not None,
                         dropout=dropout)
        self.threads = threads

    def o_shape(self):
        return self.q.shape[:2] + (self.v.shape[2],)

    def totals(self):
        """The rows and keys the prefix sums reach (at most the packed tensors' rows)."""
        return tuple(int(cu[-1]) if cu.size else 0 for cu in (self.cu_q, self.cu_k))

    def plan(self, o_stride, q=None, k=None, v=None, per_call=False):
        """per_call: the forward's plan from the packed tensors' rows, reused for every call
        of those shapes, the prefix sums passed with each (forward_args); else a plan of
        these prefix sums (the backward's), over the rows they reach."""
        q = self.q if q is None else q
        k = self.k if k is None else k
        v = self.v if v is None else v
        if not per_call:  # views of the rows the sums reach: same data, the plan's exact lengths
            tq, tk = self.totals()
            q, k, v = q[:tq], k[:tk], v[:tk]
        p = varlen_problem(q_shape=q.shape, k_shape=k.shape, v_shape=v.shape,
                           q_stride=_elem_strides(q), k_stride=_elem_strides(k),
                           v_stride=_elem_strides(v), o_stride=o_stride, dtype=self.dtype,
                           cu_seqlens_q=self.cu_q, cu_seqlens_k=self.cu_k, lengths_per_call=per_call, **self.opts)
        return _native.cached_plan(p, make_options("cpu", self.threads))

    def length_ptrs(self):
        return dict(cu_seqlens_q=self.cu_q.ctypes.data, cu_seqlens_k=self.cu_k.ctypes.data)

    def slopes_ptr(self):
        return None if self.slopes is None else self.slopes.ctypes.data

    def head_ptrs(self):
        """The per-head arrays both passes pass: slopes and sinks."""
        return dict(alibi_slopes=self.slopes_ptr(), sinks=None if self.sinks is None else self.sinks.ctypes.data)


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, *,
                     causal=False, window=None, softcap=None, scale=None, alibi_slopes=None,
                     diag_offset=None, return_lse=False, out=None, sinks=None, dropout_p=None, seed=None,
                     dropout_offset=None, threads=0):
    """Attention over a packed batch of sequences of different lengths.

    q [total_q, Hq, D], k [total_k, Hk, D], v [total_k, Hk, Dv], one dtype (float32,
    float16, ml_dtypes.bfloat16); cu_seqlens_q, cu_seqlens_k int [batch + 1], prefix sums
    from 0 to total_q and total_k: sequence b is q rows cu_seqlens_q[b]:cu_seqlens_q[b+1]
    against k/v rows cu_seqlens_k[b]:cu_seqlens_k[b+1] (empty sequences allowed). Every mask
    applies within each sequence, aligned bottom-right at its own Sk_b - Sq_b (diag_offset
    overrides, as in attention). max_seqlen_q/k (FlashAttention's) are optional; when given
    they must bound every length. Returns o [total_q, Hq, Dv] (into out if given), and lse
    [Hq, total_q] f32 with return_lse (FlashAttention's softmax_lse layout). sinks [Hq]: as
    in attention. dropout_p, seed, dropout_offset: as in attention, b, i and j counting
    within each sequence (varlen_attention_backward regenerates the mask).

    Lengths per call: the rows of q, k and v are capacities. The prefix sums may end below
    them (rows past cu_seqlens_q[-1] get o = 0 and lse = -inf; keys past cu_seqlens_k[-1]
    are not read), and one plan, made from the tensors' shapes, serves every call of those
    shapes whatever its lengths (the library checks each call's)."""
    return_lse = flag("return_lse", return_lse)
    c = _Varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window,
                softcap, scale, alibi_slopes, diag_offset, sinks, (dropout_p, seed, dropout_offset), threads)
    shape = c.o_shape()
    inputs = (("q", q), ("k", k), ("v", v), ("alibi_slopes", alibi_slopes), ("sinks", sinks))
    o = _empty(shape, c.q.dtype) if out is None else _check_out("out", out, shape, c.q.dtype, inputs)
    lse = _empty((c.q.shape[1], c.q.shape[0]), np.float32)
    handle = c.plan(_elem_strides(o), per_call=True)
    handle.forward(_native.ForwardArgs(q=c.q.ctypes.data, k=c.k.ctypes.data, v=c.v.ctypes.data,
                                       o=o.ctypes.data, lse=lse.ctypes.data, **c.head_ptrs(), **c.length_ptrs()))
    tq = c.totals()[0]  # rows of no sequence, which the library does not touch
    o[tq:], lse[:, tq:] = 0, -np.inf
    return (o, lse) if return_lse else o


def varlen_attention_backward(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None,
                              max_seqlen_k=None, *, causal=False, window=None, softcap=None,
                              scale=None, alibi_slopes=None, diag_offset=None, sinks=None, dropout_p=None,
                              seed=None, dropout_offset=None, threads=0):
    """Gradients of sum(o * do) for varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, ...)
    with the same options, from its o and lse [Hq, total_q]. Returns (dq, dk, dv) shaped and
    strided like q, k, v (dk, dv summed over the query heads that share them), and dsink
    (f32 [Hq], summed over every packed row) last with sinks. Rows and keys past the prefix
    sums' ends (see varlen_attention) get zero gradients. dropout_p, seed, dropout_offset:
    the forward's, whose keep mask the backward regenerates. threads: as in varlen_attention."""
    c = _Varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window,
                softcap, scale, alibi_slopes, diag_offset, sinks, (dropout_p, seed, dropout_offset), threads)
    shape = c.o_shape()
    o, do = _readable("o", o, 3), _readable("do", do, 3)
    o, do, lse = backward_inputs(o, do, lse, shape, c.q.dtype, (c.q.shape[1], c.q.shape[0]), "[Hq, total_q]")
    q, dq = _grad_buffer(c.q)
    k, dk = _grad_buffer(c.k)
    v, dv = _grad_buffer(c.v)
    dsink = None if c.sinks is None else _empty(c.sinks.shape, np.float32)
    grads = (dq, dk, dv) + (() if dsink is None else (dsink,))
    tq, tk = c.totals()
    if tq < lse.shape[1]:  # the plan's lse is [Hq, tq]
        lse = np.ascontiguousarray(lse[:, :tq])
    handle = c.plan(_elem_strides(o), q=q, k=k, v=v)
    for g, t in ((dq, tq), (dk, tk), (dv, tk)):
        g[t:] = 0
    handle.backward(_native.BackwardArgs(q=q.ctypes.data, k=k.ctypes.data, v=v.ctypes.data,
                                         o=o.ctypes.data, d_o=do.ctypes.data, lse=lse.ctypes.data,
                                         dq=dq.ctypes.data, dk=dk.ctypes.data, dv=dv.ctypes.data,
                                         dsink=None if dsink is None else dsink.ctypes.data, **c.head_ptrs()))
    return grads


def cache_lengths(cache_seqlens, batch, capacity):
    """FlashAttention's cache_seqlens: None (every cache full), an int (the same for every
    sequence) or an array [batch]; as int32 [batch]."""
    if cache_seqlens is None:
        return np.full(batch, capacity, np.int32)
    if np.ndim(cache_seqlens) == 0:
        n = np.asarray(cache_seqlens)
        if n.dtype.kind not in "iu":
            raise ValueError(f"cache_seqlens must be an integer or integers [batch], got {cache_seqlens!r}")
        if not -(2**31) <= int(n) < 2**31:
            raise ValueError(f"cache_seqlens values must fit int32, got {int(n)}")
        return np.full(batch, int(n), np.int32)
    return int32_lengths("cache_seqlens", cache_seqlens, f"[batch] = [{batch}]")


def _writable_cache(name, a):
    """A cache the library writes new rows into: through its own strides, never a copy."""
    if not isinstance(a, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.size == 0:  # nothing to write (numpy gives empty arrays any strides, zeros too)
        return a
    if any(x < 0 for x in a.strides):  # named, as out= names it
        raise ValueError(f"{name} is written in place (new k and v given), so it must have non-negative strides "
                         f"(the library's strides are >= 0), got strides {a.strides}")
    st = _elem_strides(a)
    if not a.flags.writeable or not a.flags.aligned or st is None or not _layout.writable_strides(a.shape, st):
        raise ValueError(f"{name} is written in place (new k and v given), so it must be a writable, "
                         f"aligned array whose elements do not overlap (strides {a.strides})")
    return a


def _prefix(k_prefix, v_prefix, k_cache, v_cache, dtype):
    """The shared prefix's k and v [P, Hk, D] / [P, Hk, Dv], contiguous, or (None, None)."""
    if k_prefix is not None and v_prefix is not None:
        k_prefix, v_prefix = (_readable(n, a, 3) for n, a in (("k_prefix", k_prefix), ("v_prefix", v_prefix)))
    k_prefix, v_prefix, _ = check_prefix(k_prefix, v_prefix, k_cache.shape, v_cache.shape, dtype)
    if k_prefix is None:
        return None, None
    return np.ascontiguousarray(k_prefix), np.ascontiguousarray(v_prefix)


def _cache_scales(name, s, shape, written):
    """A quantized cache's scales: float32 [rows..., Hk] dense; written in place on append."""
    if s is None:
        raise ValueError(f"{name} is required with a quantized cache_dtype (one float32 per cache row and kv head, "
                         f"shape {shape})")
    if not isinstance(s, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(s).__name__}")
    if tuple(s.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} (the cache's rows and kv heads), got {tuple(s.shape)}")
    check_scale_dtype(name, s.dtype)
    if written and s.size:
        if not s.flags.c_contiguous or not s.flags.writeable:
            raise ValueError(f"{name} is written in place (new k and v given), so it must be a writable, "
                             f"C-contiguous float32 array, got " +
                             ("a read-only array" if not s.flags.writeable else f"strides {s.strides}"))
        return s
    return np.ascontiguousarray(s)


def kvcache_attention(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None, *,
                      causal=False, window=None, softcap=None, scale=None, alibi_slopes=None,
                      return_lse=False, out=None, sinks=None, k_prefix=None, v_prefix=None, cache_dtype=None,
                      k_scale=None, v_scale=None, threads=0):
    """One decoding step against a kv cache, in the manner of flash_attn_with_kvcache.

    q [B, Sq_new, Hq, D]; k_cache [B, S_cache_max, Hk, D] and v_cache [.., Dv], or with
    block_table (int [B, max_pages]) paged caches [num_pages, page_size, Hk, D] where
    position t of sequence b is row t % page_size of page block_table[b, t // page_size]
    (page_size a multiple of 16). cache_seqlens (int [B], an int, or None for full caches):
    the tokens already cached per sequence, 0 allowed. With k and v ([B, Sq_new, Hk, D]
    and [.., Dv]) the new tokens are written into k_cache and v_cache in place at positions
    cache_seqlens[b].. first (every argument is checked before anything is written: after an
    error the caches are as they were); sequence b then attends to its first
    cache_seqlens[b] + Sq_new positions, else to cache_seqlens[b]. Masks align bottom-right per
    sequence (causal: new token i sees positions <= cache_seqlens[b] + i). Cache rows past a
    sequence's length are never read. Returns o [B, Sq_new, Hq, Dv] (into out if given) and
    lse [B, Hq, Sq_new] f32 with return_lse. sinks [Hq]: as in attention (the split-KV
    chunks merge without it; it joins once). Forward only.

    k_prefix, v_prefix [P, Hk, D] / [.., Dv] (a shared prefix, cascade): every sequence first
    attends to these P keys (positions 0 .. P - 1), then to its own cache at positions P + t;
    the call reads the prefix once for all sequences. Masks align bottom-right over both.

    cache_dtype "int8" or "fp8" (docs/caches.md): the caches hold 1-byte codes (int8, or
    fp8 e4m3fn as ml_dtypes.float8_e4m3fn or its uint8 bits; flashattn.quantize_cache
    makes them) and k_scale, v_scale (float32, the caches' shape without head_dim) one scale
    per row and kv head; new k and v (in q's dtype) are quantized on append, their scales
    written into k_scale and v_scale.

    threads: CPU threads for this call (0 or None: the library's default), as in attention."""
    return_lse = flag("return_lse", return_lse)
    q = _readable("q", q)
    if (k is None) != (v is None):
        raise ValueError("k and v (the new tokens) go together: pass both or neither")
    has_new = k is not None
    if has_new:
        k_cache, v_cache = _writable_cache("k_cache", k_cache), _writable_cache("v_cache", v_cache)
    k_cache, v_cache = _readable("k_cache", k_cache), _readable("v_cache", v_cache)
    arrays = dict(q=q, k_cache=k_cache, v_cache=v_cache)
    if has_new:
        k, v = _readable("k", k), _readable("v", v)
        arrays.update(k=k, v=v)
        k, v = np.ascontiguousarray(k), np.ascontiguousarray(v)  # the library reads them dense
    code = cache_dtype_code(cache_dtype)
    if code is not None:
        want = cache_code_dtypes(code)
        for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
            if c.dtype not in want:
                raise ValueError(f"{name} must hold {' or '.join(str(w) for w in want)} codes with "
                                 f"cache_dtype={cache_dtype!r}, got {c.dtype}")
        del arrays["k_cache"], arrays["v_cache"]
        shp = cache_scale_shape(k_cache.shape)
        k_scale = _cache_scales("k_scale", k_scale, shp, has_new)
        v_scale = _cache_scales("v_scale", v_scale, shp, has_new)
    elif k_scale is not None or v_scale is not None:
        raise ValueError("k_scale and v_scale belong to a quantized cache: pass cache_dtype='int8' or 'fp8'")
    if has_new:  # an append writes both caches (and both scale arrays): they must not overlap
        written = [("k_cache", k_cache), ("v_cache", v_cache)]
        if code is not None:
            written += [("k_scale", k_scale), ("v_scale", v_scale)]
        for i, (na, a) in enumerate(written):
            for nb, b in written[i + 1:] + [("q", q), ("k", k), ("v", v)]:
                if np.may_share_memory(a, b) and np.shares_memory(a, b):
                    raise ValueError(f"{na} and {nb} share memory, and the call writes {na} (new k and v given): "
                                     f"pass separate arrays")
    dtype = _one_dtype(**arrays)
    paged = block_table is not None
    check_decode_shapes(q.shape, k_cache.shape, v_cache.shape, (k.shape, v.shape) if has_new else None, paged)
    B = q.shape[0]
    table = None
    if paged:
        table = int32_lengths("block_table", block_table, "[batch, max_pages]", ndim=2)
        if table.shape[0] != B:
            raise ValueError(f"block_table must have shape [batch, max_pages] with batch = {B}, got {table.shape}")
    capacity = table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    lens = cache_lengths(cache_seqlens, B, capacity)
    shape = q.shape[:3] + (v_cache.shape[3],)
    inputs = (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v),
              ("alibi_slopes", alibi_slopes), ("sinks", sinks))
    o = _empty(shape, q.dtype) if out is None else _check_out("out", out, shape, q.dtype, inputs)
    lse = _empty((B, q.shape[2], q.shape[1]), np.float32)
    slopes = _slopes(alibi_slopes, q.shape[2])
    sink_arr = head_floats("sinks", sinks, q.shape[2])
    kp, vp = _prefix(k_prefix, v_prefix, k_cache, v_cache, q.dtype)
    p = decode_problem(q_shape=q.shape, kc_shape=k_cache.shape, vc_shape=v_cache.shape,
                       q_stride=_elem_strides(q), kc_stride=_elem_strides(k_cache),
                       vc_stride=_elem_strides(v_cache), o_stride=_elem_strides(o), dtype=dtype,
                       cache_seqlens=lens, has_new_kv=has_new, max_pages=None if table is None else table.shape[1],
                       causal=causal, window=window, softcap=softcap, scale=scale,
                       alibi=slopes is not None, sinks=sink_arr is not None, lengths_per_call=True,
                       shared_prefix_len=0 if kp is None else kp.shape[0], cache_dtype=code)
    # one plan for every step of a decode loop: made from capacities, the lengths go with the call
    handle = _native.cached_plan(p, make_options("cpu", threads))
    ptr = lambda a: None if a is None else a.ctypes.data  # noqa: E731
    handle.forward(_native.ForwardArgs(q=ptr(q), k=ptr(k_cache), v=ptr(v_cache), o=ptr(o),
                                       lse=ptr(lse), alibi_slopes=ptr(slopes), k_new=ptr(k),
                                       v_new=ptr(v), block_table=ptr(table), sinks=ptr(sink_arr),
                                       cache_seqlens=ptr(lens), k_prefix=ptr(kp), v_prefix=ptr(vp),
                                       k_scale=ptr(k_scale), v_scale=ptr(v_scale)))
    return (o, lse) if return_lse else o
