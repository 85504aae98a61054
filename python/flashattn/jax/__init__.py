"""flashattn for JAX: exact, memory-efficient attention as an XLA custom call.

    attention(q, k, v, ...)        differentiable op ([B, S, H, D] by default); jit, grad, vmap
    dot_product_attention(...)     drop-in for jax.nn.dot_product_attention (same signature)
    varlen_attention(...)          packed variable-length batches (differentiable)
    kvcache_attention(...)         kv-cache decoding, paged too (returns the updated caches)
    cost_estimate(q, k, v, ...)    a Pallas CostEstimate from the analytic plan (shapes only)
    splash_cost_estimate(mask, q, k, v)   the CostEstimate of splash attention's own kernel
    flash_attention(q, k, v, ...)  drop-in for the Pallas TPU kernel of the same name
    SegmentIds                     its segment-id pair

The XLA FFI handler (python/csrc/jax_ffi.c) is registered for the "cpu" platform, and for
"CUDA" where jaxlib has it (the library then needs its CUDA backend).
"""

from ._attention import attention
from ._cost import cost_estimate, plan
from ._ffi import register as _register
from ._inference import kvcache_attention, quantize_cache, varlen_attention
from ._nn import dot_product_attention
from ._pallas import SegmentIds, flash_attention
from ._splash import splash_cost_estimate

_register()

__all__ = ["attention", "dot_product_attention", "cost_estimate", "plan", "flash_attention", "SegmentIds", "varlen_attention",
           "splash_cost_estimate",
           "kvcache_attention", "quantize_cache"]
