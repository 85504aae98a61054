"""flashattn.jax.attention: the library's forward and backward as one differentiable JAX op.

Arguments are checked and normalized here, at trace time (shapes and dtypes only, so the
errors name the argument before anything runs); the math is the C library's, reached
through the XLA FFI targets in _ffi.py. The backward is a jax.custom_vjp rule calling the
library's fa_backward with the forward's saved o and lse.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from .._problem import (_int, broadcast_dims, check_real, check_sinks_finite, combined_bias_dims, dropout_p_value,
                        empty_dims, flag, fold_bias_scale, library_bias_scale, refuse_text_and_bools, threads_int,
                        window_pair)
from .._problem_inference import int32_lengths
from . import _ffi
from ._ffi import Options
from ._plan import plan_for
from ..masks import build_for_call
from ._splash import as_mask

# The library masks flashattn.jax.attention has passed to XLA by address: a compiled call may
# run at any later time, so each stays alive for the process (one per mask and shape).
_PINNED = {}

_FLOAT_DTYPES = tuple(jnp.dtype(t) for t in (jnp.float32, jnp.float16, jnp.bfloat16))


def _check_qkv(q, k, v, layout):
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"layout must be 'bshd' or 'bhsd', got {layout!r}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            order = "[B, S, H, D]" if layout == "bshd" else "[B, H, S, D]"
            raise ValueError(f"{name} must have rank 4 ({order} for layout={layout!r}), got shape {tuple(x.shape)}")
        if x.dtype is None or jnp.dtype(x.dtype) not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    seq, head = (1, 2) if layout == "bshd" else (2, 1)
    b, hq, sq, d = q.shape[0], q.shape[head], q.shape[seq], q.shape[3]
    if k.shape[0] != b or v.shape[0] != b:
        raise ValueError(f"q, k and v must share the batch size, got {b}, {k.shape[0]} and {v.shape[0]}")
    hk, sk = k.shape[head], k.shape[seq]
    if k.shape[3] != d:
        raise ValueError(f"k has head_dim {k.shape[3]} but q has {d}")
    if v.shape[head] != hk or v.shape[seq] != sk:
        raise ValueError(f"v has {v.shape[head]} heads and {v.shape[seq]} keys but k has {hk} and {sk}")
    if hk == 0 and hq != 0:
        raise ValueError(f"k and v have 0 heads but q has {hq} (each query head reads a kv head)")
    if hk != 0 and hq % hk != 0:
        raise ValueError(f"q's heads ({hq}) must be a multiple of k's and v's heads ({hk})")
    return b, hq, sq, sk


def _window(window):
    """(left, right) as the problem builder reads it (None sides unbounded), checked at trace
    time for what a JAX attribute cannot hold: below -1 has no meaning."""
    left, right = window_pair(window)
    if left < -1 or right < -1:
        raise ValueError(f"window values must be >= -1 (-1: unbounded), got {window!r}")
    return (left, right)


def _cotangents_as_values(v, o, do, dlse):
    """The backward's v, o and do for o's cotangent do (zeros where JAX passed a symbolic
    zero) and lse's, dlse (None: none; laid out as do's rows). d lse_i / d s_ij = p_ij, so
    dlse adds dlse_i to every dp_ij of row i: the library's backward gets it as one more
    value column, ones in v, dlse in do, and 0 in o so that the row term rowsum(do * o)
    leaves it out (the caller drops dv's last column)."""
    do = jnp.zeros_like(o) if isinstance(do, SymbolicZero) else do.astype(o.dtype)
    if dlse is None:
        return v, o, do
    # the columns as slices of the tensors they join (ones_like / zeros_like): under Explicit
    # mesh axes they carry those tensors' sharding types, which concatenate requires
    v = jnp.concatenate([v, jnp.ones_like(v[..., :1])], axis=-1)
    o = jnp.concatenate([o, jnp.zeros_like(o[..., :1])], axis=-1)
    return v, o, jnp.concatenate([do, dlse.astype(o.dtype)[..., None]], axis=-1)


def truth(name, x):
    """The drop-ins' yes/no options (jax.nn's is_causal, the Pallas kernel's causal) as their
    functions take them, by their truth value; a traced one is refused in words, not JAX's.
    flashattn's own functions take flag()'s stricter rule (True, False, 0 or 1)."""
    try:
        return bool(x)
    except (TypeError, jax.errors.ConcretizationTypeError):
        raise ValueError(f"{name} must be a Python bool (a static value), got {type(x).__name__}") from None


def _finite(name, x):
    """A static, finite float option (None stays None: the library's default)."""
    if x is None:
        return None
    refuse_text_and_bools(name, x, isinstance(x, jax.Array) and x.dtype == jnp.bool_)
    try:
        x = float(x)
    except (TypeError, jax.errors.ConcretizationTypeError):
        raise ValueError(f"{name} must be a Python number (a static value), got {type(x).__name__}") from None
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x}")
    return x


def _bias_shape(bias, mask, b, hq, sq, sk):
    """The [1 or B, 1 or Hq, 1 or Sq, Sk] shape of the bias the op gets for a bias and a boolean
    mask (None without either); a bias of real numbers (_problem.check_real: TypeError for a
    boolean one), TypeError for a non-boolean mask."""
    if bias is not None and bias.dtype is not None:
        check_real("bias", bias.dtype, f"broadcastable to [B, Hq, Sq, Sk] = [{b}, {hq}, {sq}, {sk}]")
    if mask is not None and mask.dtype is not None and jnp.dtype(mask.dtype) != jnp.bool_:
        raise TypeError(f"mask must be boolean (True: attend), got {mask.dtype}; an additive mask goes to bias=")
    return combined_bias_dims(None if bias is None else bias.shape, None if mask is None else mask.shape,
                              b, hq, sq, sk)


def lower_bias(bias, mask, full, bias_scale=None):
    """The bias the op gets: bias (f32; with a mask, times bias_scale, which the op then does
    not get: _problem.fold_bias_scale) plus 0 where mask is True and -inf where it hides a
    key (docs/nonfinite.md: a -inf bias entry hides its key exactly as a mask does),
    broadcast to full. XLA buffers have no strides, so a size-1 Sk dim is materialized
    (the numpy front broadcasts it without a copy); a size-1 Sq stays 1 (bias_seq_q)."""
    dims = (full[0], full[1], full[2], full[3])
    b = None
    if bias is not None:
        b = bias.reshape(broadcast_dims("bias", bias.shape, *dims)).astype(jnp.float32)
    b, _ = fold_bias_scale(b, bias_scale, mask is not None)
    if mask is not None:
        m = jnp.where(mask.reshape(broadcast_dims("mask", mask.shape, *dims)), 0.0, -jnp.inf).astype(jnp.float32)
        b = m if b is None else jnp.where(m == 0, b, m)  # not b + m: a NaN or inf bias at a hidden key stays hidden
    return None if b is None else jnp.broadcast_to(b, full)


def _check_extras(alibi_slopes, q_seg, kv_seg, b, hq, sq, sk, shapes_only):
    """Shapes of the slopes and segment ids (True stands for "present" in shapes_only); the
    slopes real numbers (_problem.check_real)."""
    if alibi_slopes is not None and not (shapes_only and alibi_slopes is True):
        if alibi_slopes.dtype is not None:
            check_real("alibi_slopes", alibi_slopes.dtype, f"[Hq] = [{hq}]")
        if tuple(alibi_slopes.shape) != (hq,):
            raise ValueError(f"alibi_slopes must have shape ({hq},) (one per query head), "
                             f"got {tuple(alibi_slopes.shape)}")
    if (q_seg is None) != (kv_seg is None):
        raise ValueError("q_segment_ids and kv_segment_ids must be given together")
    for name, x, s in (("q_segment_ids", q_seg, sq), ("kv_segment_ids", kv_seg, sk)):
        if x is None or (shapes_only and x is True):
            continue
        if tuple(x.shape) != (b, s):
            raise ValueError(f"{name} must have shape ({b}, {s}), got {tuple(x.shape)}")
        if x.dtype is not None and not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError(f"{name} must be integers, got {x.dtype}")


def make_options(q, k, v, *, causal=False, window=None, softcap=None, scale=None, bias=None, alibi_slopes=None,
                 q_segment_ids=None, kv_segment_ids=None, layout="bshd", diag_offset=None, bias_scale=None,
                 shapes_only=False, mask=None, threads=0, sinks=None, dropout_p=None, seed=None,
                 dropout_offset=None):
    """Checks a call's arguments from their shapes and dtypes; returns its Options and the
    shape of the bias the op gets, [1 or B, 1 or Hq, 1 or Sq, Sk] (None without a bias or mask)."""
    b, hq, sq, sk = _check_qkv(q, k, v, layout)
    softcap = _finite("softcap", softcap)
    if softcap is not None and softcap < 0:
        raise ValueError(f"softcap must be >= 0 (0 or None: off), got {softcap}")
    bias_shape = _bias_shape(bias, mask, b, hq, sq, sk)
    _check_extras(alibi_slopes, q_segment_ids, kv_segment_ids, b, hq, sq, sk, shapes_only)
    if sinks is not None and not (shapes_only and sinks is True):
        if sinks.dtype is not None:
            check_real("sinks", sinks.dtype, f"[Hq] = [{hq}]")
        if tuple(sinks.shape) != (hq,):
            raise ValueError(f"sinks must have shape ({hq},) (one per query head), got {tuple(sinks.shape)}")
    opt = Options(layout=layout, causal=flag("causal", causal), window=_window(window), softcap=softcap or 0.0,
                  scale=_finite("scale", scale),
                  diag_offset=None if diag_offset is None else _int("diag_offset", diag_offset),
                  bias_scale=library_bias_scale(_finite("bias_scale", bias_scale), bias is not None, mask is not None),
                  has_bias=bias_shape is not None,
                  has_alibi=alibi_slopes is not None, has_segment_ids=q_segment_ids is not None,
                  threads=threads_int(threads), has_sinks=sinks is not None,
                  **_dropout(dropout_p, seed, dropout_offset))
    return opt, bias_shape


def _dropout(dropout_p, seed, dropout_offset):
    """Options' dropout field: dropout_p in [0, 1) (static), which needs a seed; the seed
    and offset themselves are checked and become an operand in seed_words. Without dropout
    (None or 0) a seed or offset given is checked and unused, as in every front
    (_problem.set_dropout)."""
    dropout_p = _finite("dropout_p", dropout_p)  # static: a traced one is refused in words
    if dropout_p is None or dropout_p == 0:
        if seed is not None:
            _u64_words("seed", seed, True)
        if dropout_offset is not None:
            _u64_words("dropout_offset", dropout_offset, False)
        return {}
    p = dropout_p_value(_finite("dropout_p", dropout_p))
    if seed is None:
        raise ValueError("dropout_p > 0 needs seed= (an integer in 0 .. 2**64 - 1, an integer scalar array, "
                         "or a jax.random key)")
    return dict(dropout_p=p)


def _u64_words(name, x, key_ok):
    """x as two uint32 words (low, high): a Python int in 0 .. 2**64 - 1; an integer scalar
    array (a concrete one checked as the int; a traced one's bits read as unsigned, a 32-bit
    one with high word 0); with key_ok, a jax.random key, typed (jax.random.key) or raw
    (jax.random.PRNGKey's uint32 [2]), whose two key-data words are the seed's (low, high)."""
    if isinstance(x, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer, got {x!r}")
    if hasattr(x, "dtype") and key_ok and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        if x.shape != ():
            raise ValueError(f"{name} must be one key (shape ()), got a key array of shape {tuple(x.shape)}")
        x = jax.random.key_data(x)
        if x.shape != (2,) or x.dtype != jnp.uint32:
            raise ValueError(f"{name}: a key of this PRNG implementation has key data {x.dtype}{list(x.shape)}, "
                             "not uint32[2]; pass an integer seed instead")
        return x
    if hasattr(x, "dtype") and key_ok and tuple(x.shape) == (2,) and jnp.dtype(x.dtype) == jnp.uint32:
        return jnp.asarray(x)  # a raw key: jax.random.PRNGKey(n)
    if hasattr(x, "dtype") and (tuple(x.shape) != () or jnp.dtype(x.dtype) == jnp.bool_ or
                                not jnp.issubdtype(x.dtype, jnp.integer)):
        raise ValueError(f"{name} must be an integer scalar{' or a jax.random key' if key_ok else ''}, "
                         f"got {x.dtype}{list(x.shape)}")
    if not isinstance(x, jax.core.Tracer):  # a concrete value: checked, exactly, as a Python int
        if not hasattr(x, "__index__") and not hasattr(x, "dtype"):
            raise ValueError(f"{name} must be an integer, an integer scalar array"
                             f"{' or a jax.random key' if key_ok else ''}, got {type(x).__name__}")
        v = int(x)
        if not 0 <= v < 2**64:
            raise ValueError(f"{name} = {v} is not in 0 .. 2**64 - 1")
        return jnp.asarray(np.array([v & 0xFFFFFFFF, v >> 32], np.uint32))
    if jnp.dtype(x.dtype).itemsize <= 4:
        return jnp.stack([x.astype(jnp.uint32), jnp.zeros((), jnp.uint32)])
    u = x.astype(jnp.uint64)
    return jnp.stack([(u & 0xFFFFFFFF).astype(jnp.uint32), (u >> 32).astype(jnp.uint32)])


def seed_words(dropout_p, seed, dropout_offset):
    """The handler's seed operand (uint32 [4]: seed low, high, offset low, high), or None
    without dropout. An operand, not an attribute: a new seed each training step runs the
    compiled call again instead of compiling another (the bits are the same either way)."""
    if dropout_p == 0:
        return None
    return jax.lax.stop_gradient(jnp.concatenate([_u64_words("seed", seed, True),
                                                  _u64_words("dropout_offset", 0 if dropout_offset is None else dropout_offset, False)]))


def _unwrap(x):
    return None if x is None else x.value


def refuse_slopes_grad(slopes):
    """The library computes no gradient for ALiBi slopes: differentiating with respect to them
    (symbolic_zeros: slopes.perturbed) raises, where a stop_gradient gave zeros silently."""
    if slopes is not None and slopes.perturbed:
        raise TypeError("flashattn computes no gradient for the ALiBi slopes, and this gradient "
                        "depends on alibi_slopes: pass jax.lax.stop_gradient(alibi_slopes) (or learn a bias= "
                        "instead)")


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _op(opt, q, k, v, bias, slopes, q_seg, kv_seg, sinks, seed):
    return _ffi.forward(opt, q, k, v, bias, slopes, q_seg, kv_seg, sinks, seed)


def _op_fwd(opt, q, k, v, bias, slopes, q_seg, kv_seg, sinks, seed):
    # symbolic_zeros: each argument comes as (value, perturbed); dbias is computed only
    # when the bias is being differentiated
    bias_grad = bias is not None and bias.perturbed
    refuse_slopes_grad(slopes)
    q, k, v, bias, slopes, q_seg, kv_seg, sinks, seed = map(_unwrap, (q, k, v, bias, slopes, q_seg, kv_seg, sinks, seed))
    if bias_grad:  # at trace time, so that a library without dbias says so before anything runs
        plan_for(opt, q, k, v, bias, bias_grad=True)
    o, lse = _ffi.forward(opt, q, k, v, bias, slopes, q_seg, kv_seg, sinks, seed)
    marker = () if bias_grad else None  # static: the residuals' structure carries it
    return (o, lse), (q, k, v, o, lse, bias, slopes, q_seg, kv_seg, sinks, seed, marker)


def _op_bwd(opt, res, cotangents):
    q, k, v, o, lse, bias, slopes, q_seg, kv_seg, sinks, seed, marker = res
    primals = (q, k, v, bias, sinks)  # the cotangents' types (v is widened below when lse has one)
    do, dlse = cotangents
    with_lse = not isinstance(dlse, SymbolicZero)
    if with_lse and opt.dropout_p > 0:  # lse's cotangent rides on dP, which dropout scales
        raise NotImplementedError("a gradient through lse with dropout (dropout_p > 0) is not supported")
    if with_lse:
        dlse = jnp.swapaxes(dlse, 1, 2) if opt.layout == "bshd" else dlse
    v, o, do = _cotangents_as_values(v, o, do, dlse if with_lse else None)
    dq, dk, dv, dbias, dsink = _ffi.backward(opt, marker is not None, q, k, v, o, lse, do, bias, slopes, q_seg,
                                             kv_seg, sinks, seed)
    if with_lse:
        dv = dv[..., :-1]
        if sinks is not None:
            # d lse_i / d sink_h = exp(sink_h - lse_i): lse's cotangent reaches the sink directly
            # (the value column carries it to the scores only); lse is [B, H, Sq] in both layouts
            dlse_bhs = jnp.swapaxes(dlse, 1, 2) if opt.layout == "bshd" else dlse
            dsink = dsink + jnp.sum(jnp.exp(sinks[None, :, None] - lse) * dlse_bhs, axis=(0, 2))
    dq, dk, dv, dbias, dsink = (_ffi.typed_like(ct, x) for ct, x in zip((dq, dk, dv, dbias, dsink), primals))
    return dq, dk, dv, dbias, None, None, None, dsink, None


_op.defvjp(_op_fwd, _op_bwd, symbolic_zeros=True)

# The op as its own jit: a custom_vjp with symbolic_zeros (which the rules above read: is
# the bias or are the slopes differentiated, is lse's cotangent a zero) raises
# NotImplementedError in an eager (not jitted) shard_map; inside a jit JAX traces it to a
# jaxpr first, and the eager shard_map runs that. Under an outer jit it is inlined.
_op_jit = jax.jit(_op, static_argnums=0)


def _ids_fit_int32(name, x):
    """Segment ids go to the library as int32: concrete ones (not traced) that do not fit
    raise ValueError, checked before JAX converts them (which would wrap them without x64).
    Traced ids are cast as they are: their values are unknown until the call runs."""
    if x is None or isinstance(x, jax.core.Tracer):
        return
    a = np.asarray(x)
    int32_lengths(name, a, "[B, S]", ndim=a.ndim)


def mask_object(mask, q, k, v, layout):
    """mask as the library's block-sparse mask for q, k, v (anything with shape and dtype) where
    it is a flashattn.masks or a splash attention mask; None where it is an array or None; any
    other object is a TypeError saying what a mask may be (the call and the plan alike)."""
    if mask is None or hasattr(mask, "dtype"):
        return None
    _, hq, sq, sk = _check_qkv(q, k, v, layout)
    fmask = as_mask(mask, hq, sq, sk)
    if fmask is None:
        raise TypeError(f"mask must be a boolean array, a flashattn.masks mask or a splash attention mask, "
                        f"got {type(mask).__name__}")
    return fmask


def call(q, k, v, *, causal=False, window=None, softcap=None, scale=None, bias=None, alibi_slopes=None,
         q_segment_ids=None, kv_segment_ids=None, layout="bshd", return_lse=False, diag_offset=None,
         bias_scale=None, mask=None, threads=0, sinks=None, dropout_p=None, seed=None, dropout_offset=None):
    """attention() with the two options the Pallas drop-in needs (diag_offset, bias_scale)."""
    return_lse = flag("return_lse", return_lse)
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    _ids_fit_int32("q_segment_ids", q_segment_ids)
    _ids_fit_int32("kv_segment_ids", kv_segment_ids)
    fmask = mask_object(mask, q, k, v, layout)
    mask = None if fmask is not None else mask
    bias, mask, slopes, q_seg, kv_seg = (None if x is None else jnp.asarray(x)
                                         for x in (bias, mask, alibi_slopes, q_segment_ids, kv_segment_ids))
    opt, bias_shape = make_options(q, k, v, causal=causal, window=window, softcap=softcap, scale=scale, bias=bias,
                                   alibi_slopes=slopes, q_segment_ids=q_seg, kv_segment_ids=kv_seg, layout=layout,
                                   diag_offset=diag_offset, bias_scale=bias_scale, mask=mask, threads=threads,
                                   sinks=None if sinks is None else jnp.asarray(sinks),
                                   dropout_p=dropout_p, seed=seed, dropout_offset=dropout_offset)
    if bias_shape is not None:  # outside the custom_vjp: autodiff takes the cast and broadcast back
        bias = lower_bias(bias, mask, bias_shape, bias_scale)
    if slopes is not None:  # no gradient: _op_fwd refuses to be differentiated in them
        slopes = slopes.astype(jnp.float32)
    if q_seg is not None:
        q_seg, kv_seg = q_seg.astype(jnp.int32), kv_seg.astype(jnp.int32)
    sinks = None if sinks is None else jnp.asarray(sinks).astype(jnp.float32)  # differentiable
    b, hq, sq, sk = _check_qkv(q, k, v, layout)
    built = None if fmask is None else build_for_call(fmask, b, hq, sq, sk, diag_offset=opt.diag_offset,
                                                      empty=empty_dims(b, hq, sq, sk))
    if built is not None:
        # XLA holds its address for the process (a static option of the compiled call): kept
        # alive, and kept in the mask's cache, so that the shape's next call finds it there,
        # the same address, not a new build (a new compile, pinned too: memory without bound)
        built.pinned = True
        _PINNED.setdefault(built.ptr, built)
        opt = opt._replace(mask=built.ptr)
    _check_plan(opt, q, k, v, bias, fmask)
    if empty_dims(b, hq, sq, sk):  # nothing to compute: filled here, outside the XLA call
        o_shape, lse_shape = _ffi.out_shapes(opt, q, v)
        o, lse = jnp.zeros(o_shape, q.dtype), jnp.full(lse_shape, -jnp.inf, jnp.float32)
        if sinks is not None:  # rows without keys: lse = sink, and o = 0 with a zero derivative in the
            lse = jnp.broadcast_to(sinks[None, :, None], lse_shape)  # sink: dsink gets NaN from do, as the library
            o = o + _zero_along_heads(sinks, o_shape, 2 if opt.layout == "bshd" else 1).astype(q.dtype)
    else:
        # one varying-axis type for all operands (_ffi.vary_together: a replicated bias or
        # sinks beside a sharded q gets its gradient summed over the shards)
        operands = _ffi.vary_together(q, k, v, bias, slopes, q_seg, kv_seg, sinks,
                                      seed_words(opt.dropout_p, seed, dropout_offset))
        o, lse = _op_jit(opt, *operands)
    return (o, lse) if return_lse else o


def _zero_along_heads(sinks, shape, axis):
    """Zeros of shape that depend on sinks [H] (along axis) with a zero derivative: the rows
    of a problem without keys, o = 0 whatever the sink, whose dsink term is do . 0 (0, or
    NaN where do is: docs/nonfinite.md). s - s: +0 and a cotangent ct - ct, +0 or NaN (0 * s
    gave -0 for a negative cotangent sum). Concrete sinks are judged by the library's rule
    here, since no library call sees them; a traced non-finite one gives o = 0."""
    if not isinstance(sinks, jax.core.Tracer):
        check_sinks_finite(np.asarray(sinks), "attention")
    s = jnp.where(jnp.isfinite(sinks), sinks, 0.0)
    idx = [None] * len(shape)
    idx[axis] = slice(None)
    return jnp.broadcast_to((s - s)[tuple(idx)], shape)


def _check_plan(opt, q, k, v, bias, mask=None):
    """Plans the problem at trace time (microseconds, shapes only) so that whatever the
    library rejects raises ValueError here, naming the problem, before anything runs."""
    plan_for(opt, q, k, v, bias, mask=mask)


def attention(q, k, v, *, causal=False, window=None, softcap=None, scale=None, bias=None, alibi_slopes=None,
              q_segment_ids=None, kv_segment_ids=None, layout="bshd", return_lse=False, mask=None, threads=0,
              sinks=None, dropout_p=None, seed=None, dropout_offset=None, diag_offset=None, bias_scale=None):
    """Exact attention through the flashattn C library, as an XLA custom call.

    q [B, Sq, Hq, D], k [B, Sk, Hk, D], v [B, Sk, Hk, Dv] for layout="bshd" (the default,
    like jax.nn.dot_product_attention), or [B, H, S, D] for layout="bhsd"; float32, float16
    or bfloat16. Hq must be a multiple of Hk (GQA/MQA). Returns o (q's layout, v's head
    dim), or (o, lse) with lse [B, Hq, Sq] float32 when return_lse.

    Semantics (docs/semantics.md): s = scale * q.k (scale defaults to 1/sqrt(D)),
    softcap cap*tanh(s/cap), + bias (broadcastable to [B, Hq, Sq, Sk]; a boolean bias raises
    TypeError: see mask), - slope[h]*|i+Sk-Sq-j| (ALiBi); masks (causal, window=(left,
    right), segment ids) align bottom-right as in FlashAttention-2 (for Sq == Sk the usual
    lower triangle). mask: boolean, broadcastable to [B, Hq, Sq, Sk], True = attend, ANDed
    with the other masks (passed as a 0 / -inf bias); or a flashattn.masks mask, or a splash
    attention mask (CausalMask, LocalMask, ChunkedCausalMask, NumpyMask, FullMask,
    MultiHeadMask, & and |; aligned top-left as splash has them), built by the library as a
    block-sparse mask (empty blocks skipped; the plan exact; docs/python_masks.md). A row with no visible key gives o = 0 and lse = -inf; a zero B, H, Sq or Sk gives empty (or o = 0, lse = -inf) results
    without a call. threads: CPU threads for this call (0 or None: the library's default).
    Integers that do not fit int64 (segment ids: int32, when concrete) raise ValueError.
    sinks [Hq] (finite): a per-head logit in each row's softmax denominator that adds
    nothing to o (docs/semantics.md, "Attention sinks"); lse includes it, a row with no
    visible key gets lse = sink; differentiable (the custom_vjp gives dsink).

    Differentiable for q, k, v, bias and sinks (jax.custom_vjp through the library's backward;
    a gradient with respect to alibi_slopes raises TypeError);
    works under jax.jit, jax.grad and jax.vmap (vmapped dims fold into the batch).

    dropout_p in [0, 1) (static) with seed (and dropout_offset) drops each weight after the
    softmax with flashattn's keep mask (docs/semantics.md, "Dropout"), the kept ones scaled
    by 1 / (1 - dropout_p); the backward regenerates it. seed: a Python int in 0 .. 2**64 -
    1, an integer scalar array (traced under jit: a new seed each step does not recompile),
    or a jax.random key (its two key-data words are the seed's low and high halves);
    dropout_offset: an int or integer scalar array. lse stays undropped and its gradient
    under dropout is not supported (a symbolic zero, lse unused, is none; an explicit zeros
    cotangent counts as one). Under vmap the mask's batch index is the folded one
    (a vmapped seed: each index its own seed, at its own batch indices). Under shard_map
    each shard draws at its local batch indices: fold jax.lax.axis_index into the seed
    (docs/python.md, "Several devices").

    diag_offset (an int; None: Sk - Sq, bottom-right) places the causal and window masks'
    diagonal (0: top-left), and bias_scale multiplies the bias (the scores get
    bias_scale * bias), as in the numpy and torch attention.
    """
    return call(q, k, v, causal=causal, window=window, softcap=softcap, scale=scale, bias=bias,
                alibi_slopes=alibi_slopes, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                layout=layout, return_lse=return_lse, mask=mask, threads=threads, sinks=sinks, dropout_p=dropout_p,
                seed=seed, dropout_offset=dropout_offset, diag_offset=diag_offset, bias_scale=bias_scale)
