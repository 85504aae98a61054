"""The PyTorch front of kv-cache decoding: flashattn.torch.kvcache_attention (paged caches
too; forward only, writes the new tokens into the caches) and quantize_cache.

Custom ops (torch.library) with fake implementations: flashattn::kvcache_fwd and
flashattn::kvcache_quant_fwd, which declare that they mutate the caches (and scales) so
torch.compile functionalizes them correctly. Length arrays (cache_seqlens, block_table) are
int32 tensors read on the host when the op runs, so the ops stay single graph nodes."""
import math
from typing import Optional, Tuple

import torch

from . import _layout, _native
from ._problem import dtype_code, flag
from ._quant import cache_dtype_code, check_rows, quantize_dtype_code
from ._problem_inference import check_decode_shapes, check_prefix, decode_problem
from ._torch_args import (alibi, check_dense, check_devices, check_floats, check_tensor, no_memory, shares_memory,
                          sinks_arg)
from ._torch_ops import DTYPES, F32, Device, poisoned, ptr, readable
from ._torch_inference import _HOST, _host_int32, _int_tensor, _no_mask, _options, _strides


# ---- kv-cache decoding -----------------------------------------------------------------

def _kvcache_run(q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, alibi_slopes, causal,
                 window_left, window_right, softcap, scale, threads, k_scale=None, v_scale=None, cache_code=None,
                 sinks=None, k_prefix=None, v_prefix=None):
    B, Sq, Hq, _ = q.shape
    P = 0 if k_prefix is None else k_prefix.shape[0]
    q = readable(q)
    has_new = k_new is not None
    # with new tokens the library writes through the caches' own strides (kvcache_attention
    # checked that they can be written); without, a cache they cannot describe is copied
    kc, vc = (k_cache, v_cache) if has_new else (readable(k_cache), readable(v_cache))
    if has_new:
        k_new, v_new = k_new.contiguous(), v_new.contiguous()
    o = poisoned(torch.empty((B, Sq, Hq, v_cache.shape[3]), dtype=q.dtype, device=q.device))
    lse = poisoned(torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device))
    lens, table = _host_int32(cache_seqlens, "cache_seqlens"), _host_int32(block_table, "block_table")
    dev = Device(q, threads)
    p = decode_problem(q_shape=tuple(q.shape), kc_shape=tuple(kc.shape), vc_shape=tuple(vc.shape),
                       q_stride=_strides(q), kc_stride=_strides(kc), vc_stride=_strides(vc),
                       o_stride=_strides(o), dtype=DTYPES[q.dtype], cache_seqlens=lens,
                       has_new_kv=has_new, max_pages=None if table is None else table.shape[1],
                       causal=causal, window=(window_left, window_right), softcap=softcap,
                       scale=scale, alibi=alibi_slopes is not None, sinks=sinks is not None,
                       lengths_per_call=True, shared_prefix_len=P, cache_dtype=cache_code)
    handle = _native.cached_plan(p, dev.options())  # one plan for every step: lengths go with the call
    ws, ws_size = dev.workspace(handle, _native.FORWARD)
    table_ptr = None if table is None else table.ctypes.data
    dev.run(lambda: handle.forward(_native.ForwardArgs(
        q=ptr(q), k=ptr(kc), v=ptr(vc), o=ptr(o), lse=ptr(lse, F32), alibi_slopes=ptr(alibi_slopes, F32),
        k_new=ptr(k_new), v_new=ptr(v_new), block_table=table_ptr, workspace=ptr(ws),
        workspace_size=ws_size, stream=dev.stream(), sinks=ptr(sinks, F32), cache_seqlens=lens.ctypes.data,
        k_scale=ptr(k_scale, F32), v_scale=ptr(v_scale, F32), k_prefix=ptr(k_prefix), v_prefix=ptr(v_prefix))))
    return o, lse


@torch.library.custom_op("flashattn::kvcache_fwd", mutates_args=("k_cache", "v_cache"))
def _kvcache_fwd(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 k_new: Optional[torch.Tensor], v_new: Optional[torch.Tensor],
                 cache_seqlens: torch.Tensor, block_table: Optional[torch.Tensor],
                 alibi_slopes: Optional[torch.Tensor], causal: bool, window_left: int,
                 window_right: int, softcap: float, scale: Optional[float],
                 threads: int = 0, sinks: Optional[torch.Tensor] = None, k_prefix: Optional[torch.Tensor] = None,
                 v_prefix: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    return _kvcache_run(q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, alibi_slopes, causal,
                        window_left, window_right, softcap, scale, threads, sinks=sinks, k_prefix=k_prefix,
                        v_prefix=v_prefix)


# A quantized cache (docs/caches.md): its own op, as it also mutates the scales.
@torch.library.custom_op("flashattn::kvcache_quant_fwd", mutates_args=("k_cache", "v_cache", "k_scale", "v_scale"))
def _kvcache_quant_fwd(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor,
                       v_scale: torch.Tensor, k_new: Optional[torch.Tensor], v_new: Optional[torch.Tensor],
                       cache_seqlens: torch.Tensor, block_table: Optional[torch.Tensor],
                       alibi_slopes: Optional[torch.Tensor], cache_code: int, causal: bool, window_left: int,
                       window_right: int, softcap: float, scale: Optional[float],
                       threads: int = 0, sinks: Optional[torch.Tensor] = None,
                       k_prefix: Optional[torch.Tensor] = None,
                       v_prefix: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    return _kvcache_run(q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, alibi_slopes, causal,
                        window_left, window_right, softcap, scale, threads, k_scale, v_scale, cache_code, sinks,
                        k_prefix, v_prefix)


@_kvcache_quant_fwd.register_fake
def _kvcache_quant_fwd_fake(q, k_cache, v_cache, k_scale, v_scale, k_new, v_new, cache_seqlens, block_table,
                            alibi_slopes, cache_code, causal, window_left, window_right, softcap, scale, threads=0,
                            sinks=None, k_prefix=None, v_prefix=None):
    B, Sq, Hq, _ = q.shape
    return q.new_empty((B, Sq, Hq, v_cache.shape[3])), q.new_empty((B, Hq, Sq), dtype=torch.float32)


@_kvcache_fwd.register_fake
def _kvcache_fwd_fake(q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, alibi_slopes,
                      causal, window_left, window_right, softcap, scale, threads=0, sinks=None, k_prefix=None,
                      v_prefix=None):
    B, Sq, Hq, _ = q.shape
    return q.new_empty((B, Sq, Hq, v_cache.shape[3])), q.new_empty((B, Hq, Sq), dtype=torch.float32)


def _no_vmap(*tensors):
    """kvcache_attention is not a torch.func.vmap function (docs/python.md names attention and
    varlen_attention): its tensors batched by vmap are refused by name, not by torch's "Batching
    rule not implemented" or "Cannot access storage of BatchedTensorImpl"."""
    batched = torch._C._functorch.is_batchedtensor
    if any(isinstance(t, torch.Tensor) and batched(t) for t in tensors):
        raise NotImplementedError("flashattn.torch.kvcache_attention does not take tensors batched by "
                                  "torch.func.vmap: call it on the whole batch (the caches' batch dim), or loop")


def kvcache_attention(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None, *,
                      causal=False, window=None, softcap=None, scale=None, alibi_slopes=None,
                      return_lse=False, mask=None, threads=None, sinks=None, cache_dtype=None, k_scale=None,
                      v_scale=None, k_prefix=None, v_prefix=None):
    """One decoding step against a kv cache (flash_attn_with_kvcache's shapes); forward only.
    sinks [Hq]: as in attention (the split-KV chunks merge without them; they join once).

    q [B, Sq_new, Hq, D]; k_cache, v_cache [B, S_cache_max, Hk, D] (Dv for v), or with
    block_table (int32 [B, max_pages]) paged [num_pages, page_size, Hk, D]; cache_seqlens
    int32 [B] (an int or a 0-d integer tensor, every sequence's, or None for full caches):
    tokens already cached. With k and v [B, Sq_new, Hk, D] the new tokens are written into
    k_cache and v_cache in place at positions cache_seqlens[b].. (nothing is written when any
    argument is bad; a step with no batch, new rows or heads runs the library too, whose
    checks of lengths and sinks it passes as any other, and writes nothing). Masks align
    bottom-right per sequence. Returns o [B, Sq_new, Hq, Dv], and lse [B, Hq, Sq_new] f32
    with return_lse. The op declares that it mutates the caches, so torch.compile keeps the
    update. threads: None or 0, the library's default; mask= is refused (the library has no
    bias for decoding). Under torch.autocast nothing is cast: the caches are written in place.
    cache_dtype "int8" or "fp8" (docs/caches.md): k_cache, v_cache hold torch.int8 or
    torch.float8_e4m3fn codes (or their torch.uint8 bits; any other dtype is refused;
    flashattn.torch.quantize_cache makes them), k_scale and
    v_scale (float32, contiguous, the caches' shape without head_dim) a scale per row and
    kv head; new k, v are quantized on append, their scales written in place.
    k_prefix, v_prefix [P, Hk, D] / [.., Dv] (q's dtype): a shared prefix (cascade) that every
    sequence attends to first (positions 0 .. P - 1, its own cache at P + t), read once per
    call, as numpy's kvcache_attention."""
    causal, return_lse = flag("causal", causal), flag("return_lse", return_lse)
    _no_mask(mask, "kvcache_attention")
    _no_vmap(q, k_cache, v_cache, k, v, cache_seqlens, block_table, k_scale, v_scale, k_prefix, v_prefix, sinks,
             alibi_slopes)
    q, k_cache, v_cache = (check_tensor(n, t, 4) for n, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)))
    if (k is None) != (v is None):
        raise ValueError("k and v (the new tokens) go together: pass both or neither")
    check_devices(q, (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v), ("k_scale", k_scale),
                      ("v_scale", v_scale), ("k_prefix", k_prefix), ("v_prefix", v_prefix),
                      ("cache_seqlens", cache_seqlens), ("block_table", block_table),
                      ("alibi_slopes", alibi_slopes), ("sinks", sinks)), host=_HOST)
    code = cache_dtype_code(cache_dtype)
    if code is None and (k_scale is not None or v_scale is not None):
        raise ValueError("k_scale and v_scale belong to a quantized cache: pass cache_dtype='int8' or 'fp8'")
    names, tensors = (["q"], [q]) if code is not None else (["q", "k_cache", "v_cache"], [q, k_cache, v_cache])
    if code is not None:
        want = (torch.int8,) if code == _native.INT8 else (torch.float8_e4m3fn, torch.uint8)
        for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
            if c.dtype not in want:
                raise ValueError(f"{name} must hold {' or '.join(str(w) for w in want)} codes with "
                                 f"cache_dtype={cache_dtype!r}, got {c.dtype}")
        shp = tuple(k_cache.shape[:3])
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if s is None:
                raise ValueError(f"{name} is required with a quantized cache_dtype (float32, shape {shp})")
            if not isinstance(s, torch.Tensor) or s.dtype != torch.float32 or tuple(s.shape) != shp or \
                    not s.is_contiguous():  # its device: q's (check_devices)
                got = (type(s).__name__ if not isinstance(s, torch.Tensor) else
                       f"{s.dtype}" if s.dtype != torch.float32 else
                       f"shape {tuple(s.shape)}" if tuple(s.shape) != shp else f"strides {tuple(s.stride())}")
                raise ValueError(f"{name} must be a contiguous float32 tensor of shape {shp}, got {got}")
    if k is not None:
        names += ["k", "v"]
        tensors += [check_tensor("k", k, 4), check_tensor("v", v, 4)]
    if k_prefix is not None and v_prefix is not None:
        names += ["k_prefix", "v_prefix"]
        tensors += [check_tensor("k_prefix", k_prefix, 3), check_tensor("v_prefix", v_prefix, 3)]
    k_prefix, v_prefix, _ = check_prefix(k_prefix, v_prefix, tuple(k_cache.shape), tuple(v_cache.shape), q.dtype)
    check_floats(names, tensors)
    # compiled: every tensor argument detached (a graph whose decode input requires grad, q from
    # a Linear, failed to compile: torch traced the backward the op lacks); eager: a derivative
    # asked of the outputs raises (_DecodeRefusesDerivatives). Judged here, in this frame: where
    # Dynamo runs it eagerly after a graph break in it, it compiles the helpers it calls apart,
    # and there is_compiling() is True for a call that is not traced
    traced = torch.compiler.is_compiling() or torch.compiler.is_exporting()
    keep = (lambda t: t.detach()) if traced else (lambda t: t)
    prefix = () if k_prefix is None else (k_prefix.contiguous(), v_prefix.contiguous())
    if k is not None:
        for name, c in (("k_cache", k_cache), ("v_cache", v_cache)) + \
                ((("k_scale", k_scale), ("v_scale", v_scale)) if code is not None else ()):
            if c.requires_grad and torch.is_grad_enabled():  # torch's own rule for in-place writes
                raise RuntimeError(f"{name} requires grad and is written in place (new k and v given); decoding has "
                                   "no backward: pass one that does not require grad, or call under "
                                   "torch.no_grad()")
            if not _layout.writable_strides(tuple(c.shape), tuple(c.stride())):
                raise ValueError(f"{name} is written in place (new k and v given), so its elements must "
                                 f"not overlap (strides {tuple(c.stride())}); pass a dense cache")
        # an append writes both caches (and both scale arrays): they must not overlap (under
        # torch.compile, whose tracing cannot read storages, the library's own check that the
        # two caches and the two scale arrays are not one buffer remains)
        written = [("k_cache", k_cache), ("v_cache", v_cache)] + \
            ([("k_scale", k_scale), ("v_scale", v_scale)] if code is not None else [])
        for i, (na, a) in enumerate([] if torch.compiler.is_compiling() else written):
            for nb, b in written[i + 1:] + [("q", q), ("k", k), ("v", v)]:
                if shares_memory(a, b):
                    raise ValueError(f"{na} and {nb} share memory, and the call writes {na} (new k and v given): "
                                     f"pass separate tensors")
    paged = block_table is not None
    check_decode_shapes(tuple(q.shape), tuple(k_cache.shape), tuple(v_cache.shape),
                        None if k is None else (tuple(k.shape), tuple(v.shape)), paged)
    B = q.shape[0]
    if paged:
        block_table = _int_tensor("block_table", block_table, "[batch, max_pages]", 2)
        if block_table.shape[0] != B:
            raise ValueError(f"block_table must have shape [batch, max_pages] with batch = {B}, "
                             f"got {tuple(block_table.shape)}")
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    # an int (or a 0-d integer: a numpy one, or a tensor, which every sequence shares as it is,
    # its value checked where the op runs); an array of lengths is a tensor here, as every
    # integer argument of the torch front (a numpy array had __index__ and raised numpy's own
    # TypeError)
    if isinstance(cache_seqlens, torch.Tensor) and cache_seqlens.dim() == 0:
        cache_seqlens = _int_tensor("cache_seqlens", cache_seqlens, f"[batch] = [{B}] or a 0-d integer", 0).expand(B)
    elif torch.compiler.is_compiling() and isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        # traced, an int (symbolic under dynamic shapes) becomes a tensor the op takes, its value
        # checked against int32 where the op runs: int() of it, or a look at its attributes,
        # made each value a graph of its own (or failed: hasattr of a SymInt)
        cache_seqlens = torch.full((B,), cache_seqlens, dtype=torch.int64)
    elif cache_seqlens is None or (not isinstance(cache_seqlens, torch.Tensor) and
                                   getattr(cache_seqlens, "ndim", 0) == 0):
        n = capacity if cache_seqlens is None else cache_seqlens
        kind = getattr(getattr(n, "dtype", None), "kind", "i")  # a 0-d numpy float or bool array has __index__ too
        if isinstance(n, bool) or not hasattr(n, "__index__") or kind not in "iu":
            raise ValueError(f"cache_seqlens must be an int or an int32 tensor [batch], got {cache_seqlens!r}")
        if not -(2**31) <= int(n) < 2**31:
            raise ValueError(f"cache_seqlens values must fit int32, got {int(n)}")
        cache_seqlens = torch.full((B,), int(n), dtype=torch.int32)
    lens = _int_tensor("cache_seqlens", cache_seqlens, f"[batch] = [{B}]", 1)
    if tuple(lens.shape) != (B,):
        raise ValueError(f"cache_seqlens must have shape [batch] = [{B}], got {tuple(lens.shape)}")
    sinks = sinks_arg(sinks, q.shape[2], q.device)
    op = _kvcache_quant_fwd if code is not None else _kvcache_fwd
    args = (q, k_cache, v_cache) + ((k_scale, v_scale) if code is not None else ()) + \
        (k, v, lens, block_table, alibi(alibi_slopes, q.shape[2], q.device)) + \
        ((code,) if code is not None else ()) + (bool(causal), *_options(window, softcap, scale, threads)) + \
        (sinks,) + (prefix if prefix else (None, None))
    args = tuple(keep(a) if isinstance(a, torch.Tensor) else a for a in args)
    o, lse = _DecodeRefusesDerivatives.apply(op, *args) if not traced and _derivative_asked(args) else op(*args)
    return (o, lse) if return_lse else o


_NO_BACKWARD = ("flashattn.torch.kvcache_attention has no backward (decoding runs forward only; the caches are "
                "written in place), but a gradient reached its output: compute it under torch.no_grad(), or train "
                "with attention() or varlen_attention()")


def _derivative_asked(args):
    """Eager, with an input that may carry a derivative (one that requires grad under grad mode,
    a torch.func transform's, a forward-mode dual): the call goes through
    _DecodeRefusesDerivatives. Compiled or exported graphs detach (kvcache_attention)."""
    from torch.autograd.forward_ad import unpack_dual
    return any(isinstance(t, torch.Tensor) and ((t.requires_grad and torch.is_grad_enabled()) or
                                                torch._C._functorch.is_functorch_wrapped_tensor(t) or
                                                unpack_dual(t).tangent is not None) for t in args)


class _DecodeRefusesDerivatives(torch.autograd.Function):
    """The decode op where a derivative may be asked of it: a gradient reaching o or lse, or a
    forward-mode tangent, raises in words. (The op mutates the caches, so torch takes no
    autograd formula for it: sinks and prefixes that require grad were detached, their
    gradient None without a word; torch.func.jvp gave a zero tangent; q's backward met torch's
    message about registering a formula.)"""

    @staticmethod
    def forward(op, *args):
        return op(*args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(_NO_BACKWARD)

    @staticmethod
    def jvp(ctx, *tangents):
        raise NotImplementedError("flashattn.torch.kvcache_attention has no derivatives (decoding runs forward only), "
                                  "so no forward-mode one (torch.func.jvp, torch.autograd.forward_ad): compute it "
                                  "without a tangent, or use attention() or varlen_attention()")


@torch.compiler.disable(reason="flashattn.torch.quantize_cache runs on the host, outside compiled graphs: call it "
                        "before the compiled function; inside one, kvcache_attention's appends quantize new "
                        "tokens (cache_dtype=)")
def quantize_cache(k, v, dtype):
    """flashattn.quantize_cache for tensors (on the CPU): (k_codes, k_scale, v_codes,
    v_scale), codes torch.int8 or torch.float8_e4m3fn, scales float32 [...] (docs/caches.md).
    Meta and fake tensors give outputs of the right shapes and dtypes; torch.compile does not
    trace it (a graph break; with fullgraph=True an error saying so)."""
    code = quantize_dtype_code(dtype)
    out = []
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dtype not in DTYPES:
            raise ValueError(f"quantize_cache: {name} must be a float32, float16 or bfloat16 tensor")
        check_dense(f"quantize_cache: {name}", t)
        if t.ndim < 1:
            raise ValueError(f"quantize_cache: {name} must have a head_dim axis (the last), got a 0-d tensor")
        codes_dtype = torch.int8 if code == _native.INT8 else torch.float8_e4m3fn
        if no_memory(t):  # meta or fake (FakeTensorMode): the outputs' shapes and dtypes, nothing run
            out += [torch.empty(t.shape, dtype=codes_dtype, device=t.device),
                    torch.empty(t.shape[:-1], dtype=torch.float32, device=t.device)]
            continue
        t = t.detach().to("cpu").resolve_neg().contiguous()  # a negated view's bits are not its values
        codes = torch.empty(t.shape, dtype=codes_dtype)
        scales = torch.empty(t.shape[:-1], dtype=torch.float32)
        rows = math.prod(t.shape[:-1])  # head_dim 0: every row's amax is 0, scale 1 (docs/caches.md)
        status = _native.lib.fa_quantize_rows(code, dtype_code(DTYPES[t.dtype]), t.data_ptr(), rows,
                                              t.shape[-1] if t.ndim else 0, codes.data_ptr(), scales.data_ptr())
        check_rows(status, name, lambda: next(iter(torch.nonzero(~torch.isfinite(t.float())).tolist()), None))
        out += [codes, scales]
    return tuple(out)
