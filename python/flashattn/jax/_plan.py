"""Plans for JAX arguments: flashattn.plan from arrays or ShapeDtypeStructs (shapes only)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._layout import to_bhsd
from .._plan import plan as _plan

_DTYPE_NAMES = {jnp.dtype(jnp.float32): "f32", jnp.dtype(jnp.float16): "f16", jnp.dtype(jnp.bfloat16): "bf16"}


def platform_backend(backend=None):
    """The library backend for a JAX platform: "cpu" on the CPU, "cuda" on GPUs (and for
    accelerators the library has no backend of its own, whose tile schedule is closest to
    the CUDA kernels'). An explicit "cpu", "cuda" or "auto" wins."""
    if backend is not None:
        return backend
    return "cpu" if jax.default_backend() == "cpu" else "cuda"


def plan_for(opt, q, k, v, bias, *, backend=None, bias_grad=False, masked=False, mask=None):
    """The library's plan for one call of the op (opt: _ffi.Options; bias: the op's bias,
    a boolean mask included; masked: a boolean mask is part of it, so the plan is not exact;
    mask: a flashattn.masks mask, planned exactly); ValueError with the library's message
    if it rejects the problem."""
    qb, kb, vb = (to_bhsd(opt.layout, tuple(x.shape)) for x in (q, k, v))
    try:
        dtype = _DTYPE_NAMES[jnp.dtype(q.dtype)]
    except KeyError:
        raise ValueError(f"q must be float32, float16 or bfloat16, got {q.dtype}") from None
    p = _plan(batch=qb[0], heads=qb[1], seq_q=qb[2], head_dim=qb[3], seq_k=kb[2], head_dim_v=vb[3],
                 kv_heads=kb[1], dtype=dtype, causal=opt.causal, window=opt.window, softcap=opt.softcap,
                 scale=opt.scale, bias_shape=None if bias is None else tuple(bias.shape), alibi=opt.has_alibi,
                 segment_ids=opt.has_segment_ids, backend=platform_backend(backend),
                 diag_offset=opt.diag_offset, bias_scale=opt.bias_scale, bias_grad=bias_grad, threads=opt.threads,
                 sinks=opt.has_sinks, mask=mask, dropout_p=opt.dropout_p,
                 seed=0 if opt.dropout_p > 0 else None)  # the seed is an operand: its value changes nothing
    p.exact = p.exact and not masked
    return p
