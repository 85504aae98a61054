"""Quantized kv caches (docs/caches.md): the cache dtype names every front takes, and
flashattn.quantize_cache, which quantizes k and v rows with the library's own rule
(fa_quantize_rows: one f32 scale per row of head_dim elements, i.e. per (token, kv head))."""
import numpy as np

from . import _native

# cache_dtype= names: int8 codes, or OCP fp8 e4m3fn codes
CACHE_DTYPES = {"int8": _native.INT8, "fp8": _native.FP8_E4M3, "fp8_e4m3": _native.FP8_E4M3,
                "float8_e4m3fn": _native.FP8_E4M3}


def cache_dtype_code(name, what="cache_dtype", plain_ok=True):
    """The fa_dtype of a cache_dtype= name or dtype object; None is the plain cache where
    plain_ok. what names the argument in the message."""
    if name is None and plain_ok:
        return None
    key = str(name).replace("torch.", "").replace("jnp.", "")
    if key not in CACHE_DTYPES and not isinstance(name, str):
        try:  # a dtype object: numpy's, ml_dtypes', jnp.int8 / jnp.float8_e4m3fn
            key = np.dtype(name).name
        except TypeError:
            pass
    if key not in CACHE_DTYPES:
        raise ValueError(f"{what} must be one of int8, fp8{' (or None)' if plain_ok else ''}, got {name!r}")
    return CACHE_DTYPES[key]


def _fp8_numpy():
    try:
        import ml_dtypes
        return np.dtype(ml_dtypes.float8_e4m3fn)
    except ImportError:  # the codes' bits, which the library takes alike
        return np.dtype(np.uint8)


def cache_code_dtypes(code):
    """The numpy dtypes a cache of this cache_dtype code may hold: int8, or fp8 e4m3fn codes
    (ml_dtypes.float8_e4m3fn, or their uint8 bits)."""
    if code == _native.INT8:
        return (np.dtype(np.int8),)
    return tuple(dict.fromkeys((_fp8_numpy(), np.dtype(np.uint8))))


def quantize_dtype_code(dtype):
    """quantize_cache's dtype (every front's): int8 or fp8, no plain cache."""
    return cache_dtype_code(dtype, "quantize_cache: dtype", plain_ok=False)


def code_numpy_dtype(code):
    return np.dtype(np.int8) if code == _native.INT8 else _fp8_numpy()


def check_rows(status, name, first_nonfinite):
    """_native.check of fa_quantize_rows over tensor `name`; where it refused a non-finite
    element, first_nonfinite() (called on that path only) gives the element's index, which the
    message names as the user indexes the tensor (the library's names a flattened row)."""
    if status == _native.OK:
        return
    at = first_nonfinite() if status == _native.ERR_INVALID else None
    if at is not None:
        raise ValueError(f"quantize_cache: {name}[{', '.join(str(int(i)) for i in at)}] is not finite; "
                         "an int8 or fp8 cache cannot hold it")
    _native.check(status, f"quantize_cache: {name}")


def quantize_rows(x, code, src_code, name):
    """x: a contiguous numpy array [..., D] of f32, f16 or bf16 (src_code), the tensor `name`;
    returns (codes [..., D] of one byte, scales [...] f32)."""
    x = np.ascontiguousarray(x)
    rows, width = int(np.prod(x.shape[:-1], dtype=np.int64)), x.shape[-1]
    codes = np.empty(x.shape, code_numpy_dtype(code))
    scales = np.empty(x.shape[:-1], np.float32)
    status = _native.lib.fa_quantize_rows(code, src_code, x.ctypes.data, rows, width, codes.ctypes.data,
                                          scales.ctypes.data)
    check_rows(status, name, lambda: next(iter(np.argwhere(~np.isfinite(x.astype(np.float32)))), None))
    return codes, scales


def quantize_cache(k, v, dtype):
    """(k_codes, k_scale, v_codes, v_scale) of caches k, v ([..., head_dim] numpy arrays of
    float32, float16 or bfloat16, e.g. [B, S, Hk, D] or [num_pages, page_size, Hk, D]):
    dtype "int8" (codes int8, scale = amax / 127) or "fp8" (OCP e4m3fn codes, as
    ml_dtypes.float8_e4m3fn where installed, else their uint8 bits; scale = amax / 448),
    one f32 scale per row of head_dim elements (shape [...]), rounded to nearest even and
    clamped or saturated (docs/caches.md). A non-finite element raises ValueError."""
    from ._numpy import _dtype_name
    from ._problem import dtype_code
    code = quantize_dtype_code(dtype)
    out = []
    for name, a in (("k", k), ("v", v)):
        a = np.asarray(a)
        if a.ndim < 1:
            raise ValueError(f"quantize_cache: {name} must have a head_dim axis, got shape {a.shape}")
        src = _dtype_name(a.dtype)
        if src is None:
            raise ValueError(f"quantize_cache: {name} must be float32, float16 or bfloat16, got {a.dtype}")
        out.extend(quantize_rows(a, code, dtype_code(src), name))
    return tuple(out)
