"""The PyTorch fronts of the inference shapes: flashattn.torch.varlen_attention (packed
variable-length batches, differentiable in q, k, v) and flashattn.torch.kvcache_attention
(kv-cache decoding, paged caches too; forward only, writes the new tokens into the caches).

Custom ops (torch.library) with fake implementations, as flashattn.torch.attention:
flashattn::varlen_fwd, flashattn::varlen_bwd and flashattn::kvcache_fwd, which declares
that it mutates k_cache and v_cache so torch.compile functionalizes it correctly. Length
arrays (cu_seqlens, cache_seqlens, block_table) are int32 tensors read on the host when the
op runs (the library plans from them), so the ops stay single graph nodes."""
import math
from typing import Optional, Tuple

import torch

from . import _layout, _native
from ._problem import dtype_code
from ._quant import cache_dtype_code, check_rows, quantize_dtype_code
from ._problem_inference import (check_decode_shapes, check_max_seqlen, check_prefix, check_varlen_shapes,
                                 decode_problem, varlen_problem)
from ._torch_args import (alibi, autocast, check_devices, check_floats, check_tensor, distinct, float_or_none,
                          float_or_zero, int_in, no_memory, shares_memory, sinks_arg, threads_arg, window_sides)
from ._torch_ops import (DTYPES, F32, LSE_GRAD_REFUSED, Device, _RefusedDoubleGrad, dense_for_grad, do_with_o_strides,
                         forward_ad_refused, grad_like, int32_ids, lse_as_value_column, poisoned, ptr, readable,
                         refused_lse_grad, dropout_args, seed_value, vmap_by_loop, with_batch0)


def _host_int32(t, name="lengths"):
    """A length tensor as the numpy int32 array the plan reads (a view on the CPU)."""
    return None if t is None else int32_ids(name, t.detach().to("cpu")).numpy()


def _strides(t):
    return tuple(t.stride())


# ---- packed variable-length batches ---------------------------------------------------

def _varlen_handle(q, k, v, o_stride, cu_q, cu_k, alibi_slopes, causal, wl, wr, softcap, scale,
                   diag_offset, dev, sinks=False, per_call=False, dropout=(0.0, None, 0)):
    """per_call: the forward's plan from the packed tensors' rows, one for every call of those
    shapes (the prefix sums go with each call); else a plan of these prefix sums. dropout:
    (dropout_p, the seed operand, dropout_batch0)."""
    p_drop, seed, batch0 = dropout
    p = varlen_problem(q_shape=tuple(q.shape), k_shape=tuple(k.shape), v_shape=tuple(v.shape),
                       q_stride=_strides(q), k_stride=_strides(k), v_stride=_strides(v),
                       o_stride=tuple(o_stride), dtype=DTYPES[q.dtype], cu_seqlens_q=cu_q,
                       cu_seqlens_k=cu_k, causal=causal, window=(wl, wr), softcap=softcap,
                       scale=scale, alibi=alibi_slopes is not None, diag_offset=diag_offset, sinks=sinks,
                       lengths_per_call=per_call,
                       dropout=(p_drop, seed_value(seed), None) if p_drop > 0 else (None, None, None))
    return _native.cached_plan(with_batch0(p, batch0), dev.options())


def _totals(cu):
    """The rows (or keys) a packed batch's prefix sums reach: at most the tensors' rows."""
    return int(cu[-1]) if cu.size else 0


@torch.library.custom_op("flashattn::varlen_fwd", mutates_args=())
def _varlen_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                cu_seqlens_k: torch.Tensor, max_seqlen_q: Optional[int], max_seqlen_k: Optional[int],
                alibi_slopes: Optional[torch.Tensor], causal: bool, window_left: int,
                window_right: int, softcap: float, scale: Optional[float],
                diag_offset: Optional[int], threads: int = 0,
                sinks: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                seed: Optional[torch.Tensor] = None, dropout_batch0: int = 0,
                dropout_batch_stride: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """dropout_batch0 and dropout_batch_stride: set by the vmap rule (_torch_ops.vmap_by_loop)."""
    q, k, v = readable(q), readable(k), readable(v)
    cu_q, cu_k = _host_int32(cu_seqlens_q, "cu_seqlens_q"), _host_int32(cu_seqlens_k, "cu_seqlens_k")
    check_max_seqlen("max_seqlen_q", max_seqlen_q, cu_q)
    check_max_seqlen("max_seqlen_k", max_seqlen_k, cu_k)
    o = poisoned(torch.empty(tuple(q.shape[:2]) + (v.shape[2],), dtype=q.dtype, device=q.device))
    lse = poisoned(torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device))
    dev = Device(q, threads)
    handle = _varlen_handle(q, k, v, o.stride(), cu_q, cu_k, alibi_slopes, causal, window_left,
                            window_right, softcap, scale, diag_offset, dev, sinks is not None, per_call=True,
                            dropout=(dropout_p, seed, dropout_batch0))
    ws, ws_size = dev.workspace(handle, _native.FORWARD)
    dev.run(lambda: handle.forward(_native.ForwardArgs(
        q=ptr(q), k=ptr(k), v=ptr(v), o=ptr(o), lse=ptr(lse, F32), alibi_slopes=ptr(alibi_slopes, F32),
        workspace=ptr(ws), workspace_size=ws_size, stream=dev.stream(), sinks=ptr(sinks, F32),
        cu_seqlens_q=cu_q.ctypes.data, cu_seqlens_k=cu_k.ctypes.data)))
    tq = _totals(cu_q)  # rows of no sequence, which the library does not touch
    o[tq:] = 0
    lse[:, tq:] = float("-inf")
    return o, lse


@_varlen_fwd.register_fake
def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                     causal, window_left, window_right, softcap, scale, diag_offset, threads=0, sinks=None,
                     dropout_p=0.0, seed=None, dropout_batch0=0, dropout_batch_stride=0):
    return (q.new_empty(tuple(q.shape[:2]) + (v.shape[2],)),
            q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32))


@torch.library.custom_op("flashattn::varlen_bwd", mutates_args=())
def _varlen_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                do: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                alibi_slopes: Optional[torch.Tensor], causal: bool, window_left: int,
                window_right: int, softcap: float, scale: Optional[float],
                diag_offset: Optional[int], threads: int = 0, sinks: Optional[torch.Tensor] = None,
                dropout_p: float = 0.0, seed: Optional[torch.Tensor] = None, dropout_batch0: int = 0,
                dropout_batch_stride: int = 0) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv and dsink ((0,) without sinks); the dropout batch arguments as varlen_fwd's."""
    has_sinks = sinks is not None
    q, k, v = dense_for_grad(q), dense_for_grad(k), dense_for_grad(v)
    dq, dk, dv = grad_like(q), grad_like(k), grad_like(v)
    lse = lse.contiguous()
    o = readable(o)
    o, do = do_with_o_strides(o, do)
    dsink = poisoned(torch.empty(sinks.shape if has_sinks else (0,), dtype=torch.float32, device=q.device))
    dev = Device(q, threads)
    cu_q, cu_k = _host_int32(cu_seqlens_q), _host_int32(cu_seqlens_k)
    tq, tk = _totals(cu_q), _totals(cu_k)
    for g, t in ((dq, tq), (dk, tk), (dv, tk)):  # rows past the sums' ends: zero gradients
        g[t:] = 0
    if tq < lse.shape[1]:
        lse = lse[:, :tq].contiguous()
    # the backward plans with these prefix sums, over the rows they reach (views: same data)
    handle = _varlen_handle(q[:tq], k[:tk], v[:tk], o.stride(), cu_q, cu_k,
                            alibi_slopes, causal, window_left, window_right, softcap, scale,
                            diag_offset, dev, has_sinks, dropout=(dropout_p, seed, dropout_batch0))
    ws, ws_size = dev.workspace(handle, _native.BACKWARD)
    dev.run(lambda: handle.backward(_native.BackwardArgs(
        q=ptr(q), k=ptr(k), v=ptr(v), o=ptr(o), d_o=ptr(do), lse=ptr(lse, F32), dq=ptr(dq),
        dk=ptr(dk), dv=ptr(dv), alibi_slopes=ptr(alibi_slopes, F32), workspace=ptr(ws),
        workspace_size=ws_size, stream=dev.stream(), sinks=ptr(sinks, F32),
        dsink=ptr(dsink, F32) if has_sinks else None)))
    return dq, dk, dv, dsink


@_varlen_bwd.register_fake
def _varlen_bwd_fake(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, alibi_slopes, causal,
                     window_left, window_right, softcap, scale, diag_offset, threads=0, sinks=None,
                     dropout_p=0.0, seed=None, dropout_batch0=0, dropout_batch_stride=0):
    return tuple(grad_like(dense_for_grad(t)) for t in (q, k, v)) + (
        q.new_empty(sinks.shape if sinks is not None else (0,), dtype=torch.float32),)


def _packed_batch(args):
    return max(args["cu_seqlens_q"].shape[0] - 1, 0)  # the sequences: dropout's b counts them


# under torch.func.vmap: one call per element, dropout with one seed drawing one packed
# batch's masks of every element's sequences in turn (as flashattn.jax.varlen_attention)
torch.library.register_vmap("flashattn::varlen_fwd", vmap_by_loop(torch.ops.flashattn.varlen_fwd, _packed_batch))
torch.library.register_vmap("flashattn::varlen_bwd", vmap_by_loop(torch.ops.flashattn.varlen_bwd, _packed_batch))


class _VarlenCompiled(torch.autograd.Function):
    """varlen_fwd, differentiable in q, k, v through o and lse (as _torch_ops.Attention;
    _Varlen adds the jvp that Dynamo refuses)."""
    generate_vmap_rule = True

    @staticmethod
    def forward(q, k, v, cu_q, cu_k, max_q, max_k, slopes, causal, wl, wr, softcap, scale, diag_offset, threads,
                sinks=None, dropout_p=0.0, seed=None):
        return torch.ops.flashattn.varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, slopes, causal, wl, wr,
                                              softcap, scale, diag_offset, threads, sinks, dropout_p, seed)

    @staticmethod
    def setup_context(ctx, inputs, output, op_level=False):
        q, k, v, cu_q, cu_k, _, _, slopes = inputs[:8]
        sinks = inputs[15] if len(inputs) > 15 else None
        seed = inputs[17] if len(inputs) > 17 else None
        ctx.save_for_backward(q, k, v, *output, cu_q, cu_k, slopes, sinks, seed)
        ctx.options = inputs[8:15]
        ctx.dropout_p = inputs[16] if len(inputs) > 16 else 0.0
        ctx.dropout_batch = tuple(inputs[18:20])  # the vmap rule's (the op's own autograd), for the backward
        ctx.n_inputs = len(inputs)
        # as _torch_ops.AttentionCompiled: lse has no gradient under dropout (the op's own
        # autograd, torch.export's, refuses one in the backward instead)
        ctx.refuse_lse = op_level and ctx.dropout_p > 0
        if ctx.dropout_p > 0 and not op_level:
            ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse, cu_q, cu_k, slopes, sinks, seed = ctx.saved_tensors
        if ctx.dropout_p > 0:  # lse is non-differentiable then (setup_context)
            if ctx.refuse_lse and dlse is not None and bool((dlse != 0).any()):
                raise NotImplementedError(LSE_GRAD_REFUSED)
            dlse = None
        if do is None and dlse is None:
            return (None,) * ctx.n_inputs
        do = torch.zeros_like(o) if do is None else do
        if dlse is not None:  # lse [Hq, total_q], do's rows [total_q, Hq]
            v, o, do = lse_as_value_column(v, o, do, dlse, lambda x: x.t())
        # no_grad, as _torch_ops.AttentionCompiled's: with grad mode on (torch.func.grad,
        # create_graph=True) the op's generated autograd took the call, which torch.func.grad
        # refused and a double backward met as torch's "no autograd formula"
        with torch.no_grad():
            dq, dk, dv, dsink = torch.ops.flashattn.varlen_bwd(q, k, v, o, lse, do, cu_q, cu_k, slopes, *ctx.options,
                                                               sinks, ctx.dropout_p, seed, *ctx.dropout_batch)
            if dlse is not None and sinks is not None:
                # lse's cotangent reaches the sink directly (as in _torch_ops), but not from rows
                # past cu_seqlens_q's end (lse -inf, in no sequence: exp(+inf) times their 0 was
                # NaN); a sequence's rows have lse >= the sink, never -inf
                term = torch.exp(sinks.view(-1, 1) - lse) * dlse
                dsink = dsink + torch.where(torch.isneginf(lse), 0.0, term).sum(1)
        if dlse is not None:
            dv = dv[..., :-1]
        grads = [dq, dk, dv] + [None] * (ctx.n_inputs - 3)
        if sinks is not None and ctx.needs_input_grad[15]:
            grads[15] = dsink
        if torch.is_grad_enabled():  # create_graph=True: their own gradient raises, as attention's
            deps = [t for t in (q, k, v, sinks, do) if t is not None and t.requires_grad]
            if deps:
                grads = [g if g is None else _RefusedDoubleGrad.apply(g, *deps) for g in grads]
        return tuple(grads)



class _Varlen(_VarlenCompiled):
    @staticmethod
    def jvp(ctx, *tangents):
        forward_ad_refused("flashattn::varlen_fwd (flashattn.torch.varlen_attention)")


_varlen_fwd.register_autograd(
    _VarlenCompiled.backward,
    setup_context=lambda ctx, inputs, output: _VarlenCompiled.setup_context(ctx, inputs, output, op_level=True))


class _VarlenExported:
    @staticmethod
    def apply(*args):
        return torch.ops.flashattn.varlen_fwd(*args)


# the tensor arguments read on the host, which may be on the CPU beside tensors on a GPU
_HOST = ("cu_seqlens_q", "cu_seqlens_k", "cache_seqlens", "block_table")


def _int_tensor(name, t, shape_desc, ndim):
    """An integer tensor argument; its values are checked against int32 where the op runs."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be an int32 torch.Tensor {shape_desc}, got {type(t).__name__}")
    if t.dim() != ndim or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{name} must be integers {shape_desc}, got {t.dtype} of shape {tuple(t.shape)}")
    return t.detach()


def _options(window, softcap, scale, threads):
    return (*window_sides(window), float_or_zero("softcap", softcap), float_or_none("scale", scale),
            threads_arg(threads))


def _no_mask(mask, fn):
    if mask is not None:
        raise NotImplementedError(f"mask= with {fn}: the library takes no bias (nor mask) for "
                                  "packed batches and kv-cache decoding; use flashattn.torch.attention")


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, *,
                     causal=False, window=None, softcap=None, scale=None, alibi_slopes=None,
                     diag_offset=None, return_lse=False, mask=None, threads=None, sinks=None, dropout_p=0.0,
                     seed=None):
    """Attention over a packed batch of sequences of different lengths, differentiable in
    q, k, v and sinks (flash_attn_varlen_func's shapes; sinks [Hq] as in attention).

    q [total_q, Hq, D], k [total_k, Hk, D], v [total_k, Hk, Dv]; cu_seqlens_q, cu_seqlens_k
    int32 [batch + 1] prefix sums (sequence b: rows cu[b]:cu[b+1]; read on the host).
    Masks apply within each sequence, bottom-right at its own Sk_b - Sq_b. max_seqlen_q/k
    optional bounds (checked when given; not read under torch.compile). Returns o
    [total_q, Hq, Dv], and lse [Hq, total_q] f32 (differentiable too) with return_lse.
    threads: None or 0, the library's default; mask= is refused (the library has no bias
    for packed batches). Lengths per call, as numpy's varlen_attention: the rows are
    capacities (the prefix sums may end below them: o = 0, lse = -inf and zero gradients
    past the ends), one forward plan per shapes.
    dropout_p, seed: as in flashattn.torch.attention (the seed from torch's generator when
    None; b, i, j count within each sequence; lse then has no gradient)."""
    _no_mask(mask, "varlen_attention")
    q, k, v = (check_tensor(n, t, 3) for n, t in (("q", q), ("k", k), ("v", v)))
    q, k, v = autocast(q, k, v)
    check_floats(("q", "k", "v"), (q, k, v))
    check_devices(q, (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
                      ("alibi_slopes", alibi_slopes), ("sinks", sinks)), host=_HOST)
    check_varlen_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape))
    cu_q = _int_tensor("cu_seqlens_q", cu_seqlens_q, "[batch + 1]", 1)
    cu_k = _int_tensor("cu_seqlens_k", cu_seqlens_k, "[batch + 1]", 1)
    if cu_q.shape != cu_k.shape or cu_q.numel() < 1:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must both be [batch + 1], got shapes "
                         f"{tuple(cu_q.shape)} and {tuple(cu_k.shape)}")
    wl, wr, softcap, scale, threads = _options(window, softcap, scale, threads)
    q, k, v = distinct(q, k, v)
    dropout_p, seed = dropout_args(dropout_p, seed)
    # under torch.export the op itself, differentiable by its own autograd (as _torch_ops'
    # attention_function: export's tracing runs a Function's forward under no_grad)
    fn = (_VarlenExported if torch.compiler.is_exporting() else
          _VarlenCompiled if torch.compiler.is_compiling() else _Varlen)
    # max_seqlen_q/k: a bound the library does not need, checked in eager calls; traced, it is
    # not read, since reading an int makes it part of the graph (each new value recompiled,
    # and fullgraph=True failed at torch's recompile limit)
    bounds = (None, None) if torch.compiler.is_compiling() else \
        (int_in("max_seqlen_q", max_seqlen_q, optional=True), int_in("max_seqlen_k", max_seqlen_k, optional=True))
    o, lse = fn.apply(q, k, v, cu_q, cu_k, *bounds,
                      alibi(alibi_slopes, q.shape[1], q.device), bool(causal), wl, wr, softcap, scale,
                      int_in("diag_offset", diag_offset, optional=True), threads,
                      sinks_arg(sinks, q.shape[1], q.device), dropout_p, seed)
    if return_lse and dropout_p > 0.0:
        lse = refused_lse_grad(lse, q, k, v)
    return (o, lse) if return_lse else o


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
