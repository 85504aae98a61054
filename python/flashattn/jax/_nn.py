"""flashattn.jax.dot_product_attention: jax.nn.dot_product_attention's signature and
semantics on flashattn's kernels, so that switching is a change of name.

Each jax.nn argument maps onto the library's problem: [B, T, N, H] is the "bshd" layout,
GQA is the library's own (query head n reads kv head n // (N / K), as jax.nn groups them),
is_causal and local_window_size align top-left (diag_offset 0), a boolean mask goes as a
0 / -inf bias, a bias of any dtype is added in float32 (a boolean one as 0 / 1, as jax.nn
adds it), and the sequence lengths become segment ids (query rows past their length and
keys past theirs in segments that match nothing).

The one place where jax.nn and the library differ is a row with no visible key: the
library gives o = 0 and lse = -inf (docs/nonfinite.md); jax.nn replaces every hidden score
by a large finite negative number, so such a row is the uniform average of all S values,
and its lse is that number plus log S (rows past query_seq_lengths are then zeroed). The
drop-in follows jax.nn, from the library's lse (docs/python.md, "## JAX").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ._attention import call, truth


def _ensure_4d(t):
    t = jnp.asarray(t)
    return jnp.expand_dims(t, axis=tuple(range(4 - t.ndim))) if t.ndim < 4 else t


def _check(t, shape, dtype, name):
    """jax.nn's own checks, with its messages."""
    if t is None:
        return
    if t.ndim != len(shape):
        raise ValueError(f"{name} ndim should be {len(shape)}, but got {t.ndim}")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name} dtype should be {dtype}, but got {t.dtype}")
    for i in range(t.ndim):
        if shape[i] != -1 and t.shape[i] != shape[i]:
            raise ValueError(f"{name} shape should be {shape}: but got {t.shape}")


def _window_mask(T, S, left, right):
    """jax.nn's window rule, for sides the library's window cannot say (negative ones)."""
    i, j = jnp.arange(T)[:, None], jnp.arange(S)[None, :]
    return ((i <= j + left) & (i >= j - right))[None, None]


def _large_negative():
    """jax.nn's stand-in for a hidden score: logits are float32 for every dtype flashattn takes."""
    return np.float32(-0.7 * np.finfo(np.float32).max)


def _traced(x):
    """Whether x has no value at trace time (a tracer, or an array holding one)."""
    try:
        float(x)
        return False
    except (TypeError, jax.errors.ConcretizationTypeError):
        return isinstance(x, jax.core.Tracer) or isinstance(jnp.asarray(x), jax.core.Tracer)


def dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                          query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
                          implementation=None, return_residual=False):
    """jax.nn.dot_product_attention on flashattn's kernels: the same arguments, shapes and
    results (see its docstring): query [B, T, N, H] (or [T, N, H]), key and value
    [B, S, K, H] with N a multiple of K; bias and mask broadcastable to [B, N, T, S] (mask
    boolean, True = attend); is_causal and local_window_size=(left, right) aligned
    top-left; query_seq_lengths, key_value_seq_lengths int32 [B]. implementation None or
    "xla" (both run flashattn; "cudnn" raises ValueError). return_residual: (out, lse) with
    lse [B, T, N] in key's dtype, not differentiated, as jax.nn returns it. Rows with no
    visible key follow jax.nn (the mean of all values; lse -0.7 * float32 max + log S).
    float32, float16 and bfloat16 only. Differentiable in query, key, value and bias, and in a
    traced scale (it then multiplies query)."""
    if implementation == "cudnn":
        raise ValueError("flashattn.jax.dot_product_attention runs flashattn's kernels; implementation='cudnn' "
                         "is jax.nn's cuDNN path: call jax.nn.dot_product_attention for it")
    if implementation not in (None, "xla"):
        raise ValueError(f"Unsupported implementation option: {implementation}")
    output_shape = jnp.asarray(query).shape
    q, k, v = _ensure_4d(query), _ensure_4d(key), _ensure_4d(value)
    bias = None if bias is None else _ensure_4d(bias)
    mask = None if mask is None else _ensure_4d(mask)
    q_len = None if query_seq_lengths is None else jnp.asarray(query_seq_lengths)
    kv_len = None if key_value_seq_lengths is None else jnp.asarray(key_value_seq_lengths)
    B, S, K, H = k.shape
    _check(v, [B, S, K, H], k.dtype, "value")
    _check(q, [B, -1, -1, H], k.dtype, "query")
    _check(mask, [-1] * 4, np.dtype(bool), "mask")
    _check(bias, [-1] * 4, None, "bias")
    _check(q_len, [B], np.dtype("int32"), "query_seq_lengths")
    _check(kv_len, [B], np.dtype("int32"), "key_value_seq_lengths")
    if jnp.dtype(k.dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16)):
        # in the drop-in's names (flashattn's own check below would name q, k and v)
        raise ValueError(f"query, key and value dtype should be float32, float16 or bfloat16 on flashattn's "
                         f"kernels, but got {k.dtype}")
    T, N = q.shape[1], q.shape[2]
    if K == 0 or N % K != 0:
        raise ValueError(f"The number of query heads must be a multiple of key/value heads, but got {N} vs {K}")
    if bias is not None:
        bias = bias.astype(jnp.float32)  # jax.nn adds it to float32 logits, a boolean one as 0 / 1

    window = None
    if local_window_size is not None and not isinstance(local_window_size, (tuple, list)):
        local_window_size = (local_window_size, local_window_size)  # an int, or a traced scalar
    if local_window_size is not None:
        sides = tuple(local_window_size)
        if any(_traced(w) for w in sides):  # a traced side (a jit argument): jax.nn's rule as a mask
            w = _window_mask(T, S, *sides)
            mask = w if mask is None else mask & w
        else:
            left, right = (int(w) for w in sides)
            if left >= 0 and right >= 0:
                window = (left, right)
            else:  # a side jax.nn allows that the library's window has no word for
                w = _window_mask(T, S, left, right)
                mask = w if mask is None else mask & w
    q_seg = kv_seg = None
    if q_len is not None or kv_len is not None:
        # padding as segment ids: valid rows and keys in segment 0, padded query rows in 1
        # and padded keys in 2, so a padded row sees nothing and a padded key is seen by none
        q_seg = jnp.zeros((B, T), jnp.int32) if q_len is None else \
            jnp.where(jnp.arange(T)[None, :] < q_len[:, None], 0, 1).astype(jnp.int32)
        kv_seg = jnp.zeros((B, S), jnp.int32) if kv_len is None else \
            jnp.where(jnp.arange(S)[None, :] < kv_len[:, None], 0, 2).astype(jnp.int32)
    if isinstance(scale, (bool, np.bool_)) or (str(getattr(scale, "dtype", "")) == "bool" and not _traced(scale)):
        scale = float(scale)  # jax.nn takes a bool (a 0-d bool array too) as the number it is
    if scale is not None and _traced(scale):
        # a traced scale (a jit argument, a learned temperature): the library takes its scale
        # as a static number, so the scale multiplies q instead (jax.nn multiplies the f32
        # logits; in q's dtype this adds one rounding of q) and JAX differentiates it there
        s = jnp.asarray(scale, jnp.float32)
        if s.shape != ():
            raise ValueError(f"scale must be a scalar, got shape {s.shape}")
        q, scale = (q.astype(jnp.float32) * s).astype(q.dtype), 1.0
    is_causal = truth("is_causal", is_causal)  # as jax.nn takes it
    aligned = is_causal or window is not None
    o, lse = call(q, k, v, causal=is_causal, window=window, scale=scale, bias=bias, mask=mask,
                  q_segment_ids=q_seg, kv_segment_ids=kv_seg, layout="bshd", return_lse=True,
                  diag_offset=0 if aligned else None)
    lse = jax.lax.stop_gradient(jnp.swapaxes(lse, 1, 2))  # [B, T, N]
    empty = jnp.isneginf(lse)
    uniform = empty if q_len is None else empty & (jnp.arange(T)[None, :] < q_len[:, None])[:, :, None]
    if S > 0:
        # each kv head's mean for its group of query heads, the heads split as [K, N // K]
        # (reshapes, not jnp.repeat: under Explicit mesh axes a repeat along sharded heads
        # asks for an out_sharding, and these reshapes keep the heads' split)
        mean_v = jnp.mean(v.astype(jnp.float32), axis=1)[:, None, :, None, :]  # [B, 1, K, 1, H]
        grouped = (B, T, K, N // K)
        o = jnp.where(uniform.reshape(grouped)[..., None], mean_v.astype(o.dtype),
                      o.reshape(grouped + o.shape[-1:])).reshape(o.shape)
    if not return_residual:
        return jnp.reshape(o, output_shape)
    if S == 0:  # jax.nn's logsumexp over no keys at all: -inf in every row
        fill = -np.inf
    else:  # rows whose keys are all masked: logsumexp of S large negative logits
        fill = _large_negative() + np.log(np.float32(S), dtype=np.float32)
    residual = jnp.where(empty, fill, lse).astype(k.dtype)
    return jnp.reshape(o, output_shape), jnp.reshape(residual, output_shape[:-1])
