"""The PyTorch fronts of the inference shapes: flashattn.torch.varlen_attention (packed
variable-length batches, differentiable in q, k, v) here, and kv-cache decoding in
_torch_decode.py, which shares this file's helpers.

Custom ops (torch.library) with fake implementations, as flashattn.torch.attention:
flashattn::varlen_fwd and flashattn::varlen_bwd. Length arrays (cu_seqlens) are int32
tensors read on the host when the op runs (the library plans from them), so the ops stay
single graph nodes."""
from typing import Optional, Tuple

import torch

from . import _native
from ._problem import flag
from ._problem_inference import check_max_seqlen, check_varlen_shapes, varlen_problem
from ._torch_args import (alibi, autocast, check_devices, check_floats, check_tensor, distinct, float_or_none,
                          float_or_zero, int_in, sinks_arg, threads_arg, window_sides)
from ._torch_ops import (DTYPES, F32, LSE_GRAD_REFUSED, Device, _RefusedDoubleGrad, dense_for_grad, do_with_o_strides,
                         forward_ad_refused, grad_like, int32_ids, lse_as_value_column, poisoned, ptr, readable,
                         refused_lse_grad, dropout_args, seed_value, with_batch0)
from ._torch_vmap import vmap_by_loop

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
    """dropout_batch0 and dropout_batch_stride: set by the vmap rule (_torch_vmap.py)."""
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
    causal, return_lse = flag("causal", causal), flag("return_lse", return_lse)
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
