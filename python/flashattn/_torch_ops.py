"""flashattn::attention_fwd and flashattn::attention_bwd: the custom ops (torch.library)
under flashattn.torch.attention, with their fake (meta) implementations and vmap rules, and
the autograd.Function that differentiates them (lse included).

The ops are opaque single nodes to torch.compile. The autograd.Function has setup_context
and generate_vmap_rule, so torch.func.grad, vjp and vmap compose with it; forward-mode AD
raises NotImplementedError. The op has no autograd formula of its own: under torch.func the
op's generated one (which lacks setup_context) would be reached instead. Tensors reach the
library as pointers with their own strides; copies happen only where strides cannot
describe them. Problems with a zero-size batch, head count or sequence are not run by the
library here (the outputs may be GPU or meta tensors): they are planned once with those
sizes at 1, so bad options still raise the library's message, and the outputs follow
docs/nonfinite.md's rule for a row with no visible key (o = 0, lse = -inf, or the sink)."""
import contextlib
from typing import Optional, Tuple

import torch

from . import _layout, _native
from ._problem import check_sinks_finite, make_options, make_problem
from ._torch_vmap import vmap_by_loop

DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


# ---- buffers and strides, shared by the real and the fake implementations ----------------

def o_shape(q, v, layout):
    B, H, Sq, _ = _layout.to_bhsd(layout, q.shape)
    return _layout.from_bhsd(layout, (B, H, Sq, v.shape[3]))  # D is last in both layouts


def lse_shape(q, layout):
    B, H, Sq, _ = _layout.to_bhsd(layout, q.shape)
    return (B, H, Sq)


def poisoned(t):
    """NaN-filled under FLASHATTN_POISON=1 (tests), so unwritten elements show; real tensors only."""
    if _native.POISON and t.device.type != "meta" and not isinstance(t, torch._subclasses.FakeTensor):
        t.fill_(float("nan"))
    return t


def grad_like(t):
    """A gradient buffer with t's own strides (the library writes dq with q's strides),
    or a dense one where those strides do not suit an output."""
    if _layout.grad_strides_ok(tuple(t.shape), tuple(t.stride())):
        return poisoned(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device))
    return poisoned(torch.empty(t.shape, dtype=t.dtype, device=t.device))


def do_with_o_strides(o, do):
    """(o, do) with do laid out as o: the library reads do with o's strides. do is copied
    into a tensor of o's layout where that layout suits a gradient, else both go contiguous."""
    if do.stride() == o.stride():
        return o, do
    if _layout.grad_strides_ok(tuple(o.shape), tuple(o.stride())):
        return o, grad_like(o).copy_(do)
    return o.contiguous(), do.contiguous()


def dense_for_grad(t):
    """t itself where its gradient can share its strides, else a dense copy (matches grad_like)."""
    return t if _layout.grad_strides_ok(tuple(t.shape), tuple(t.stride())) else t.contiguous()


def readable(t):
    """t where the library can read it through its strides, else a contiguous copy."""
    return t if _layout.passes_as_is(tuple(t.shape), tuple(t.stride())) else t.contiguous()


F32, I32 = torch.float32, torch.int32


def ptr(t, dtype=None):
    """t's address for the library, which reads it as dtype where given (f32 bias, lse,
    slopes, sinks; int32 ids): a tensor of another dtype is a bug in the front, refused
    here rather than read as other bits (a default-dtype f64 bias once was)."""
    if t is None:
        return None
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"flashattn: internal error: a {t.dtype} tensor where the library reads {dtype}")
    return t.data_ptr()


def int32_ids(name, t):
    """An integer tensor as the library's int32, refusing values that int32 cannot hold
    (a cast would wrap them into other ids). Checked where the op runs, on real data."""
    if t is None or t.dtype == torch.int32:
        return None if t is None else t.contiguous()
    # as int64 (torch has no min or max of uint16/32/64); uint64's bits, where values past
    # 2**63 read negative, which is out of range as they are
    wide = t.view(torch.int64) if t.dtype == torch.uint64 else t.to(torch.int64)
    bad = (wide < -(2**31)) | (wide >= 2**31) | ((wide < 0) if not t.dtype.is_signed else False)
    if bad.any():
        v = int(wide[bad][0])
        raise ValueError(f"{name} must fit int32, got {v + 2**64 if v < 0 and not t.dtype.is_signed else v}")
    return t.to(torch.int32).contiguous()


class Device:
    """The backend, stream and workspace for tensors on one device."""

    def __init__(self, t, threads=0):
        self.device = t.device
        self.cuda = t.device.type == "cuda"
        self.threads = threads

    def options(self):
        return make_options("cuda" if self.cuda else "cpu", self.threads)

    def stream(self):
        return torch.cuda.current_stream(self.device).cuda_stream if self.cuda else None

    def workspace(self, handle, which):
        """CUDA scratch from torch's caching allocator (the library would cudaMalloc it);
        on the CPU the library carves its own."""
        if not self.cuda:
            return None, 0
        n = handle.cost(which)["workspace_bytes"]
        if n <= 0:
            return None, 0
        return torch.empty(n, dtype=torch.uint8, device=self.device), n

    def run(self, fn):
        with torch.cuda.device(self.device) if self.cuda else contextlib.nullcontext():
            fn()


# ---- the dense problem ---------------------------------------------------------------

def _problem(q, k, v, o_stride, bias, alibi, segment_ids, opts, bias_grad=False, sinks=False, dropout=(0.0, 0),
             mask=0, batch0=0):
    """batch0: dropout's b of batch item 0 (fa_problem.dropout_batch0; the vmap rule's)."""
    causal, wl, wr, softcap, scale, L, diag_offset, bias_scale = opts
    strides = {} if o_stride is None else dict(
        q_stride=_layout.to_bhsd(L, q.stride()), k_stride=_layout.to_bhsd(L, k.stride()),
        v_stride=_layout.to_bhsd(L, v.stride()), o_stride=_layout.to_bhsd(L, o_stride),
        bias_stride=None if bias is None else tuple(bias.stride()))
    p = make_problem(
        q_dims=_layout.to_bhsd(L, q.shape), k_dims=_layout.to_bhsd(L, k.shape),
        v_dims=_layout.to_bhsd(L, v.shape), dtype=DTYPES[q.dtype], causal=causal,
        window=(wl, wr), softcap=softcap, scale=scale,
        bias_shape=None if bias is None else tuple(bias.shape), alibi=alibi,
        segment_ids=segment_ids, diag_offset=diag_offset, bias_scale=bias_scale,
        bias_grad=bias_grad, sinks=sinks, dropout_p=dropout[0], seed=dropout[1], mask=mask, **strides)
    return with_batch0(p, batch0)


def with_batch0(p, batch0):
    """Problem p with dropout's b of item 0 at batch0 where it drops (without dropout the
    field changes nothing, and left at 0 the plan is every element's, one cache entry)."""
    if p.dropout_p > 0:
        p.dropout_batch0 = batch0
    return p


def _empty_sizes(q, k, layout):
    B, Hq, Sq, _ = _layout.to_bhsd(layout, q.shape)
    _, Hk, Sk, _ = _layout.to_bhsd(layout, k.shape)
    return 0 in (B, Hq, Hk, Sq, Sk)


def _check_empty(q, k, v, bias, alibi, segment_ids, opts, threads, bias_grad=False, sinks=False):
    """Plans the problem with every zero size at 1 (shapes only), so that what the library
    would refuse besides the zero sizes (D = 0, bad options) still raises its message."""
    L = opts[5]
    qd, kd = list(_layout.to_bhsd(L, q.shape)), list(_layout.to_bhsd(L, k.shape))
    if qd[1] == 0 and kd[1] > 0:
        qd[1] = kd[1]  # zero query heads are a multiple of any key head count
    qd, kd = [max(n, 1) for n in qd[:3]] + qd[3:], [max(n, 1) for n in kd[:3]] + kd[3:]
    vd = kd[:3] + [v.shape[3]]
    sub = [torch.empty(_layout.from_bhsd(L, d), dtype=q.dtype, device="meta") for d in (qd, kd, vd)]
    bsub = None if bias is None else torch.empty(
        (1 if bias.shape[0] == 1 else qd[0], 1 if bias.shape[1] == 1 else qd[1], qd[2], kd[2]), dtype=torch.float32,
        device="meta")
    _native.cached_plan(_problem(*sub, None, bsub, alibi, segment_ids, opts, bias_grad, sinks),
                        make_options("cpu", threads))


def empty_lse(shape, sinks, device):
    """lse [B, H, Sq] of rows that see no key: -inf, or each head's sink."""
    lse = torch.full(shape, float("-inf"), dtype=torch.float32, device=device)
    if sinks is not None and lse.numel():
        lse.copy_(sinks.view(1, -1, 1).expand(shape))
    return lse


@torch.library.custom_op("flashattn::attention_fwd", mutates_args=())
def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor],
                   alibi_slopes: Optional[torch.Tensor], q_segment_ids: Optional[torch.Tensor],
                   kv_segment_ids: Optional[torch.Tensor], causal: bool, window_left: int,
                   window_right: int, softcap: float, scale: Optional[float], layout: str,
                   diag_offset: Optional[int], bias_scale: Optional[float],
                   threads: int = 0, sinks: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                   seed: Optional[torch.Tensor] = None, mask: int = 0, dropout_batch0: int = 0,
                   dropout_batch_stride: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """dropout_batch0 and dropout_batch_stride: set by the vmap rule (_torch_vmap.py), 0 otherwise."""
    opts = (causal, window_left, window_right, softcap, scale, layout, diag_offset, bias_scale)
    seed = seed_value(seed)
    alibi, segs, has_sinks = alibi_slopes is not None, q_segment_ids is not None, sinks is not None
    if _empty_sizes(q, k, layout):
        _check_empty(q, k, v, bias, alibi, segs, opts, threads, sinks=has_sinks)
        if has_sinks and sinks.device.type != "meta":  # the library's rule, with no library call to apply it
            check_sinks_finite(sinks.detach().cpu().numpy(), "forward")
        return (torch.zeros(o_shape(q, v, layout), dtype=q.dtype, device=q.device),
                empty_lse(lse_shape(q, layout), sinks, q.device))
    q, k, v = readable(q), readable(k), readable(v)
    bias = None if bias is None else readable(bias)
    qs, ks = int32_ids("q_segment_ids", q_segment_ids), int32_ids("kv_segment_ids", kv_segment_ids)
    o = poisoned(torch.empty(o_shape(q, v, layout), dtype=q.dtype, device=q.device))
    lse = poisoned(torch.empty(lse_shape(q, layout), dtype=torch.float32, device=q.device))
    dev = Device(q, threads)
    handle = _native.cached_plan(_problem(q, k, v, o.stride(), bias, alibi, segs, opts, sinks=has_sinks,
                                          dropout=(dropout_p, seed), mask=mask, batch0=dropout_batch0),
                                 dev.options())
    ws, ws_size = dev.workspace(handle, _native.FORWARD)
    dev.run(lambda: handle.forward(_native.ForwardArgs(
        q=ptr(q), k=ptr(k), v=ptr(v), o=ptr(o), lse=ptr(lse, F32), bias=ptr(bias, F32),
        alibi_slopes=ptr(alibi_slopes, F32), q_segment_ids=ptr(qs, I32), kv_segment_ids=ptr(ks, I32),
        workspace=ptr(ws), workspace_size=ws_size, stream=dev.stream(), sinks=ptr(sinks, F32))))
    return o, lse


@_attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, bias, alibi_slopes, q_segment_ids, kv_segment_ids, causal,
                        window_left, window_right, softcap, scale, layout, diag_offset, bias_scale,
                        threads=0, sinks=None, dropout_p=0.0, seed=None, mask=0, dropout_batch0=0,
                        dropout_batch_stride=0):
    return q.new_empty(o_shape(q, v, layout)), q.new_empty(lse_shape(q, layout), dtype=torch.float32)


@torch.library.custom_op("flashattn::attention_bwd", mutates_args=())
def _attention_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, do: torch.Tensor, bias: Optional[torch.Tensor],
                   alibi_slopes: Optional[torch.Tensor], q_segment_ids: Optional[torch.Tensor],
                   kv_segment_ids: Optional[torch.Tensor], causal: bool, window_left: int,
                   window_right: int, softcap: float, scale: Optional[float], layout: str,
                   diag_offset: Optional[int], bias_scale: Optional[float],
                   bias_grad: bool, threads: int = 0, sinks: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                   seed: Optional[torch.Tensor] = None, mask: int = 0, dropout_batch0: int = 0,
                   dropout_batch_stride: int = 0
                   ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv, dbias ((0,) without bias_grad) and dsink ((0,) without sinks); the dropout
    batch arguments as attention_fwd's, so that the backward regenerates its masks."""
    opts = (causal, window_left, window_right, softcap, scale, layout, diag_offset, bias_scale)
    seed = seed_value(seed)
    alibi, segs, has_sinks = alibi_slopes is not None, q_segment_ids is not None, sinks is not None
    if _empty_sizes(q, k, layout):  # nothing visible anywhere: every gradient is 0 but dsink's
        _check_empty(q, k, v, bias, alibi, segs, opts, threads, bias_grad, has_sinks)
        # dsink_h = -sum of do . o over head h's rows (o = 0): 0, or NaN from do, as the library
        heads = 1 if layout == "bhsd" else 2
        dsink = (0.0 - (do.float() * o.float()).sum([d for d in range(4) if d != heads]) if has_sinks
                 else torch.zeros((0,), dtype=torch.float32, device=q.device))
        return tuple(torch.zeros_like(t) for t in (q, k, v)) + (
            torch.zeros(bias.shape if bias_grad else (0,), dtype=torch.float32, device=q.device), dsink)
    q, k, v = dense_for_grad(q), dense_for_grad(k), dense_for_grad(v)
    dq, dk, dv = grad_like(q), grad_like(k), grad_like(v)
    bias = None if bias is None else readable(bias)
    qs, ks = int32_ids("q_segment_ids", q_segment_ids), int32_ids("kv_segment_ids", kv_segment_ids)
    lse = lse.contiguous()
    o, do = do_with_o_strides(readable(o), do)
    dbias = poisoned(torch.empty(bias.shape if bias_grad else (0,), dtype=torch.float32, device=q.device))
    dsink = poisoned(torch.empty(sinks.shape if has_sinks else (0,), dtype=torch.float32, device=q.device))
    dev = Device(q, threads)
    handle = _native.cached_plan(_problem(q, k, v, o.stride(), bias, alibi, segs, opts, bias_grad, has_sinks,
                                          (dropout_p, seed), mask, dropout_batch0), dev.options())
    ws, ws_size = dev.workspace(handle, _native.BACKWARD)
    dev.run(lambda: handle.backward(_native.BackwardArgs(
        q=ptr(q), k=ptr(k), v=ptr(v), o=ptr(o), d_o=ptr(do), lse=ptr(lse, F32),
        dq=ptr(dq), dk=ptr(dk), dv=ptr(dv), dbias=ptr(dbias, F32) if bias_grad else None,
        bias=ptr(bias, F32), alibi_slopes=ptr(alibi_slopes, F32), q_segment_ids=ptr(qs, I32),
        kv_segment_ids=ptr(ks, I32), workspace=ptr(ws), workspace_size=ws_size, stream=dev.stream(),
        sinks=ptr(sinks, F32), dsink=ptr(dsink, F32) if has_sinks else None)))
    return dq, dk, dv, dbias, dsink


@_attention_bwd.register_fake
def _attention_bwd_fake(q, k, v, o, lse, do, bias, alibi_slopes, q_segment_ids, kv_segment_ids,
                        causal, window_left, window_right, softcap, scale, layout, diag_offset,
                        bias_scale, bias_grad, threads=0, sinks=None, dropout_p=0.0, seed=None, mask=0,
                        dropout_batch0=0, dropout_batch_stride=0):
    dq, dk, dv = (grad_like(dense_for_grad(t)) for t in (q, k, v))
    return dq, dk, dv, q.new_empty(bias.shape if bias_grad else (0,), dtype=torch.float32), q.new_empty(
        sinks.shape if sinks is not None else (0,), dtype=torch.float32)


def _dense_batch(args):
    return _layout.to_bhsd(args["layout"], args["q"].shape)[0]


torch.library.register_vmap("flashattn::attention_fwd", vmap_by_loop(torch.ops.flashattn.attention_fwd, _dense_batch))
torch.library.register_vmap("flashattn::attention_bwd", vmap_by_loop(torch.ops.flashattn.attention_bwd, _dense_batch))


# ---- autograd ----------------------------------------------------------------------

def lse_as_value_column(v, o, do, dlse, lse_to_rows):
    """The backward's v, o and do carrying lse's cotangent dlse. d lse_i / d s_ij = p_ij, so
    dlse adds dlse_i to every dp_ij of row i: it goes to the library's backward as one more
    value column, ones in v, dlse in do (lse_to_rows lays it out as do's rows), and 0 in o
    so that the row term rowsum(do * o) leaves it out. The caller drops dv's last column."""
    col = lse_to_rows(dlse.to(do.dtype))[..., None]
    return (torch.cat([v, v.new_ones(v.shape[:-1] + (1,))], -1),
            torch.cat([o, o.new_zeros(o.shape[:-1] + (1,))], -1),
            torch.cat([do, col], -1))


def forward_ad_refused(name):
    raise NotImplementedError(f"{name} has no forward-mode derivative (torch.func.jvp, "
                              "torch.autograd.forward_ad): use reverse mode (backward, grad, vjp)")


def _mask_ptr(mask):
    """The op's mask operand: a NativeMask's address (the autograd.Function's argument), or
    the address itself (the op's own autograd, which torch.export keeps, sees the op's)."""
    return 0 if mask is None else mask if isinstance(mask, int) else mask.ptr


class AttentionCompiled(torch.autograd.Function):
    """attention_fwd, differentiable in q, k, v, bias, through o and lse. What torch.compile
    traces (Dynamo refuses an autograd.Function with a jvp); Attention adds the jvp."""
    generate_vmap_rule = True

    @staticmethod
    def forward(q, k, v, bias, slopes, q_seg, kv_seg, causal, wl, wr, softcap, scale, layout,
                diag_offset, bias_scale, threads, sinks=None, dropout_p=0.0, seed=None, mask=None):
        # mask: a flashattn.masks NativeMask (None: none); the op gets its address, and
        # setup_context keeps the object, so it outlives the backward that uses it too. No
        # no_grad here: torch.export records one as a region around the op, which then left
        # the exported program without gradients through the attention (and after it)
        return torch.ops.flashattn.attention_fwd(q, k, v, bias, slopes, q_seg, kv_seg, causal, wl, wr,
                                                 softcap, scale, layout, diag_offset, bias_scale, threads,
                                                 sinks, dropout_p, seed, _mask_ptr(mask))

    @staticmethod
    def setup_context(ctx, inputs, output, op_level=False):
        # inputs: q, k, v, bias, slopes, q_seg, kv_seg, 9 options (causal .. threads), then
        # optionally sinks, dropout_p, seed, mask. op_level: the op's own autograd (below)
        sinks = inputs[16] if len(inputs) > 16 else None
        seed = inputs[18] if len(inputs) > 18 else None  # a tensor (seed_tensor): saved with the others
        ctx.save_for_backward(*inputs[:3], *output, *inputs[3:7], sinks, seed)
        ctx.n_inputs = len(inputs)
        ctx.options = tuple(inputs[7:16]) + (inputs[17] if len(inputs) > 17 else 0.0,)  # dropout_p: 0 if not given
        ctx.mask = inputs[19] if len(inputs) > 19 else None  # kept alive for the backward
        ctx.dropout_batch = tuple(inputs[20:22])  # the vmap rule's (the op's own autograd), for the backward
        # the op's own autograd (torch.export) keeps lse differentiable under dropout, so that
        # its backward sees a gradient reaching lse and refuses it: export drops the caller's
        # refused_lse_grad, an autograd.Function, with the others
        ctx.refuse_lse = op_level and ctx.options[9] > 0
        if ctx.options[9] > 0 and not op_level:
            # under dropout lse has no gradient here (refused_lse_grad refuses one where the
            # caller returns lse), so the backward never sees a dlse; torch.compile then traces
            # the backward whole instead of breaking its graph at the refusal below
            ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse, bias, slopes, q_seg, kv_seg, sinks, seed = ctx.saved_tensors
        nones = (None,) * (ctx.n_inputs - 4)
        if do is None and dlse is None:
            return (None,) * 4 + nones
        do = torch.zeros_like(o) if do is None else do
        layout, threads, dropout_p = ctx.options[5], ctx.options[8], ctx.options[9]
        mask = ctx.mask
        if dropout_p > 0:
            if ctx.refuse_lse and dlse is not None and bool((dlse != 0).any()):
                raise NotImplementedError(LSE_GRAD_REFUSED)
            # lse is non-differentiable under dropout (setup_context): no dlse reaches here
            # in eager mode, and the one torch.compile traces with is not a real gradient.
            # (lse's cotangent would ride on dP, lse_as_value_column, which dropout scales.)
            dlse = None
        if dlse is not None:
            to_rows = (lambda x: x) if layout == "bhsd" else (lambda x: x.transpose(1, 2))
            v, o, do = lse_as_value_column(v, o, do, dlse, to_rows)
        bias_grad = bias is not None and ctx.needs_input_grad[3]
        with torch.no_grad():  # no second derivative: the op's own autograd would refuse it anyway
            dq, dk, dv, dbias, dsink = torch.ops.flashattn.attention_bwd(
                q, k, v, o, lse, do, bias, slopes, q_seg, kv_seg, *ctx.options[:8], bias_grad, threads, sinks,
                dropout_p, seed, _mask_ptr(mask), *ctx.dropout_batch)
            if dlse is not None and sinks is not None:
                # d lse_i / d sink_h = exp(sink_h - lse_i): lse's cotangent reaches the sink
                # directly (the value column above carries it to the scores only)
                dsink = dsink + (torch.exp(sinks.view(1, -1, 1) - lse) * dlse).sum((0, 2))
        if dlse is not None:
            dv = dv[..., :-1]
        grads = [dq, dk, dv, dbias if bias_grad else None, *nones]
        if sinks is not None and ctx.needs_input_grad[16]:
            grads[16] = dsink  # inputs[16] is sinks
        if torch.is_grad_enabled():  # create_graph=True: their own gradient must raise, not be silently 0
            deps = [t for t in (q, k, v, bias, sinks, do) if t is not None and t.requires_grad]
            if deps:
                grads = [g if g is None else _RefusedDoubleGrad.apply(g, *deps) for g in grads]
        return tuple(grads)


class _RefusedGrad(torch.autograd.Function):
    """A tensor as it is (its first input; the others only make it depend on them), whose
    gradient raises: subclasses say why in backward."""

    @staticmethod
    def forward(x, *inputs):
        return x.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass


class _RefusedDoubleGrad(_RefusedGrad):
    """A gradient of the attention: the backward kernel is not differentiable, so a double
    backward (create_graph=True, a gradient penalty) would otherwise drop its second-order
    terms without a word (torch's SDPA raises too)."""
    generate_vmap_rule = True  # torch.func.grad runs backwards with a graph, under vmap too

    @staticmethod
    def backward(ctx, gg):
        raise NotImplementedError("flashattn's attention backward is not differentiable: a double backward "
                                  "(create_graph=True, e.g. a gradient penalty) is not supported")


LSE_GRAD_REFUSED = ("a gradient through lse with dropout (dropout_p > 0) is not supported: "
                    "use o alone, or dropout_p=0")


class _RefusedLseGrad(_RefusedGrad):
    """lse under dropout, which the attention Function leaves without a gradient (one
    through it would be silently missing)."""

    @staticmethod
    def backward(ctx, dlse):
        raise NotImplementedError(LSE_GRAD_REFUSED)


@torch.library.custom_op("flashattn::lse_grad_refused", mutates_args=())
def _lse_grad_refused(dlse: torch.Tensor) -> torch.Tensor:
    """lse's gradient under dropout where the backward runs (compiled graphs): one with a
    nonzero (or NaN) element raises; zeros, which a compiled graph passes for an output that
    got no gradient, give a 0-dim zero (a zero gradient through lse misses nothing)."""
    if dlse.numel() and bool((dlse != 0).any()):
        raise NotImplementedError(LSE_GRAD_REFUSED)
    return torch.zeros((), dtype=torch.float32, device=dlse.device)


@_lse_grad_refused.register_fake
def _lse_grad_refused_fake(dlse):
    return dlse.new_empty((), dtype=torch.float32)


class _RefusedLseGradCompiled(_RefusedGrad):
    """_RefusedLseGrad for torch.compile, which traces a backward ahead of time (when the
    forward is compiled, whether or not a gradient ever reaches lse): one that raises there
    fails every fullgraph=True compile with return_lse under dropout. The refusal is the
    op flashattn::lse_grad_refused, run with the backward; its 0-dim zero is added to the
    gradients of q, k and v (those that require one), so that the graph keeps it."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.metas = [(t.shape, t.dtype) for t in inputs[1:]]

    @staticmethod
    def backward(ctx, dlse):
        z = torch.ops.flashattn.lse_grad_refused(dlse)
        return (None,) + tuple(z.to(dtype).expand(shape) if need else None
                               for (shape, dtype), need in zip(ctx.metas, ctx.needs_input_grad[1:]))


def refused_lse_grad(lse, q, k, v):
    """lse under dropout for the caller: it requires grad where q, k or v do, and a
    gradient reaching it raises NotImplementedError (compiled: a nonzero one, when the
    backward runs)."""
    fn = _RefusedLseGradCompiled if torch.compiler.is_compiling() else _RefusedLseGrad
    return fn.apply(lse, q, k, v)


class Attention(AttentionCompiled):
    """AttentionCompiled with forward-mode AD refused by name (eager calls)."""

    @staticmethod
    def jvp(ctx, *tangents):
        forward_ad_refused("flashattn::attention_fwd (flashattn.torch.attention, scaled_dot_product_attention)")


class _AttentionExported:
    """What torch.export traces: the op itself, differentiable by its own autograd (below).
    Export's tracing (strict mode: Dynamo) runs an autograd.Function's forward under no_grad
    and keeps only the op, so the exported program's backward stopped at the attention."""

    @staticmethod
    def apply(*args):
        assert len(args) < 20 or args[19] is None  # a mask object is refused before (torch.py, _native_mask)
        return torch.ops.flashattn.attention_fwd(*args[:19])


def attention_function():
    if torch.compiler.is_exporting():
        return _AttentionExported
    return AttentionCompiled if torch.compiler.is_compiling() else Attention


# The op's own autograd (AttentionCompiled's rules, on the op's arguments: the mask as its
# address): torch.export keeps the op, not the Function around it, and an exported program's
# backward runs these (as varlen_fwd's, _torch_inference.py)
_attention_fwd.register_autograd(
    AttentionCompiled.backward,
    setup_context=lambda ctx, inputs, output: AttentionCompiled.setup_context(ctx, inputs, output, op_level=True))



def dropout_seed(generator=None):
    """A dropout seed drawn from torch's generator (the default CPU one unless given), as
    flashattn.torch.attention and scaled_dot_product_attention draw it when given none:
    torch.randint(0, 2**62, ()), so torch.manual_seed reproduces a run's masks."""
    return int(seed_tensor(None, generator))


def _concrete_int(t):
    """A 0-dim integer tensor's value, or None where it has none yet (traced by torch.compile
    or export, a meta or fake tensor, a vmapped one): the op then judges its int64 value."""
    if torch.compiler.is_compiling() or t.device.type == "meta":
        return None
    try:
        return int(t.item())
    except (RuntimeError, NotImplementedError):
        return None


def seed_tensor(seed=None, generator=None):
    """The ops' seed operand: an int64 scalar tensor on the CPU. None draws it from torch's
    generator, torch.randint(0, 2**62, ()) (a tensor, so torch.compile traces the draw
    instead of breaking its graph at .item()); an int in 0 .. 2**63 - 1 or an integer
    scalar tensor is taken as it is (a negative tensor value is refused when the op runs)."""
    if seed is None:
        return torch.randint(0, 2**62, (), generator=generator)
    if isinstance(seed, torch.Tensor):
        if seed.dim() != 0 or seed.dtype.is_floating_point or seed.dtype.is_complex or seed.dtype == torch.bool:
            raise ValueError(f"seed must be an integer scalar tensor, got {seed.dtype} of shape {tuple(seed.shape)}")
        value = _concrete_int(seed)  # judged as an int seed is, before int64 could wrap it
        if value is not None and not 0 <= value < 2**63:
            raise ValueError(f"seed must be in 0 .. 2**63 - 1, got {value}")
        return seed.to(device="cpu", dtype=torch.int64)
    from ._torch_args import int_in  # here: _torch_args imports this module
    seed = int_in("seed", seed)
    if seed < 0:
        raise ValueError(f"seed must be in 0 .. 2**63 - 1, got {seed}")
    return torch.tensor(seed, dtype=torch.int64)


def dropout_args(dropout_p, seed):
    """A front's dropout_p (a float in [0, 1), None or 0: off) and seed as the ops take them:
    (dropout_p, seed_tensor(seed)), or (0.0, None) without dropout (a seed then checked and
    unused, as in every front: _problem.set_dropout)."""
    from ._torch_args import dropout_p_arg  # here: _torch_args imports this module
    dropout_p = dropout_p_arg(dropout_p)
    if dropout_p > 0.0:
        return dropout_p, seed_tensor(seed)
    if seed is not None:
        seed_tensor(seed)
    return 0.0, None


def seed_value(seed):
    """The op's seed operand as the library's unsigned seed (0 without dropout)."""
    if seed is None:
        return 0
    value = int(seed)
    if value < 0:
        raise ValueError(f"seed must be in 0 .. 2**63 - 1, got {value}")
    return value
