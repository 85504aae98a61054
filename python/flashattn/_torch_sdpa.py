"""flashattn.torch.scaled_dot_product_attention: torch.nn.functional.scaled_dot_product_attention's
signature and semantics on flashattn's kernels (docs/python.md, "PyTorch").

SDPA's rules, as the installed torch applies them: query (..., Hq, L, E), key (..., Hk, S,
E), value (..., Hv, S, Ev), leading dims broadcast against each other; heads broadcast where
one side has 1, and differ otherwise only with enable_gqa (Hq a multiple of Hk and of Hv,
which may differ); is_causal aligns top-left; a bool attn_mask is True = attend, a float one
is added, either broadcastable to (..., Hq, L, S); a row with no visible key gives 0 (torch
2.x CPU, both for a bool mask and a -inf float one), which is flashattn's own rule. Errors
SDPA raises as RuntimeError are raised as RuntimeError with its wording, and dtypes the
library does not compute in raise ValueError naming those it does. dropout_p > 0 is
flashattn's dropout (docs/semantics.md, "Dropout"), applied whenever it is given, as SDPA
applies it: its seed is drawn from torch's default generator (flashattn.torch.dropout_seed),
so torch.manual_seed reproduces it; the mask is not torch's own (SDPA's CPU dropout draws
another one)."""
import math

import torch

from ._torch_args import (autocast, check_dense, check_devices, check_floats, dropout_p_arg, expand_seq_dims,
                          float_or_none, mask_to_bias)
from ._torch_ops import attention_function, seed_tensor


def _as_4d(t, batch, heads):
    """t (..., h, S, E) expanded to batch + (heads, S, E) and folded to [B, heads, S, E]
    (a view where the leading dims allow it)."""
    t = t.expand(*batch, heads, *t.shape[-2:])
    return t.reshape(math.prod(batch), heads, *t.shape[-2:])


def _heads(hq, hk, hv, enable_gqa):
    """(output heads, key/value heads) by SDPA's rules. With enable_gqa, key and value may
    each have their own count, each dividing Hq (SDPA repeats each to Hq): the library's kv
    heads are then their least common multiple (a divisor of Hq), to which _kv_heads repeats
    each."""
    if enable_gqa and not hq == hk == hv:
        if 0 in (hk, hv) or hq % hk or hq % hv:
            raise RuntimeError("Number of heads in key and value must divide the number of heads in query")
        return hq, math.lcm(hk, hv)
    h = max(hq, hk, hv)
    for a, b in ((hq, hk), (hq, hv), (hk, hv)):
        if a != b and 1 not in (a, b):
            raise RuntimeError(f"The size of tensor a ({a}) must match the size of tensor b ({b}) at "
                               "non-singleton dimension 1 (heads; GQA needs enable_gqa=True)")
    return h, (1 if hk == hv == 1 else h)


def _kv_heads(t, heads):
    """t (..., h, S, E) with each head repeated heads / h times in place (torch's
    repeat_interleave, as SDPA's enable_gqa repeats key and value): query head i then reads
    head i // (Hq / h) of t. A stride-0 view (no copy) where h is 1 or heads; otherwise a
    copy, the size of the larger of key and value."""
    h = t.shape[-3]
    if h == heads:
        return t
    t = t.unsqueeze(-3).expand(*t.shape[:-2], heads // h, *t.shape[-2:])
    return t.flatten(-4, -3)


def _mask_bias(attn_mask, query, out_batch, H, L, S):
    """attn_mask as the library's bias [B or 1, H or 1, L or 1, S] (f32), broadcast dims kept as
    size 1 or stride-0 views, as SDPA broadcasts it against its output."""
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point() or (
            attn_mask.is_floating_point() and attn_mask.dtype not in (torch.float32, query.dtype)):
        raise RuntimeError("Expected attn_mask dtype to be bool or float or to match query dtype, but got "
                           f"attn_mask.dtype: {attn_mask.dtype} and query.dtype: {query.dtype} instead.")
    out = tuple(out_batch) + (H, L, S)
    # leading size-1 dims past the output's broadcast away, as torch's broadcasting does
    extra = attn_mask.dim() - len(out)
    fits = extra <= 0 or all(n == 1 for n in attn_mask.shape[:extra])
    shape = tuple(attn_mask.shape[max(extra, 0):])
    if fits:
        try:
            fits = torch.broadcast_shapes(shape, out) == out
        except RuntimeError:  # torch's message names the arguments' indices, not attn_mask
            fits = False
    if not fits:
        raise RuntimeError(f"attn_mask of shape {list(attn_mask.shape)} does not broadcast to the "
                           f"attention's shape {list(out)}")
    m = mask_to_bias(attn_mask, "attn_mask") if attn_mask.dtype == torch.bool else attn_mask.to(torch.float32)
    m = m.reshape(shape)
    m = m.reshape((1,) * (len(out) - m.dim()) + tuple(m.shape))
    lead = tuple(m.shape[:-3])
    if any(n != 1 for n in lead):  # per-batch masks: fold the leading dims as q's are
        m = m.expand(*out_batch, *m.shape[-3:]).reshape(math.prod(out_batch), *m.shape[-3:])
    else:
        m = m.reshape(1, *m.shape[-3:])
    return expand_seq_dims(m, L, S)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False):
    """F.scaled_dot_product_attention on flashattn: same arguments, same results up to the
    dtype's rounding, gradients in query, key, value and a float attn_mask."""
    for name, t in (("query", query), ("key", key), ("value", value), ("attn_mask", attn_mask)):
        if not isinstance(t, torch.Tensor) and not (name == "attn_mask" and t is None):
            raise TypeError(f"scaled_dot_product_attention(): argument '{name}' must be Tensor, "
                            f"not {type(t).__name__}")
        if t is not None:
            check_dense(name, t)
    if min(query.dim(), key.dim(), value.dim()) < 2:
        raise RuntimeError("Expected query, key, and value to all be  at least 2 dimensional, but got "
                           f"query.dim: {query.dim()} key.dim: {key.dim()} and value.dim: {value.dim()} instead.")
    # first, as SDPA: mixed dtypes under autocast are one, and a float attn_mask (float64 aside)
    # takes autocast's dtype with them (a float32 one too: rounded to it, as SDPA's is)
    if attn_mask is None:
        query, key, value = autocast(query, key, value)
    else:
        query, key, value, attn_mask = autocast(query, key, value, attn_mask)
    if not (query.dtype == key.dtype == value.dtype):
        raise RuntimeError("Expected query, key, and value to have the same dtype, but got query.dtype: "
                           f"{query.dtype} key.dtype: {key.dtype} and value.dtype: {value.dtype} instead.")
    for name, x in (("dropout_p", dropout_p), ("scale", scale)):  # as torch's argument parser: a bool is a number
        if isinstance(x, (str, bytes)) or (x is None and name == "dropout_p"):
            raise TypeError(f"scaled_dot_product_attention(): argument '{name}' must be float, not {type(x).__name__}")
    dropout_p, scale = (float(x) if isinstance(x, bool) else x for x in (dropout_p, scale))
    for name, x in (("is_causal", is_causal), ("enable_gqa", enable_gqa)):  # as torch's argument parser: a bool
        if not isinstance(x, bool):  # ("False" and 2 were taken by their truth)
            kind = type(x).__name__ if type(x).__module__ == "builtins" or isinstance(x, torch.Tensor) else \
                f"{type(x).__module__}.{type(x).__name__}"
            raise TypeError(f"scaled_dot_product_attention(): argument '{name}' must be bool, not {kind}")
    dropout_p = dropout_p_arg(dropout_p)
    if is_causal and attn_mask is not None:
        raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True")
    check_floats(("query", "key", "value"), (query, key, value))
    check_devices(query, (("attn_mask", attn_mask),))
    (L, E), (S, Ek), (Sv, Ev) = query.shape[-2:], key.shape[-2:], value.shape[-2:]
    if Ek != E or Sv != S:
        raise RuntimeError(f"query (..., {L}, {E}), key (..., {S}, {Ek}) and value (..., {Sv}, {Ev}): "
                           "key and value must have one length and key query's embedding size")
    ndim = max(query.dim(), key.dim(), value.dim())
    q, k, v = (t.reshape((1,) * (max(ndim, 3) - t.dim()) + tuple(t.shape)) for t in (query, key, value))
    try:
        batch = torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    except RuntimeError:  # torch's message names the arguments' indices, not query, key and value
        raise RuntimeError(f"query of shape {list(query.shape)}, key of shape {list(key.shape)} and value of shape "
                           f"{list(value.shape)}: their batch dims (all but the last 3) do not broadcast") from None
    H, Hkv = _heads(q.shape[-3], k.shape[-3], v.shape[-3], enable_gqa)
    bias = None if attn_mask is None else _mask_bias(attn_mask, query, batch, H, L, S)
    if enable_gqa:  # key and value with their own head counts: each repeated to Hkv
        k, v = _kv_heads(k, Hkv), _kv_heads(v, Hkv)
    q4, k4, v4 = _as_4d(q, batch, H), _as_4d(k, batch, Hkv), _as_4d(v, batch, Hkv)
    # SDPA returns o in query's memory order: a [B, L, H, E] query viewed as [B, H, L, E] (the
    # usual proj(x).view(B, L, H, E).transpose(1, 2)) gets o alike, so that
    # o.transpose(1, 2).view(B, L, H * E) works, and so does an unbatched [L, H, E] one viewed
    # as [H, L, E]; the library writes it so, as "bshd"
    bshd = (query.dim() in (3, 4) and len(batch) == query.dim() - 3 and L > 1 and H > 1
            and query.stride(-3) < query.stride(-2))
    if bshd:
        q4, k4, v4 = q4.transpose(1, 2), k4.transpose(1, 2), v4.transpose(1, 2)
    o, _ = attention_function().apply(q4, k4, v4, bias, None, None, None, bool(is_causal), -1, -1, 0.0,
                                      float_or_none("scale", scale), "bshd" if bshd else "bhsd",
                                      0 if is_causal else None, None, 0, None, dropout_p,
                                      seed_tensor() if dropout_p > 0 else None)
    if bshd:
        o = o.transpose(1, 2)
    o = o.reshape(*batch, H, L, Ev)  # a view
    return o if ndim >= 3 else o.reshape(L, Ev)
