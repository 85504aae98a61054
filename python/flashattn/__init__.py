"""flashattn: exact, memory-efficient attention (FlashAttention forward and backward).

    flashattn.plan(...)                  the analytic cost of a problem, from shapes alone
    flashattn.attention(q, k, v, ...)    numpy arrays (f32, f16; bf16 through ml_dtypes)
    flashattn.attention_backward(...)    its gradients
    flashattn.varlen_attention(...)      packed variable-length batches (+ _backward)
    flashattn.kvcache_attention(...)     kv-cache decoding, paged caches too
    flashattn.plan_varlen(...), plan_kvcache(...)   their costs, from lengths and shapes
    flashattn.quantize_cache(k, v, dtype)          int8 / fp8 kv caches and their scales
    import flashattn.torch               PyTorch tensors (autograd, torch.compile)
    import flashattn.jax                 JAX arrays (jit, grad, vmap)

Importing this package loads the C library and numpy only; the framework fronts are
submodules imported explicitly.
"""
from . import _native
from ._numpy import attention, attention_backward
from ._numpy_inference import kvcache_attention, varlen_attention, varlen_attention_backward
from ._plan import Plan, plan
from ._plan_inference import plan_kvcache, plan_varlen
from ._quant import quantize_cache

__all__ = ["plan", "Plan", "attention", "attention_backward", "varlen_attention",
           "varlen_attention_backward", "kvcache_attention", "plan_varlen", "plan_kvcache", "quantize_cache",
           "cuda_available", "cpu_isa"]


def cuda_available():
    """True if this build has the CUDA backend and a device is present."""
    return bool(_native.lib.fa_cuda_available())


def cpu_isa():
    """The CPU microkernel set in use ("scalar", "avx512", ...); FA_ISA forces one."""
    return _native.lib.fa_cpu_isa().decode()

