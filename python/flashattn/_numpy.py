"""The numpy front: flashattn.attention and flashattn.attention_backward on host arrays.

Arrays go to the library as pointers with their own strides (no copies) whenever the
strides describe them; outputs come back in the inputs' layout, lse always [B, H, S]."""
import numpy as np

from . import _layout, _native
from .masks import Mask, build_for_call
from ._problem import (broadcast_dims, check_not_masked, check_real, check_shapes, combined_bias_dims, empty_dims,
                       flag, fold_bias_scale, make_options, make_problem)
from ._problem_inference import int32_lengths


def _empty(shape, dtype):
    a = np.empty(shape, dtype)
    if _native.POISON:
        a[...] = np.nan
    return a


def _dtype_name(dt):
    if dt == np.float32:
        return "f32"
    if dt == np.float16:
        return "f16"
    if dt.name == "bfloat16" and dt.isnative:  # ml_dtypes.bfloat16 (its other byte order is named alike)
        return "bf16"
    return None


def _elem_strides(a):
    size = a.itemsize
    if any(s % size for s in a.strides):
        return None
    return tuple(s // size for s in a.strides)


def _readable(name, a, ndim=4):
    """a as an ndarray whose strides the library can take; copies only where they cannot
    describe it (negative or misaligned strides, all-zero broadcasts)."""
    if not isinstance(a, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(a).__name__}")
    check_not_masked(name, a)
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {a.shape}")
    st = _elem_strides(a)
    if st is None or not a.flags.aligned or not _layout.passes_as_is(a.shape, st):
        a = _fresh(a)
    return a


def _fresh(a):
    """A C-order copy with the canonical strides (np.ascontiguousarray returns a view as it
    is where numpy deems it contiguous, keeping a size-1 or size-0 dim's negative or odd
    stride, which the library refuses)."""
    return np.array(a, order="C", copy=True)


def _floats(name, a, shape_desc):
    """bias, slopes: float32, converted from other real dtypes (a copy) where needed
    (_problem.check_real: every front's rule)."""
    check_not_masked(name, a)
    a = np.asarray(a)
    check_real(name, a.dtype, shape_desc)
    if a.dtype != np.float32:
        a = a.astype(np.float32)
    return a


def head_floats(name, a, H):
    """alibi_slopes, sinks: float32 [H], contiguous (the library checks they are finite)."""
    if a is None:
        return None
    s = _floats(name, a, f"[H] = [{H}]")
    if s.shape != (H,):  # the shape as given (np.ascontiguousarray makes a 0-d one (1,))
        raise ValueError(f"{name} must have shape [H] = [{H}], got {s.shape}")
    return np.ascontiguousarray(s)


def _segments(name, a, batch, seq):
    a = int32_lengths(name, a, f"[B, S] = [{batch}, {seq}]", ndim=2)
    if a.shape != (batch, seq):
        raise ValueError(f"{name} must have shape [B, S] = [{batch}, {seq}], got {a.shape}")
    return a


def _bias_and_mask(bias, mask, dims, bias_scale):
    """The library's bias for a bias and a boolean mask (True: attend; a hidden key is a
    -inf bias entry, docs/nonfinite.md), the bias's own 4-dim shape (None without one) and
    the bias_scale the library gets (with a mask, none: the scale is applied here,
    _problem.fold_bias_scale). Size-1 B and H dims stay broadcast by the library; size-1
    Sq and Sk dims become stride-0 views, which the library reads without a copy (only an
    all-size-1 bias, whose strides would all be 0, meaning "contiguous" to the library, is
    materialized)."""
    B, H, Sq, Sk = dims
    own = b = None
    if bias is not None:
        b = _floats("bias", bias, f"[B or 1, H or 1, {Sq} or 1, {Sk} or 1]")
        own = broadcast_dims("bias", b.shape, *dims)
        b = b.reshape(own)
    b, bias_scale = fold_bias_scale(b, bias_scale, mask is not None)
    if mask is not None:
        check_not_masked("mask", mask)
        m = np.asarray(mask)
        if m.dtype != np.bool_:
            raise TypeError(f"mask must be a boolean array (True: attend), got dtype {m.dtype}; "
                            "an additive mask goes to bias=")
        m = np.where(m.reshape(broadcast_dims("mask", m.shape, *dims)), np.float32(0), np.float32(-np.inf))
        # where, not b + m: a NaN or inf bias at a key the mask hides stays hidden (b + -inf is NaN)
        b = m if bias is None else np.where(m == 0, b, m).astype(np.float32)
    full = combined_bias_dims(own, None if mask is None else np.shape(mask), *dims)
    return _readable("bias", np.broadcast_to(b, full)), own, bias_scale


def _sizes_first(layout, q, k, v):
    """The library's verdict on the problem's sizes before anything is copied or allocated:
    a stride-0 view of 2**40 rows was copied (256 TiB), or o reserved, before it was asked.
    Shapes alone, contiguous, f32 (the widest dtype: what passes here passes for any);
    shapes that disagree are left to the checks after, which name the tensors. Only where a
    tensor has 2**31 elements or more: below that no size can be refused and nothing large is
    allocated, and the extra plan key cost a small call 15% (16 of 113 µs)."""
    shapes = [np.shape(a) for a in (q, k, v)]
    if any(len(s) != 4 for s in shapes) or all(int(np.prod(s, dtype=np.float64)) < 2**31 for s in shapes):
        return
    qd, kd, vd = (_layout.to_bhsd(layout, s) for s in shapes)
    try:
        check_shapes(qd, kd, vd)
    except ValueError:
        return
    _native.cached_plan(make_problem(q_dims=qd, k_dims=kd, v_dims=vd, dtype="f32"), make_options("cpu", 0))


class _Call:
    """What both passes share: the checked q, k, v, the options' arrays, the problem."""

    def __init__(self, q, k, v, causal, window, softcap, scale, bias, alibi_slopes,
                 q_segment_ids, kv_segment_ids, layout, bias_scale=None, diag_offset=None, mask=None,
                 threads=0, sinks=None, dropout=(None, None, None)):
        self.layout = _layout.check_layout(layout)
        _sizes_first(self.layout, q, k, v)
        q, k, v = (_readable(n, a) for n, a in (("q", q), ("k", k), ("v", v)))
        if not (q.dtype == k.dtype == v.dtype):
            raise ValueError(f"q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
        self.dtype = _dtype_name(q.dtype)
        if self.dtype is None:
            raise ValueError(dtype_error("q, k, v", q.dtype))
        self.q, self.k, self.v = q, k, v
        L = self.layout
        qd, kd, vd = (_layout.to_bhsd(L, a.shape) for a in (q, k, v))
        check_shapes(qd, kd, vd)
        self.qd, self.kd, self.vd = qd, kd, vd
        B, H, Sq, _ = qd
        Sk = kd[2]
        self.bias = self.bias_own = None
        bias_shape = bias_stride = None
        # dbias = grad_scale * the library's (with a mask, bias_scale is applied to the bias here)
        self.grad_scale = None
        # a flashattn.masks mask goes to the library as a built fa_mask, kept alive by the call
        # (a zero-size call computes nothing: its mask is only checked)
        self.mask = None
        if isinstance(mask, Mask):
            self.mask = build_for_call(mask, B, H, Sq, Sk, diag_offset=diag_offset, empty=empty_dims(B, H, kd[1], Sq, Sk))
            mask = None
        if bias is not None or mask is not None:
            b, self.bias_own, lib_scale = _bias_and_mask(bias, mask, (B, H, Sq, Sk), bias_scale)
            if lib_scale is None and bias_scale is not None:
                self.grad_scale = float(bias_scale)
            bias_scale = lib_scale
            self.bias, bias_shape, bias_stride = b, b.shape, _elem_strides(b)
        self.threads = threads
        self.slopes = None
        if alibi_slopes is not None:
            s = np.ascontiguousarray(_floats("alibi_slopes", alibi_slopes, f"[H] = [{H}]"))
            if s.shape != (H,):
                raise ValueError(f"alibi_slopes must have shape [H] = [{H}], got {s.shape}")
            self.slopes = s
        if (q_segment_ids is None) != (kv_segment_ids is None):
            raise ValueError("q_segment_ids and kv_segment_ids go together: pass both or neither")
        self.sinks = head_floats("sinks", sinks, H)
        self.qseg = self.kvseg = None
        if q_segment_ids is not None:
            self.qseg = _segments("q_segment_ids", q_segment_ids, B, Sq)
            self.kvseg = _segments("kv_segment_ids", kv_segment_ids, B, Sk)
        self.opts = dict(causal=causal, window=window, softcap=softcap, scale=scale,
                         bias_shape=bias_shape, bias_stride=bias_stride,
                         alibi=alibi_slopes is not None, segment_ids=q_segment_ids is not None,
                         bias_scale=bias_scale, diag_offset=diag_offset, sinks=sinks is not None,
                         dropout_p=dropout[0], seed=dropout[1], dropout_offset=dropout[2],
                         mask=None if self.mask is None else self.mask.ptr)

    def o_shape(self):
        B, H, Sq, _ = self.qd
        return _layout.from_bhsd(self.layout, (B, H, Sq, self.vd[3]))

    def plan(self, o_stride, bias_grad=False, q=None, k=None, v=None):
        L = self.layout
        q = self.q if q is None else q
        k = self.k if k is None else k
        v = self.v if v is None else v
        p = make_problem(q_dims=self.qd, k_dims=self.kd, v_dims=self.vd, dtype=self.dtype,
                         q_stride=_layout.to_bhsd(L, _elem_strides(q)),
                         k_stride=_layout.to_bhsd(L, _elem_strides(k)),
                         v_stride=_layout.to_bhsd(L, _elem_strides(v)),
                         o_stride=_layout.to_bhsd(L, o_stride), bias_grad=bias_grad, **self.opts)
        return _native.cached_plan(p, make_options("cpu", self.threads))

    def common_ptrs(self):
        ptr = lambda a: None if a is None else a.ctypes.data  # noqa: E731
        return dict(bias=ptr(self.bias), alibi_slopes=ptr(self.slopes),
                    q_segment_ids=ptr(self.qseg), kv_segment_ids=ptr(self.kvseg), sinks=ptr(self.sinks))

    def empty_lse(self, lse):
        """lse of rows that see no key: -inf, or with sinks each head's sink."""
        lse[...] = -np.inf if self.sinks is None else self.sinks[None, :, None]


def dtype_error(names, dtype):
    """The message for arrays of a dtype the library does not compute in, naming that dtype."""
    dt = np.dtype(dtype)
    want = f"{names} must be float32, float16 or bfloat16 (ml_dtypes.bfloat16) in native byte order, got {dt}"
    x = names.split(",")[0]  # the first array named, for the example
    if not dt.isnative and _dtype_name(dt.newbyteorder("=")) is not None:
        return (f"{want} ({'big' if dt.byteorder == '>' else 'little'}-endian {dt.newbyteorder('=')}): convert "
                f"first, e.g. {x}.astype({x}.dtype.newbyteorder('='))")
    if dt.kind == "f" and dt.itemsize > 4:
        return (f"{want}: the library has no {dt.newbyteorder('=')} kernels (it accumulates in float32); cast "
                f"first, e.g. {x}.astype(np.float32)")
    return f"{want}: cast first, e.g. {x}.astype(np.float32)"


def _check_out(name, out, shape, dtype, inputs=()):
    """out= as the library may write it; inputs (name, array) it must not overlap, since the
    library reads them while it writes out."""
    if not isinstance(out, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(out).__name__}")
    if out.shape != shape or out.dtype != dtype:
        raise ValueError(f"{name} must be {dtype} of shape {shape}, got {out.dtype} of shape {out.shape}")
    st = _elem_strides(out)
    if any(s < 0 for s in out.strides):
        raise ValueError(f"{name} must have non-negative strides (the library's strides are >= 0), got strides "
                         f"{out.strides}; pass a view without reversed dims, or a fresh array")
    if not out.flags.writeable or not out.flags.aligned or st is None or not _layout.writable_strides(shape, st):
        raise ValueError(f"{name} must be a writable, aligned array whose elements do not overlap "
                         f"(strides {out.strides})")
    for other, a in inputs:
        if a is not None and np.shares_memory(out, a):
            raise ValueError(f"{name} overlaps {other} in memory: the library reads {other} while it writes "
                             f"{name}; pass a separate array")
    return out


def attention(q, k, v, *, causal=False, window=None, softcap=None, scale=None, bias=None,
              alibi_slopes=None, q_segment_ids=None, kv_segment_ids=None, layout="bhsd",
              return_lse=False, out=None, bias_scale=None, diag_offset=None, mask=None, threads=0,
              sinks=None, dropout_p=None, seed=None, dropout_offset=None):
    """Exact attention softmax(scale * q k^T [+ bias, masks]) v on the CPU.

    q [B, Hq, Sq, D], k [B, Hk, Sk, D], v [B, Hk, Sk, Dv] (layout "bhsd"), or [B, S, H, D]
    each with layout="bshd"; float32, float16 or ml_dtypes.bfloat16, one dtype. Hq a multiple
    of Hk (GQA/MQA). Masks align bottom-right (causal: key j <= i + Sk - Sq). window (left,
    right), -1 unbounded; softcap > 0: cap * tanh(s / cap); bias f32, broadcastable to
    [B or 1, Hq or 1, Sq or 1, Sk or 1] (a boolean bias raises TypeError: see mask);
    mask: boolean, broadcastable the same way, True = attend, combined by AND with causal,
    window and segment ids (passed as a 0 / -inf bias), or a flashattn.masks mask (built by
    the library as a block-sparse mask: empty blocks skipped, the plan exact); alibi_slopes [Hq]; segment ids
    [B, Sq] and [B, Sk]. threads: CPU threads for this call (0 or None: the library's default).
    sinks [Hq] (finite): a per-head logit in each row's softmax denominator that adds
    nothing to o (docs/semantics.md, "Attention sinks"); lse then includes it.
    Returns o in q's layout (written into out if given; out must not overlap an input), and
    lse [B, Hq, Sq] f32 with return_lse. A zero B, H, Sq or Sk gives empty arrays, or
    o = 0 and lse = -inf where Sk is 0 (the library's empty problems). Beyond the issue's signature:
    bias_scale (s += bias_scale * bias) and diag_offset (query i sits at key position
    i + diag_offset; 0 aligns masks top-left). dropout_p in [0, 1) with seed (an unsigned
    64-bit integer; dropout_offset selects another stream of it) drops each weight after the
    softmax with a keep mask that is a function of (seed, offset, b, h, i, j) alone
    (docs/semantics.md, "Dropout"; dropout_keep_mask gives it), scaling the kept ones by
    1 / (1 - dropout_p); lse stays the undropped normalizer. Pass the same values to
    attention_backward."""
    return_lse = flag("return_lse", return_lse)
    c = _Call(q, k, v, causal, window, softcap, scale, bias, alibi_slopes, q_segment_ids,
              kv_segment_ids, layout, bias_scale, diag_offset, mask, threads, sinks, (dropout_p, seed, dropout_offset))
    shape = c.o_shape()
    inputs = (("q", q), ("k", k), ("v", v), ("bias", bias), ("mask", None if isinstance(mask, Mask) else mask),
              ("alibi_slopes", alibi_slopes),
              ("q_segment_ids", q_segment_ids), ("kv_segment_ids", kv_segment_ids), ("sinks", sinks))
    o = _empty(shape, c.q.dtype) if out is None else _check_out("out", out, shape, c.q.dtype, inputs)
    B, H, Sq, _ = c.qd
    lse = _empty((B, H, Sq), np.float32)
    handle = c.plan(_elem_strides(o))
    args = _native.ForwardArgs(q=c.q.ctypes.data, k=c.k.ctypes.data, v=c.v.ctypes.data,
                               o=o.ctypes.data, lse=lse.ctypes.data, **c.common_ptrs())
    handle.forward(args)
    return (o, lse) if return_lse else o


def _grad_buffer(a):
    """(input, gradient buffer) where the buffer has the input's strides, as the library
    writes it; an input whose strides a buffer cannot share is copied to a dense one."""
    st = _elem_strides(a)
    if st is None or not _layout.grad_strides_ok(a.shape, st):
        a = _fresh(a)
        st = _elem_strides(a)
    n = _layout.span(a.shape, st)
    buf = _empty(max(n, 1), a.dtype)
    g = np.lib.stride_tricks.as_strided(buf, a.shape, tuple(s * a.itemsize for s in st))
    return a, g


def _do_with_o_strides(o, do):
    """(o, do) with do laid out as o: the library reads do with o's strides. do is copied
    into a buffer of o's layout where that layout suits a gradient, else both go contiguous."""
    if _elem_strides(do) == _elem_strides(o):
        return o, do
    if _layout.grad_strides_ok(o.shape, _elem_strides(o)):
        _, buf = _grad_buffer(o)
        buf[...] = do
        return o, buf
    return np.ascontiguousarray(o), np.ascontiguousarray(do)


def backward_inputs(o, do, lse, shape, dtype, lse_shape, lse_desc):
    """The forward's o and lse and the cotangent do, checked against the shapes the call
    gives; do laid out as o (_do_with_o_strides), lse contiguous."""
    for name, a in (("o", o), ("do", do)):
        if a.shape != shape or a.dtype != dtype:
            raise ValueError(f"{name} must be {dtype} of shape {shape}, got {a.dtype} of shape {a.shape}")
    lse = np.asarray(lse)
    if lse.shape != lse_shape or lse.dtype != np.float32:
        raise ValueError(f"lse must be float32 of shape {lse_desc} = {lse_shape}, got {lse.dtype} of shape {lse.shape}")
    o, do = _do_with_o_strides(o, do)
    return o, do, np.ascontiguousarray(lse)


def attention_backward(q, k, v, o, lse, do, *, causal=False, window=None, softcap=None,
                       scale=None, bias=None, alibi_slopes=None, q_segment_ids=None,
                       kv_segment_ids=None, layout="bhsd", bias_grad=False, bias_scale=None,
                       diag_offset=None, mask=None, threads=0, sinks=None, dropout_p=None, seed=None,
                       dropout_offset=None):
    """Gradients of sum(o * do) for attention(q, k, v, ...) with the same options, from the
    forward's o and lse. Returns (dq, dk, dv) shaped and strided like q, k, v (dk, dv summed
    over the query heads that share them), then dbias (f32, the bias's own shape, summed over
    the dims it broadcasts; 0 where mask hides a key) with bias_grad, then dsink (f32 [Hq],
    summed over batch and rows) with sinks. Zero-size problems give empty or zero gradients.
    dropout_p, seed, dropout_offset: the forward's, whose keep mask the backward regenerates."""
    bias_grad = flag("bias_grad", bias_grad)
    c = _Call(q, k, v, causal, window, softcap, scale, bias, alibi_slopes, q_segment_ids,
              kv_segment_ids, layout, bias_scale, diag_offset, mask, threads, sinks, (dropout_p, seed, dropout_offset))
    shape = c.o_shape()
    o = _readable("o", o)
    do = _readable("do", do)
    B, H, Sq, _ = c.qd
    o, do, lse = backward_inputs(o, do, lse, shape, c.q.dtype, (B, H, Sq), "[B, H, Sq]")
    q, dq = _grad_buffer(c.q)
    k, dk = _grad_buffer(c.k)
    v, dv = _grad_buffer(c.v)
    if bias_grad and c.bias_own is None:
        raise ValueError("bias_grad needs a bias")
    dbias = _empty(c.bias.shape, np.float32) if bias_grad else None
    dsink = None if c.sinks is None else _empty((H,), np.float32)
    handle = c.plan(_elem_strides(o), bias_grad=bias_grad, q=q, k=k, v=v)
    args = _native.BackwardArgs(q=q.ctypes.data, k=k.ctypes.data, v=v.ctypes.data,
                                o=o.ctypes.data, d_o=do.ctypes.data, lse=lse.ctypes.data,
                                dq=dq.ctypes.data, dk=dk.ctypes.data, dv=dv.ctypes.data,
                                dbias=None if dbias is None else dbias.ctypes.data,
                                dsink=None if dsink is None else dsink.ctypes.data, **c.common_ptrs())
    handle.backward(args)
    if bias_grad:  # summed over what this front widened, then scaled: the chain rule's order, as torch and JAX take it
        dbias = _own_shape(dbias, c.bias_own, bias)
        if c.grad_scale is not None:
            dbias *= np.float32(c.grad_scale)
    extra = ((dbias,) if bias_grad else ()) + (() if dsink is None else (dsink,))
    return (dq, dk, dv) + extra


def _own_shape(dbias, own, bias):
    """dbias of the library's bias shape summed over the dims the caller's bias broadcast
    (none: as it is; numpy's add-reduce over no axis would turn -0.0 into +0.0)."""
    axes = tuple(i for i in range(4) if own[i] == 1 and dbias.shape[i] != 1)
    return (dbias.sum(axis=axes, keepdims=True) if axes else dbias).reshape(np.shape(bias))


def dropout_keep_rate(dropout_p):
    """The fraction of weights dropout keeps at dropout_p: T / 256 with T = round(256 (1 - p))
    (docs/semantics.md, "Dropout")."""
    from ._problem import dropout_p_value
    return _native.lib.fa_dropout_keep_rate(dropout_p_value(dropout_p))


def dropout_keep_mask(dropout_p, seed, b, h, rows, cols, *, dropout_offset=0, row0=0, col0=0):
    """The keep mask the kernels use: bool [rows, cols], True where weight (b, h, row0 + r,
    col0 + c) of a call with this dropout_p, seed and dropout_offset is kept (for packed
    batches b is the sequence, rows and columns count within it)."""
    from ._problem import _uint64, _int, dropout_p_value
    out = np.empty((_int("rows", rows), _int("cols", cols)), np.uint8)
    st = _native.lib.fa_dropout_keep_mask(dropout_p_value(dropout_p), _uint64("seed", seed), _uint64("dropout_offset", dropout_offset),
                                          _int("b", b), _int("h", h), _int("row0", row0), out.shape[0],
                                          _int("col0", col0), out.shape[1], out.ctypes.data)
    if st:
        raise ValueError(_native.last_error())
    return out.view(np.bool_)
