"""flashattn.merge_states: the state of attention over two disjoint key sets from each
set's (o, lse), as FlashInfer's merge_state; the library's fa_merge_states does the math
(docs/semantics.md, "Merging attention states")."""
import ctypes

import numpy as np

from . import _native
from ._numpy import _dtype_name, _empty, _floats, dtype_error

_DTYPE_IDS = {"f32": _native.F32, "f16": _native.F16, "bf16": _native.BF16}


def check_merge_shapes(o_a, o_b, lse_a, lse_b, sinks):
    """The shapes every front's merge_states takes, one rule and one wording (numpy's and
    torch's had their own): o_a, o_b (shape, dtype) pairs of one shape and dtype, [..., H, Dv];
    lse_a, lse_b [..., H] of that; sinks (None or a shape) [H]. Shapes are tuples; a dtype is
    the front's own object. Returns (H, Dv)."""
    (sa, da), (sb, db) = o_a, o_b
    if sa != sb or da != db:
        raise ValueError(f"o_a and o_b must have one shape and dtype, got {sa} {da} and {sb} {db}")
    if len(sa) < 2:
        raise ValueError(f"o_a and o_b must be [..., H, Dv], got shape {sa}")
    for n, shape in (("lse_a", lse_a), ("lse_b", lse_b)):  # the shapes as given (a 0-d one is (), not (1,))
        if shape != sa[:-1]:
            raise ValueError(f"{n} must have shape {sa[:-1]} ([..., H] of o's [..., H, Dv]), got {shape}")
    if sinks is not None and sinks != (sa[-2],):
        raise ValueError(f"sinks must have shape [H] = [{sa[-2]}], got {sinks}")
    return sa[-2], sa[-1]


def merge_states(o_a, lse_a, o_b, lse_b, sinks=None):
    """Merges two attention states over disjoint key sets: o_a, o_b [..., H, Dv] of one
    dtype (float32, float16, ml_dtypes.bfloat16), lse_a, lse_b [..., H] float32 (natural
    log). Returns (o, lse) over the union: lse = logaddexp(lse_a, lse_b), o weighted by
    exp(lse_x - lse), computed in double, rounded to float32 and then to the dtype (as
    FlashInfer's merge_state; bf16 and f16 may then differ from one rounding of the exact
    value by a rounding of the f32). An empty state (lse = -inf)
    contributes nothing (its o is not read). sinks [H] (attention-sink logits, finite or
    -inf) are added once, to the denominator: pass them to the final merge only."""
    o_a, o_b = np.ascontiguousarray(o_a), np.ascontiguousarray(o_b)
    lse_a, lse_b = _floats("lse_a", lse_a, "[..., H]"), _floats("lse_b", lse_b, "[..., H]")
    sinks = None if sinks is None else _floats("sinks", sinks, "[H]")
    heads, dv = check_merge_shapes((o_a.shape, o_a.dtype), (o_b.shape, o_b.dtype), lse_a.shape, lse_b.shape,
                                   None if sinks is None else sinks.shape)
    name = _dtype_name(o_a.dtype)
    if name is None:
        raise ValueError(dtype_error("o_a, o_b", o_a.dtype))
    lse_a, lse_b = np.ascontiguousarray(lse_a), np.ascontiguousarray(lse_b)
    sinks = None if sinks is None else np.ascontiguousarray(sinks)
    rows = int(np.prod(o_a.shape[:-2], dtype=np.int64))
    o, lse = _empty(o_a.shape, o_a.dtype), _empty(lse_a.shape, np.float32)
    if lse.size == 0:  # no rows or heads (Dv 0 still merges the lse: the library's head_dim_v 0)
        return o, lse
    fp = ctypes.POINTER(ctypes.c_float)
    ptr = lambda a: None if a is None else a.ctypes.data_as(fp)  # noqa: E731
    _native.check(_native.lib.fa_merge_states(_DTYPE_IDS[name], rows, heads, dv, o_a.ctypes.data, ptr(lse_a),
                                              o_b.ctypes.data, ptr(lse_b), ptr(sinks), o.ctypes.data, ptr(lse)),
                  "merge_states")
    return o, lse
