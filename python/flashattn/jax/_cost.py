"""flashattn.jax.cost_estimate: a Pallas CostEstimate from the library's analytic plan.

The drop-in for a Pallas kernel's cost_estimate=: it needs shapes only (arrays or
jax.ShapeDtypeStructs), plans in microseconds, and never traces, compiles or allocates
anything of the problem's size, unlike pl.estimate_cost(reference_attention, ...), which
traces the naive attention and counts a causal problem as if it were dense.
"""

from __future__ import annotations

import jax
import numpy as np

from .._problem import flag
from . import _attention
from ._attention import make_options
from ._plan import plan_for


class _Shape:
    """Anything with .shape (and .dtype) as the op's argument checks expect."""

    def __init__(self, shape, dtype=None):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.ndim = len(self.shape)


def _shaped(x):
    """x as a shape (and dtype), True (present) as it is, None or False (absent) as None."""
    if x is None or (isinstance(x, (bool, np.bool_)) and not x):
        return None
    if isinstance(x, (bool, np.bool_)):
        return True
    if not hasattr(x, "shape"):
        raise ValueError(f"expected an array or jax.ShapeDtypeStruct, got {type(x).__name__}")
    dtype = getattr(x, "dtype", None)
    # as JAX would hold it: float64 is float32 with jax_enable_x64 off, as in the calls themselves
    return _Shape(x.shape, None if dtype is None else jax.dtypes.canonicalize_dtype(dtype))


def _seed_for_check(x):
    """A seed or dropout_offset as plan takes it: a value is checked as attention checks it;
    a jax.ShapeDtypeStruct or True stands for one (its value changes no figure)."""
    return 0 if x is True or isinstance(x, jax.ShapeDtypeStruct) else x


def plan(q, k, v, *, causal=False, window=None, softcap=None, scale=None, bias=None, alibi_slopes=None,
         q_segment_ids=None, kv_segment_ids=None, layout="bshd", bias_grad=False, backend=None,
         diag_offset=None, bias_scale=None, mask=None, threads=0, sinks=None, dropout_p=None, seed=None,
         dropout_offset=None, return_lse=False):
    """The flashattn.Plan for a call of flashattn.jax.attention with these arguments
    (arrays or ShapeDtypeStructs). alibi_slopes, q_segment_ids, kv_segment_ids and sinks
    may also be given as True (present; their shapes are fixed by q, k). bias and a boolean
    mask may not (TypeError): their broadcast shape is part of the plan (the memory it
    counts), so give the array or a jax.ShapeDtypeStruct of it. With a boolean mask the
    plan is not exact: flops_useful counts the keys it hides (an upper bound); with a
    flashattn.masks or splash attention mask it is exact. dropout_p, seed and dropout_offset
    are checked as attention checks them (dropout_p > 0 needs a seed; a seed may be a
    jax.ShapeDtypeStruct or True) and change no figure, nor does return_lse (the forward
    writes lse either way)."""
    for name, x, what in (("bias", bias, "an array or a jax.ShapeDtypeStruct"),
                          ("mask", mask, "a boolean array, a jax.ShapeDtypeStruct, a flashattn.masks mask or a "
                                         "splash attention mask")):
        if isinstance(x, bool):
            raise TypeError(f"{name} must be {what}, got {x!r}: its broadcast shape ([1 or B, 1 or Hq, 1 or Sq, Sk]) "
                            "is part of the plan (its min_bytes and peak_bytes), so True cannot stand for it")
    fmask = _attention.mask_object(mask, _shaped(q), _shaped(k), _shaped(v), layout)
    mask = None if fmask is not None else mask
    q, k, v, bias, alibi_slopes, q_segment_ids, kv_segment_ids, mask, sinks = map(
        _shaped, (q, k, v, bias, alibi_slopes, q_segment_ids, kv_segment_ids, mask, sinks))
    opt, bias_shape = make_options(q, k, v, causal=causal, window=window, softcap=softcap, scale=scale, bias=bias,
                                   alibi_slopes=alibi_slopes, q_segment_ids=q_segment_ids,
                                   kv_segment_ids=kv_segment_ids, layout=layout, diag_offset=diag_offset,
                                   bias_scale=bias_scale, shapes_only=True, mask=mask, threads=threads,
                                   sinks=sinks, dropout_p=dropout_p, seed=_seed_for_check(seed),
                                   dropout_offset=_seed_for_check(dropout_offset))
    for name, x, key_ok in (("seed", seed, True), ("dropout_offset", dropout_offset, False)):
        if x is not None:  # checked with dropout on too, as the call checks them (seed_words)
            _attention._u64_words(name, _seed_for_check(x), key_ok)
    flag("return_lse", return_lse)
    if bias_grad and bias is None:  # as flashattn.plan and the library: dropped silently before
        raise ValueError("bias_grad needs a bias (bias=); a mask is not one")
    bias = None if bias_shape is None else _Shape(bias_shape)
    return plan_for(opt, q, k, v, bias, backend=backend, bias_grad=bias_grad,
                    masked=mask is not None, mask=fmask)


def cost_estimate(q, k, v, *, causal=False, window=None, softcap=None, scale=None, bias=None, alibi_slopes=None,
                  q_segment_ids=None, kv_segment_ids=None, layout="bshd", pass_="forward", bias_grad=False,
                  backend=None, mask=None, sinks=None, diag_offset=None, bias_scale=None, threads=0, dropout_p=None,
                  seed=None, dropout_offset=None, return_lse=False):
    """A jax.experimental.pallas.CostEstimate (flops, transcendentals, bytes_accessed) of
    flashattn's kernel for this call, from the library's plan: exact for masks known from
    shapes (an upper bound with segment ids), in microseconds, from shapes alone.

    Arguments as flashattn.jax.attention, as arrays or jax.ShapeDtypeStructs (alibi_slopes,
    segment ids and sinks may be True; bias and a boolean mask may not: see plan). pass_:
    "forward" or "backward" (bias_grad: the backward also computes dbias). backend: the
    library's tile schedule to count ("cpu", "cuda"); default: "cpu" when JAX's default
    backend is the CPU, else "cuda". mask: a boolean
    array (its shape: an upper bound), a flashattn.masks mask or a splash attention mask
    (exact: the blocks that run). The cost of the splash kernel itself for a splash mask is
    splash_cost_estimate's. threads, dropout_p, seed, dropout_offset and return_lse: checked
    as plan checks them; dropout changes no figure (see plan).
    """
    from jax.experimental import pallas as pl  # imported here: flashattn.jax needs it nowhere else

    if pass_ not in ("forward", "backward"):
        raise ValueError(f"pass_ must be 'forward' or 'backward', got {pass_!r}")
    p = plan(q, k, v, causal=causal, window=window, softcap=softcap, scale=scale, bias=bias,
             alibi_slopes=alibi_slopes, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
             layout=layout, bias_grad=bias_grad, backend=backend, mask=mask, sinks=sinks, diag_offset=diag_offset,
             bias_scale=bias_scale, threads=threads, dropout_p=dropout_p, seed=seed, dropout_offset=dropout_offset,
             return_lse=return_lse)
    c = p.forward if pass_ == "forward" else p.backward
    return pl.CostEstimate(flops=int(c["flops"]), transcendentals=int(c["transcendentals"]),
                           bytes_accessed=int(c["bytes_accessed"]))
