"""flashattn.jax.varlen_attention and flashattn.jax.kvcache_attention: the inference shapes
(packed variable-length batches, kv-cache decoding, paged caches) as XLA custom calls
(python/csrc/jax_ffi_inference.c), CPU platform.

Shapes and dtypes are checked at trace time, naming the argument. The lengths
(cu_seqlens, cache_seqlens) and page ids are data: where the lengths are concrete (not
traced) the problem is planned with them at trace time, so the library's message about them
comes as ValueError before anything runs (page ids, concrete or not, are judged when the
call runs: a donated cache is then lost, docs/python.md); traced lengths are planned from
the capacities (lengths per call: what depends on shapes and options alone is refused at
trace time too), and the handler
judges their values when the call runs (kvcache_attention; varlen_attention plans only
with concrete lengths).

JAX arrays are immutable, so kvcache_attention is functional: it returns the updated
caches. With new tokens the custom call aliases each cache result to its cache argument
(input_output_aliases); donate the caches (jax.jit(..., donate_argnums=...)) and XLA writes
the new rows in place, otherwise it copies each cache once per call first. Without new
tokens the caches are only read and come back as given (no copy).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from .. import _native
from .._problem import (_int, check_real, flag, is_tracer, make_options as _library_options, problem_diag_offset,
                        threads_int)
from .._problem_inference import (check_decode_shapes, check_max_seqlen, check_prefix, check_scale_dtype,
                                  check_varlen_shapes, decode_problem, int32_lengths, varlen_problem)
from . import _ffi, _partition
from .._quant import cache_dtype_code, quantize_dtype_code
from ._attention import (_cotangents_as_values, _dropout, _finite, _window, _zero_along_heads,
                         refuse_slopes_grad, seed_words)
from ._plan import _DTYPE_NAMES

VARLEN_FORWARD_TARGET, VARLEN_BACKWARD_TARGET, KVCACHE_TARGET = (t for t, _ in _ffi.INFERENCE_TARGETS)


def _dtype(*arrays, names):
    dts = {jnp.dtype(a.dtype) for a in arrays}
    if len(dts) != 1:
        raise ValueError(f"{', '.join(names)} must share a dtype, got {', '.join(str(a.dtype) for a in arrays)}")
    dt = dts.pop()
    if dt not in _DTYPE_NAMES:
        raise ValueError(f"{', '.join(names)} must be float32, float16 or bfloat16, got {dt}")
    return _DTYPE_NAMES[dt]


def _lengths(name, x, ndim, desc):
    if not isinstance(x, jax.core.Tracer):  # concrete: checked and made int32 as numpy and torch do, before
        x = int32_lengths(name, np.asarray(x), desc, ndim=ndim)  # JAX's conversion (2**32 + 3 wraps to 3, [] is f32)
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"{name} must be integers {desc}, got dtype {x.dtype}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dim{'s' if ndim > 1 else ''} {desc}, got shape {tuple(x.shape)}")
    return x.astype(jnp.int32)


def _concrete(x):
    """x as a numpy int32 array where it is known at trace time, else None."""
    if x is None:
        return None
    try:
        return np.asarray(x, np.int32)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def _dense(shape):
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(out))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _no_grad(x, what):
    """x itself, for an operand of a call that has no gradient (kvcache_attention): a gradient
    or a tangent that depends on x raises TypeError naming it, where stop_gradient gave zeros."""
    return x


def _no_grad_jvp(what, primals, tangents):
    (x,), (t,) = primals, tangents
    if not isinstance(t, SymbolicZero):
        raise TypeError(f"flashattn: {what} has no gradient (decoding runs forward only), and this "
                        "derivative depends on it: pass jax.lax.stop_gradient of it")
    return x, t


_no_grad.defjvp(_no_grad_jvp, symbolic_zeros=True)


def _slopes(alibi_slopes, hq):
    if alibi_slopes is None:
        return None
    s = jnp.asarray(alibi_slopes)
    check_real("alibi_slopes", s.dtype, f"[Hq] = [{hq}]")
    if tuple(s.shape) != (hq,):
        raise ValueError(f"alibi_slopes must have shape ({hq},) (one per query head), got {tuple(s.shape)}")
    return s.astype(jnp.float32)  # no gradient: _varlen_op_fwd refuses to be differentiated in them


def _sinks(sinks, hq):
    """sinks [Hq] as the op's f32 operand (None stays None); differentiable."""
    if sinks is None:
        return None
    s = jnp.asarray(sinks)
    check_real("sinks", s.dtype, f"[Hq] = [{hq}]")
    if tuple(s.shape) != (hq,):
        raise ValueError(f"sinks must have shape ({hq},) (one per query head), got {tuple(s.shape)}")
    return s.astype(jnp.float32)


def _attributes(causal, window, softcap, scale, has_alibi, threads=0, has_sinks=False):
    i64, f32 = np.int64, np.float32
    softcap = _finite("softcap", softcap) or 0.0
    scale = _finite("scale", scale)
    left, right = _window(window)
    return dict(causal=i64(flag("causal", causal)), window_left=i64(left), window_right=i64(right), softcap=f32(softcap),
                has_scale=i64(scale is not None), scale=f32(0.0 if scale is None else scale),
                has_alibi=i64(has_alibi), threads=i64(threads_int(threads)), has_sinks=i64(has_sinks))


# ---- packed variable-length batches ---------------------------------------------------

def _optional(*xs):
    return [x for x in xs if x is not None]


def _extra_names(slopes, sinks, seed):
    return [n for n, x in (("slopes", slopes), ("sinks", sinks), ("seed", seed)) if x is not None]


def _varlen_call(attrs, q, k, v, cu_q, cu_k, slopes, sinks, seed):
    _ffi.register()

    def plain(q, k, v, *rest):  # results shaped from the operands: a device's heads when split
        call = jax.ffi.ffi_call(VARLEN_FORWARD_TARGET,
                                (jax.ShapeDtypeStruct(q.shape[:2] + v.shape[2:], q.dtype),
                                 jax.ShapeDtypeStruct((q.shape[1], q.shape[0]), jnp.float32)),
                                vmap_method="expand_dims")  # the handler loops over the vmapped indices
        return call(q, k, v, *rest, **dict(attrs))
    operands = (q, k, v, cu_q, cu_k, *_optional(slopes, sinks, seed))
    names = ["q", "k", "v", "cu_q", "cu_k"] + _extra_names(slopes, sinks, seed)
    return _ffi.varying_like(_partition.call_plain(plain, _partition.VARLEN_ROLES, ("varlen_forward", attrs), names,
                                                   ["o", "lse"], operands, whole=seed is not None), operands)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _varlen_op(attrs, q, k, v, cu_q, cu_k, slopes, sinks, seed):
    return _varlen_call(attrs, q, k, v, cu_q, cu_k, slopes, sinks, seed)


def _varlen_op_fwd(attrs, q, k, v, cu_q, cu_k, slopes, sinks, seed):
    refuse_slopes_grad(slopes)
    q, k, v, cu_q, cu_k, slopes, sinks, seed = (None if x is None else x.value
                                                for x in (q, k, v, cu_q, cu_k, slopes, sinks, seed))
    o, lse = _varlen_call(attrs, q, k, v, cu_q, cu_k, slopes, sinks, seed)
    return (o, lse), (q, k, v, o, lse, cu_q, cu_k, slopes, sinks, seed)


def _varlen_op_bwd(attrs, res, cotangents):
    q, k, v, o, lse, cu_q, cu_k, slopes, sinks, seed = res
    primals = (q, k, v, sinks)  # the cotangents' types (_ffi.typed_like; v is widened below)
    do, dlse = cotangents
    with_lse = not isinstance(dlse, SymbolicZero)
    if with_lse and seed is not None:  # lse's cotangent rides on dP, which dropout scales
        raise NotImplementedError("a gradient through lse with dropout (dropout_p > 0) is not supported")
    v, o, do = _cotangents_as_values(v, o, do, dlse.T if with_lse else None)  # lse [Hq, total_q]
    _ffi.register()

    def plain(*xs):  # results shaped from the operands: a device's heads when split
        shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs[:3]]
        if sinks is not None:
            shapes.append(jax.ShapeDtypeStruct((xs[0].shape[1],), jnp.float32))
        return jax.ffi.ffi_call(VARLEN_BACKWARD_TARGET, tuple(shapes), vmap_method="expand_dims")(*xs, **dict(attrs))
    operands = (q, k, v, o, lse, do, cu_q, cu_k, *_optional(slopes, sinks, seed))
    names = ["q", "k", "v", "o", "lse", "do", "cu_q", "cu_k"] + _extra_names(slopes, sinks, seed)
    outs = _ffi.varying_like(_partition.call_plain(
        plain, _partition.VARLEN_ROLES, ("varlen_backward", attrs), names,
        ["dq", "dk", "dv"] + (["dsink"] if sinks is not None else []), operands, whole=seed is not None), operands)
    dq, dk, dv = outs[:3]
    dsink = outs[3] if sinks is not None else None
    if with_lse:
        dv = dv[..., :-1]
        if sinks is not None:  # lse's cotangent reaches the sink directly (as in _attention.py)
            dsink = dsink + jnp.sum(jnp.exp(sinks[:, None] - lse) * dlse, axis=1)
    dq, dk, dv, dsink = (_ffi.typed_like(ct, x) for ct, x in zip((dq, dk, dv, dsink), primals))
    return dq, dk, dv, None, None, None, dsink, None


_varlen_op.defvjp(_varlen_op_fwd, _varlen_op_bwd, symbolic_zeros=True)
_varlen_op_jit = jax.jit(_varlen_op, static_argnums=0)  # works in an eager shard_map (_attention._op_jit)


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, *,
                     causal=False, window=None, softcap=None, scale=None, alibi_slopes=None,
                     diag_offset=None, return_lse=False, threads=0, sinks=None, dropout_p=None, seed=None,
                     dropout_offset=None):
    """Attention over a packed batch of sequences of different lengths (as
    flash_attn_varlen_func), differentiable in q, k, v and sinks (jax.custom_vjp; sinks [Hq]
    as in attention).

    q [total_q, Hq, D], k [total_k, Hk, D], v [total_k, Hk, Dv]; cu_seqlens_q/k int
    [batch + 1] prefix sums (sequence b: rows cu[b]:cu[b+1]), int32 operands of the call.
    Masks apply within each sequence, bottom-right at its own Sk_b - Sq_b (diag_offset
    overrides). max_seqlen_q/k optional (checked when given and the lengths are concrete).
    Returns o [total_q, Hq, Dv], and lse [Hq, total_q] f32 with return_lse. jit and grad;
    vmap runs one library call per mapped index. dropout_p, seed, dropout_offset: as in
    attention (b, i, j counting within each sequence); under vmap with one seed, mapped index
    n's sequences are b = n * batch + s, the masks of one packed batch of every index's
    sequences in turn (nested vmaps: n the flattened index), forward and backward alike; a
    vmapped seed gives each index its own masks from b = s."""
    return_lse = flag("return_lse", return_lse)
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    check_varlen_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape))
    dtype = _dtype(q, k, v, names=("q", "k", "v"))
    cu_q = _lengths("cu_seqlens_q", cu_seqlens_q, 1, "[batch + 1]")
    cu_k = _lengths("cu_seqlens_k", cu_seqlens_k, 1, "[batch + 1]")
    if cu_q.shape != cu_k.shape or cu_q.shape[0] < 1:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must both be [batch + 1], got shapes "
                         f"{tuple(cu_q.shape)} and {tuple(cu_k.shape)}")
    if diag_offset is not None and (isinstance(diag_offset, bool) or not hasattr(diag_offset, "__index__")):
        raise ValueError(f"diag_offset must be an integer, got {diag_offset!r}")
    slopes = _slopes(alibi_slopes, q.shape[1])
    sinks = _sinks(sinks, q.shape[1])
    attrs = _attributes(causal, window, softcap, scale, slopes is not None, threads, sinks is not None)
    diag_offset = problem_diag_offset(diag_offset, causal, window, slopes is not None, False, takes_masks=False)
    attrs.update(has_diag_offset=np.int64(diag_offset is not None),
                 diag_offset=np.int64(0 if diag_offset is None else _int("diag_offset", diag_offset)))
    drop = _dropout(dropout_p, seed, dropout_offset).get("dropout_p", 0.0)
    attrs.update(dropout_p=np.float32(drop))
    seed_operand = seed_words(drop, seed, dropout_offset)
    host_q, host_k = _concrete(cu_q), _concrete(cu_k)
    if host_q is None or host_k is None:  # traced lengths: no bound to compare with, but the one
        for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):  # integer rule
            if m is not None and not is_tracer(m):  # a traced bound is not read
                _int(name, m)
    if host_q is not None and host_k is not None:  # the library's verdict now, as ValueError
        check_max_seqlen("max_seqlen_q", max_seqlen_q, host_q)
        check_max_seqlen("max_seqlen_k", max_seqlen_k, host_k)
        p = varlen_problem(q_shape=q.shape, k_shape=k.shape, v_shape=v.shape, q_stride=_dense(q.shape),
                           k_stride=_dense(k.shape), v_stride=_dense(v.shape),
                           o_stride=_dense(q.shape[:2] + v.shape[2:]), dtype=dtype, cu_seqlens_q=host_q,
                           cu_seqlens_k=host_k, causal=causal, window=_window(window), softcap=softcap,
                           scale=scale, alibi=slopes is not None, diag_offset=diag_offset, sinks=sinks is not None,
                           dropout=(drop, 0, None) if drop else (None, None, None))  # the seed: no part of a verdict
        _native.cached_plan(p, _library_options("cpu"))
    if host_q is not None and host_k is not None and 0 in (q.shape[0], k.shape[0], q.shape[1]):
        # no rows, keys or heads, and lengths the library has judged above: filled here, outside
        # the XLA call (traced lengths go to the call, which judges them as it runs)
        o = jnp.zeros(q.shape[:2] + v.shape[2:], q.dtype)
        lse = jnp.full((q.shape[1], q.shape[0]), -jnp.inf, jnp.float32)
        if sinks is not None:  # rows without keys: lse = sink, o = 0 with a zero derivative in the sink
            lse = jnp.broadcast_to(sinks[:, None], lse.shape)
            o = o + _zero_along_heads(sinks, o.shape, 1).astype(q.dtype)
    else:
        # one varying-axis type for all operands: a replicated sinks gets its gradient summed
        operands = _ffi.vary_together(q, k, v, cu_q, cu_k, slopes, sinks, seed_operand)
        o, lse = _varlen_op_jit(tuple(sorted(attrs.items())), *operands)
    return (o, lse) if return_lse else o


# ---- kv-cache decoding -----------------------------------------------------------------

def kvcache_attention(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None, *,
                      causal=False, window=None, softcap=None, scale=None, alibi_slopes=None,
                      return_lse=False, threads=0, sinks=None, cache_dtype=None, k_scale=None, v_scale=None,
                      k_prefix=None, v_prefix=None):
    """One decoding step against a kv cache (as flash_attn_with_kvcache), functional: returns
    (o, k_cache, v_cache) with the new tokens written into the returned caches, or
    (o, lse, k_cache, v_cache) with return_lse. Not differentiable.

    q [B, Sq_new, Hq, D]; k_cache, v_cache [B, S_cache_max, Hk, D] (Dv for v), or with
    block_table (int [B, max_pages]) paged [num_pages, page_size, Hk, D]; cache_seqlens
    int [B] (an int: a Python or numpy integer or a 0-d integer array, traced too, for every
    sequence; or None for full caches); k, v [B, Sq_new, Hk, D] the new tokens,
    appended at positions cache_seqlens[b]... Masks align bottom-right per sequence. o
    [B, Sq_new, Hq, Dv], lse [B, Hq, Sq_new] f32. With new tokens the caches alias the
    results: under jax.jit with the caches donated the update is in place; otherwise XLA
    copies them. Without, the caches come back as given. threads: CPU threads (0: default).
    sinks [Hq]: as in attention (the split-KV chunks merge without them; they join once).

    Donated caches and bad lengths: lengths known at trace time (Python ints, numpy or
    concrete arrays, even under jit) are judged then, before anything runs, so a bad one
    raises ValueError and the donated caches stay intact. With traced lengths the problem is
    still planned at trace time, from the capacities (lengths per call), so what does not
    depend on the length values (page size, a quantized cache with a prefix, more new tokens
    than the cache holds) raises ValueError then too. Lengths that are traced (jit
    arguments) can only be judged when the call runs, after XLA has handed the donated
    buffers to it: the call then raises naming the argument, and the donated caches are
    gone (XLA deletes a donated argument whatever the outcome). So with a bad scale (NaN,
    inf, negative) in a row the call reads or a non-finite new token to quantize, whatever the
    lengths: they are data, judged when the call runs. Pass lengths you have not checked as
    concrete values, or do not donate the caches.

    cache_dtype "int8" or "fp8" (docs/caches.md): k_cache, v_cache hold jnp.int8 or
    jnp.float8_e4m3fn codes (flashattn.jax.quantize_cache makes them) and k_scale, v_scale
    (float32, the caches' shape without head_dim) a scale per row and kv head; new k, v are
    quantized on append, and the updated scales come back after the caches: (o, k_cache,
    v_cache, k_scale, v_scale), or (o, lse, k_cache, v_cache, k_scale, v_scale).

    k_prefix, v_prefix [P, Hk, D] / [.., Dv] (q's dtype): a shared prefix (cascade) that every
    sequence attends to first (positions 0 .. P - 1, its own cache at P + t), read once per
    call, as numpy's kvcache_attention; operands of the call (traced arrays too)."""
    return_lse = flag("return_lse", return_lse)
    q, k_cache, v_cache = jnp.asarray(q), jnp.asarray(k_cache), jnp.asarray(v_cache)
    code = cache_dtype_code(cache_dtype)
    if code is None and (k_scale is not None or v_scale is not None):
        raise ValueError("k_scale and v_scale belong to a quantized cache: pass cache_dtype='int8' or 'fp8'")
    if (k is None) != (v is None):
        raise ValueError("k and v (the new tokens) go together: pass both or neither")
    arrays, names = [q, k_cache, v_cache], ["q", "k_cache", "v_cache"]
    if k is not None:
        k, v = jnp.asarray(k), jnp.asarray(v)
        arrays += [k, v]
        names += ["k", "v"]
    for name, x in zip(names, arrays):
        if x.ndim != 4:
            raise ValueError(f"{name} must have rank 4, got shape {tuple(x.shape)}")
    if code is not None:
        want = jnp.dtype(jnp.int8 if code == _native.INT8 else jnp.float8_e4m3fn)
        for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
            if jnp.dtype(c.dtype) != want:
                raise ValueError(f"{name} must hold {want} codes with cache_dtype={cache_dtype!r}, got {c.dtype}")
        shp = tuple(k_cache.shape[:3])
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if s is None:
                raise ValueError(f"{name} is required with a quantized cache_dtype: float32 of shape {shp}")
            if tuple(jnp.shape(s)) != shp:
                raise ValueError(f"{name} must have shape {shp} (the cache's rows and kv heads), got "
                                 f"{tuple(jnp.shape(s))}")
        k_scale, v_scale = jnp.asarray(k_scale), jnp.asarray(v_scale)
        check_scale_dtype("k_scale", k_scale.dtype)
        check_scale_dtype("v_scale", v_scale.dtype)
        arrays, names = [a for a, n in zip(arrays, names) if n not in ("k_cache", "v_cache")], \
            [n for n in names if n not in ("k_cache", "v_cache")]
    dtype = _dtype(*arrays, names=names)
    if k_prefix is not None and v_prefix is not None:
        k_prefix, v_prefix = jnp.asarray(k_prefix), jnp.asarray(v_prefix)
    k_prefix, v_prefix, P = check_prefix(k_prefix, v_prefix, tuple(k_cache.shape), tuple(v_cache.shape), q.dtype)
    paged = block_table is not None
    check_decode_shapes(tuple(q.shape), tuple(k_cache.shape), tuple(v_cache.shape),
                        None if k is None else (tuple(k.shape), tuple(v.shape)), paged)
    B = q.shape[0]
    table = None
    if paged:
        table = _lengths("block_table", block_table, 2, "[batch, max_pages]")
        if table.shape[0] != B:
            raise ValueError(f"block_table must have shape [batch, max_pages] with batch = {B}, got {tuple(table.shape)}")
    capacity = table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    if cache_seqlens is None:
        cache_seqlens = capacity
    if isinstance(cache_seqlens, jax.Array) and cache_seqlens.ndim == 0:  # an int as a JAX scalar
        if not jnp.issubdtype(cache_seqlens.dtype, jnp.integer):  # (a scan's step counter): every sequence's
            raise ValueError(f"cache_seqlens must be an int or integers [batch], got dtype {cache_seqlens.dtype}")
        if isinstance(cache_seqlens, jax.core.Tracer):  # traced: broadcast as an operand
            cache_seqlens = jnp.broadcast_to(cache_seqlens.astype(jnp.int32), (B,))
        else:  # concrete: as a Python int, planned now
            cache_seqlens = int(cache_seqlens)
    if np.ndim(cache_seqlens) == 0 and not isinstance(cache_seqlens, jax.Array):
        if isinstance(cache_seqlens, bool) or not hasattr(cache_seqlens, "__index__"):
            raise ValueError(f"cache_seqlens must be an int or integers [batch], got {cache_seqlens!r}")
        if not -(2**31) <= int(cache_seqlens) < 2**31:
            raise ValueError(f"cache_seqlens values must fit int32, got {int(cache_seqlens)}")
        cache_seqlens = np.full((B,), int(cache_seqlens), np.int32)  # concrete even under jit
    host = _concrete(cache_seqlens)  # before any jnp op, which under jit would trace it
    lens = _lengths("cache_seqlens", cache_seqlens, 1, f"[batch] = [{B}]")
    if tuple(lens.shape) != (B,):
        raise ValueError(f"cache_seqlens must have shape [batch] = [{B}], got {tuple(lens.shape)}")
    slopes = _slopes(alibi_slopes, q.shape[2])
    sinks = _sinks(sinks, q.shape[2])
    attrs = _attributes(causal, window, softcap, scale, slopes is not None, threads, sinks is not None)
    # The library's verdict now, as ValueError, before anything runs (donated caches intact):
    # with concrete lengths on them too; with traced ones a plan from the capacities (lengths
    # per call, docs/semantics.md), whose verdict depends on shapes and options alone (page
    # size, quantized cache with a prefix, more new tokens than the cache holds...), leaving
    # only the lengths themselves to the call ("Donated caches and bad lengths" below).
    o_shape = q.shape[:3] + v_cache.shape[3:]
    p = decode_problem(q_shape=q.shape, kc_shape=k_cache.shape, vc_shape=v_cache.shape,
                       q_stride=_dense(q.shape), kc_stride=_dense(k_cache.shape),
                       vc_stride=_dense(v_cache.shape), o_stride=_dense(o_shape), dtype=dtype,
                       cache_seqlens=host, has_new_kv=k is not None,
                       max_pages=None if table is None else table.shape[1], causal=causal,
                       window=_window(window), softcap=softcap, scale=scale, alibi=slopes is not None,
                       sinks=sinks is not None, lengths_per_call=host is None, shared_prefix_len=P,
                       cache_dtype=code)
    _native.cached_plan(p, _library_options("cpu"))
    _ffi.register()
    ng = lambda x, name: _no_grad(x, f"kvcache_attention's {name}")  # noqa: E731
    operands, names = [ng(q, "q"), ng(k_cache, "k_cache"), ng(v_cache, "v_cache"), lens], ["q", "k_cache", "v_cache",
                                                                                          "lens"]
    if k is not None:
        operands += [ng(k, "k"), ng(v, "v")]
        names += ["k", "v"]
    if table is not None:
        operands.append(table)
        names.append("table")
    if slopes is not None:
        operands.append(ng(slopes, "alibi_slopes"))
        names.append("slopes")
    if sinks is not None:
        operands.append(ng(sinks, "sinks"))
        names.append("sinks")
    if code is not None:  # last, as the handler reads them (jax_ffi_inference.c)
        operands += [ng(k_scale, "k_scale"), ng(v_scale, "v_scale")]
        names += ["k_scale", "v_scale"]
    if k_prefix is not None:  # after the scales (jax_ffi_inference.c)
        operands += [ng(k_prefix, "k_prefix"), ng(v_prefix, "v_prefix")]
        names += ["k_prefix", "v_prefix"]
    out_names = ["o", "lse"] + (["k_cache", "v_cache"] + (["k_scale", "v_scale"] if code is not None else [])
                                if k is not None else [])
    call_attrs = dict(has_new_kv=np.int64(k is not None), paged=np.int64(paged), cache_dtype=np.int64(code or 0),
                      has_prefix=np.int64(k_prefix is not None), **attrs)

    # A split along the batch needs concrete lengths, judged now: traced ones are judged by
    # the call, and a bad length on one device's batch items alone would fail that device
    # while its peers wait for it in the next collective (XLA then aborts the process); a
    # split along the heads gives every device every length, so all fail alike.
    def plain(*xs):  # results shaped from the operands: a device's batch items or heads when split
        q, kc, vc = xs[:3]
        results = [jax.ShapeDtypeStruct(q.shape[:3] + vc.shape[3:], q.dtype),
                   jax.ShapeDtypeStruct((q.shape[0], q.shape[2], q.shape[1]), jnp.float32)]
        aliases = None
        if k is not None:  # the updated caches, aliased to the cache arguments
            results += [jax.ShapeDtypeStruct(kc.shape, kc.dtype), jax.ShapeDtypeStruct(vc.shape, vc.dtype)]
            aliases = {1: 2, 2: 3}
            if code is not None:  # and the scales, the last two arguments before a prefix
                n_args = names.index("k_scale")
                results += [jax.ShapeDtypeStruct(xs[n_args].shape, jnp.float32)] * 2
                aliases.update({n_args: 4, n_args + 1: 5})
        return jax.ffi.ffi_call(KVCACHE_TARGET, tuple(results), input_output_aliases=aliases,
                                vmap_method="sequential")(*xs, **call_attrs)
    outs = _ffi.varying_like(_partition.call_plain(
        plain, _partition.kvcache_roles(paged, set(names) | set(out_names)), ("kvcache", tuple(sorted(call_attrs.items()))),
        names, out_names, operands, whole=("b",) if paged or host is None else ()), operands)
    o, lse = outs[:2]
    kc, vc = outs[2:4] if k is not None else (k_cache, v_cache)  # read only: the caches as given
    if code is not None:
        ks, vs = outs[4:6] if k is not None else (k_scale, v_scale)
        return (o, lse, kc, vc, ks, vs) if return_lse else (o, kc, vc, ks, vs)
    return (o, lse, kc, vc) if return_lse else (o, kc, vc)


def quantize_cache(k, v, dtype):
    """flashattn.quantize_cache for JAX arrays (computed on the host): (k_codes, k_scale,
    v_codes, v_scale), codes jnp.int8 or jnp.float8_e4m3fn, scales float32 (docs/caches.md)."""
    from .._quant import quantize_cache as quantize
    if any(isinstance(x, jax.core.Tracer) for x in (k, v)):
        raise TypeError("flashattn.jax.quantize_cache runs on the host and cannot be traced (jit, vmap, grad): "
                        "call it outside the traced function; inside one, kvcache_attention's appends "
                        "quantize new tokens (cache_dtype=)")
    # jnp.asarray first: JAX's own conversions (lists; float64 is float32 with x64 off)
    kq, ks, vq, vs = quantize(np.asarray(jnp.asarray(k)), np.asarray(jnp.asarray(v)), dtype)
    code = jnp.int8 if quantize_dtype_code(dtype) == _native.INT8 else jnp.float8_e4m3fn
    return (jnp.asarray(kq.view(np.uint8)).view(code), jnp.asarray(ks), jnp.asarray(vq.view(np.uint8)).view(code),
            jnp.asarray(vs))
