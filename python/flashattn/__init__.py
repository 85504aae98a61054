"""flashattn: exact, memory-efficient attention (FlashAttention forward and backward).

    flashattn.plan(...)                  the analytic cost of a problem, from shapes alone
    flashattn.attention(q, k, v, ...)    numpy arrays (f32, f16; bf16 through ml_dtypes)
    flashattn.attention_backward(...)    its gradients
    flashattn.dropout_keep_mask(...)     the keep mask of dropout_p=, seed= (and its rate)
    flashattn.varlen_attention(...)      packed variable-length batches (+ _backward)
    flashattn.kvcache_attention(...)     kv-cache decoding, paged caches too
    flashattn.plan_varlen(...), plan_kvcache(...)   their costs, from lengths and shapes
    flashattn.merge_states(...)          merges two attention states (o, lse) exactly
    flashattn.masks                      masks as data: causal, window, chunked, prefix_lm,
                                         documents, from_array, from_fn, & and | (mask=)
    flashattn.quantize_cache(k, v, dtype)          int8 / fp8 kv caches and their scales
    with flashattn.progress(): ...       progress of the long calls in the block
    import flashattn.torch               PyTorch tensors (autograd, torch.compile)
    import flashattn.jax                 JAX arrays (jit, grad, vmap)

Importing this package loads the C library and numpy only; the framework fronts are
submodules imported explicitly.
"""
from . import _native, masks
from ._numpy import attention, attention_backward, dropout_keep_mask, dropout_keep_rate
from ._numpy_inference import kvcache_attention, varlen_attention, varlen_attention_backward
from ._merge import merge_states
from ._plan import Plan, plan
from ._plan_inference import plan_kvcache, plan_varlen
from ._progress import progress
from ._quant import quantize_cache

# the release, as pyproject.toml's [project] version and cmake/install.cmake's FA_VERSION
# (the C library's) say it (tests/python/test_packaging.py checks the three agree)
__version__ = "0.1.0"

__all__ = ["masks", "plan", "Plan", "attention", "attention_backward", "varlen_attention",
           "varlen_attention_backward", "kvcache_attention", "plan_varlen", "plan_kvcache", "merge_states",
           "quantize_cache", "progress", "cuda_available", "cpu_isa", "dropout_keep_mask", "dropout_keep_rate"]


def cuda_available():
    """True if this build has the CUDA backend and a device is present."""
    return bool(_native.lib.fa_cuda_available())


def cpu_isa():
    """The CPU microkernel set in use ("scalar", "avx512", ...); FA_ISA forces one."""
    return _native.lib.fa_cpu_isa().decode()

