"""The PyTorch front: flashattn.torch.attention, differentiable, opaque to torch.compile
(varlen_attention and kvcache_attention, the inference shapes, come from _torch_inference.py).

Two custom ops (torch.library), flashattn::attention_fwd and flashattn::attention_bwd, with
fake (meta) implementations and an autograd formula, so torch.compile keeps them in the graph
as single nodes instead of breaking the graph around them. CPU tensors always; CUDA tensors
on the current stream where the library was built with CUDA. Tensors reach the library as
pointers with their own strides; copies happen only where strides cannot describe them."""
import contextlib
from typing import Optional, Tuple

import torch

from . import _layout, _native
from ._problem import check_shapes, make_options, make_problem, window_pair

_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


# ---- shapes and strides, shared by the real and the fake implementations ----------------

def _o_shape(q, v, layout):
    B, H, Sq, _ = _layout.to_bhsd(layout, q.shape)
    return _layout.from_bhsd(layout, (B, H, Sq, v.shape[3]))  # D is last in both layouts


def _lse_shape(q, layout):
    B, H, Sq, _ = _layout.to_bhsd(layout, q.shape)
    return (B, H, Sq)


def _poisoned(t):
    """NaN-filled under FLASHATTN_POISON=1 (tests), so unwritten elements show; real tensors only."""
    if _native.POISON and t.device.type != "meta" and not isinstance(t, torch._subclasses.FakeTensor):
        t.fill_(float("nan"))
    return t


def _grad_like(t):
    """A gradient buffer with t's own strides (the library writes dq with q's strides),
    or a dense one where those strides do not suit an output."""
    if _layout.grad_strides_ok(tuple(t.shape), tuple(t.stride())):
        return _poisoned(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device))
    return _poisoned(torch.empty(t.shape, dtype=t.dtype, device=t.device))


def _do_with_o_strides(o, do):
    """(o, do) with do laid out as o: the library reads do with o's strides. do is copied
    into a tensor of o's layout where that layout suits a gradient, else both go contiguous."""
    if do.stride() == o.stride():
        return o, do
    if _layout.grad_strides_ok(tuple(o.shape), tuple(o.stride())):
        return o, _grad_like(o).copy_(do)
    return o.contiguous(), do.contiguous()


def _dense_for_grad(t):
    """t itself where its gradient can share its strides, else a dense copy (matches _grad_like)."""
    return t if _layout.grad_strides_ok(tuple(t.shape), tuple(t.stride())) else t.contiguous()


# ---- calls into the library ----------------------------------------------------------

def _ptr(t):
    return None if t is None else t.data_ptr()


def _problem(q, k, v, o_stride, bias, alibi_slopes, q_segment_ids, causal, window_left,
             window_right, softcap, scale, layout, diag_offset, bias_scale, bias_grad=False):
    L = layout
    return make_problem(
        q_dims=_layout.to_bhsd(L, q.shape), k_dims=_layout.to_bhsd(L, k.shape),
        v_dims=_layout.to_bhsd(L, v.shape), dtype=_DTYPES[q.dtype],
        q_stride=_layout.to_bhsd(L, q.stride()), k_stride=_layout.to_bhsd(L, k.stride()),
        v_stride=_layout.to_bhsd(L, v.stride()), o_stride=_layout.to_bhsd(L, o_stride),
        causal=causal, window=(window_left, window_right), softcap=softcap, scale=scale,
        bias_shape=None if bias is None else tuple(bias.shape),
        bias_stride=None if bias is None else tuple(bias.stride()),
        alibi=alibi_slopes is not None, segment_ids=q_segment_ids is not None,
        diag_offset=diag_offset, bias_scale=bias_scale, bias_grad=bias_grad)


class _Device:
    """The backend, stream and workspace for tensors on one device."""

    def __init__(self, t):
        self.device = t.device
        self.cuda = t.device.type == "cuda"

    def options(self):
        return make_options("cuda" if self.cuda else "cpu")

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


def _readable(t):
    """t where the library can read it through its strides, else a contiguous copy."""
    return t if _layout.passes_as_is(tuple(t.shape), tuple(t.stride())) else t.contiguous()


@torch.library.custom_op("flashattn::attention_fwd", mutates_args=())
def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor],
                   alibi_slopes: Optional[torch.Tensor], q_segment_ids: Optional[torch.Tensor],
                   kv_segment_ids: Optional[torch.Tensor], causal: bool, window_left: int,
                   window_right: int, softcap: float, scale: Optional[float], layout: str,
                   diag_offset: Optional[int], bias_scale: Optional[float]) -> Tuple[torch.Tensor, torch.Tensor]:
    q, k, v = _readable(q), _readable(k), _readable(v)
    bias = None if bias is None else _readable(bias)
    o = _poisoned(torch.empty(_o_shape(q, v, layout), dtype=q.dtype, device=q.device))
    lse = _poisoned(torch.empty(_lse_shape(q, layout), dtype=torch.float32, device=q.device))
    dev = _Device(q)
    handle = _native.cached_plan(
        _problem(q, k, v, o.stride(), bias, alibi_slopes, q_segment_ids, causal, window_left,
                 window_right, softcap, scale, layout, diag_offset, bias_scale), dev.options())
    ws, ws_size = dev.workspace(handle, _native.FORWARD)
    with torch.cuda.device(q.device) if dev.cuda else contextlib.nullcontext():
        handle.forward(_native.ForwardArgs(
            q=_ptr(q), k=_ptr(k), v=_ptr(v), o=_ptr(o), lse=_ptr(lse), bias=_ptr(bias),
            alibi_slopes=_ptr(alibi_slopes), q_segment_ids=_ptr(q_segment_ids),
            kv_segment_ids=_ptr(kv_segment_ids), workspace=_ptr(ws), workspace_size=ws_size,
            stream=dev.stream()))
    return o, lse


@_attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, bias, alibi_slopes, q_segment_ids, kv_segment_ids, causal,
                        window_left, window_right, softcap, scale, layout, diag_offset, bias_scale):
    o = q.new_empty(_o_shape(q, v, layout))
    lse = q.new_empty(_lse_shape(q, layout), dtype=torch.float32)
    return o, lse


@torch.library.custom_op("flashattn::attention_bwd", mutates_args=())
def _attention_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, do: torch.Tensor, bias: Optional[torch.Tensor],
                   alibi_slopes: Optional[torch.Tensor], q_segment_ids: Optional[torch.Tensor],
                   kv_segment_ids: Optional[torch.Tensor], causal: bool, window_left: int,
                   window_right: int, softcap: float, scale: Optional[float], layout: str,
                   diag_offset: Optional[int], bias_scale: Optional[float],
                   bias_grad: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = _dense_for_grad(q), _dense_for_grad(k), _dense_for_grad(v)
    dq, dk, dv = _grad_like(q), _grad_like(k), _grad_like(v)
    bias = None if bias is None else _readable(bias)
    lse = lse.contiguous()
    o = _readable(o)
    o, do = _do_with_o_strides(o, do)
    dbias = _poisoned(torch.empty(bias.shape if bias_grad else (0,), dtype=torch.float32, device=q.device))
    dev = _Device(q)
    handle = _native.cached_plan(
        _problem(q, k, v, o.stride(), bias, alibi_slopes, q_segment_ids, causal, window_left,
                 window_right, softcap, scale, layout, diag_offset, bias_scale, bias_grad), dev.options())
    ws, ws_size = dev.workspace(handle, _native.BACKWARD)
    with torch.cuda.device(q.device) if dev.cuda else contextlib.nullcontext():
        handle.backward(_native.BackwardArgs(
            q=_ptr(q), k=_ptr(k), v=_ptr(v), o=_ptr(o), d_o=_ptr(do), lse=_ptr(lse),
            dq=_ptr(dq), dk=_ptr(dk), dv=_ptr(dv), dbias=_ptr(dbias) if bias_grad else None,
            bias=_ptr(bias), alibi_slopes=_ptr(alibi_slopes), q_segment_ids=_ptr(q_segment_ids),
            kv_segment_ids=_ptr(kv_segment_ids), workspace=_ptr(ws), workspace_size=ws_size,
            stream=dev.stream()))
    return dq, dk, dv, dbias


@_attention_bwd.register_fake
def _attention_bwd_fake(q, k, v, o, lse, do, bias, alibi_slopes, q_segment_ids, kv_segment_ids,
                        causal, window_left, window_right, softcap, scale, layout, diag_offset,
                        bias_scale, bias_grad):
    dq, dk, dv = (_grad_like(_dense_for_grad(t)) for t in (q, k, v))
    dbias = q.new_empty(bias.shape if bias_grad else (0,), dtype=torch.float32)
    return dq, dk, dv, dbias


def _setup_context(ctx, inputs, output):
    q, k, v, bias, alibi_slopes, q_seg, kv_seg = inputs[:7]
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, bias, alibi_slopes, q_seg, kv_seg)
    ctx.options = inputs[7:]
    ctx.mark_non_differentiable(lse)


def _backward(ctx, do, dlse):
    q, k, v, o, lse, bias, alibi_slopes, q_seg, kv_seg = ctx.saved_tensors
    bias_grad = bias is not None and ctx.needs_input_grad[3]
    dq, dk, dv, dbias = torch.ops.flashattn.attention_bwd(
        q, k, v, o, lse, do, bias, alibi_slopes, q_seg, kv_seg, *ctx.options, bias_grad)
    return (dq, dk, dv, dbias if bias_grad else None) + (None,) * (len(ctx.options) + 3)


_attention_fwd.register_autograd(_backward, setup_context=_setup_context)


# ---- the public function -------------------------------------------------------------

def _check_tensor(name, t, ndim=None):
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    return t


def attention(q, k, v, *, causal=False, window=None, softcap=None, scale=None, bias=None,
              alibi_slopes=None, q_segment_ids=None, kv_segment_ids=None, layout="bhsd",
              return_lse=False, bias_scale=None, diag_offset=None):
    """Exact attention softmax(scale * q k^T [+ bias, masks]) v, differentiable in q, k, v.

    q [B, Hq, Sq, D], k [B, Hk, Sk, D], v [B, Hk, Sk, Dv] (layout "bhsd", as
    F.scaled_dot_product_attention), or [B, S, H, D] each with layout="bshd"; float32,
    float16 or bfloat16, one dtype, one device. Hq a multiple of Hk (GQA/MQA). Masks align
    bottom-right (causal: key j <= i + Sk - Sq; for Sq == Sk the same as is_causal).
    window (left, right), -1 unbounded; softcap > 0: cap * tanh(s / cap); bias (f32, or
    converted to it) broadcastable to [B or 1, Hq or 1, Sq, Sk]; alibi_slopes [Hq]; segment
    ids [B, Sq] and [B, Sk]. Returns o in q's layout, and lse [B, Hq, Sq] f32 (not
    differentiable) with return_lse. Beyond the issue's signature: bias_scale (s +=
    bias_scale * bias) and diag_offset (query i sits at key position i + diag_offset;
    0 aligns masks top-left, as SDPA's is_causal)."""
    L = _layout.check_layout(layout)
    q, k, v = (_check_tensor(n, t, 4) for n, t in (("q", q), ("k", k), ("v", v)))
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in _DTYPES:
        raise ValueError(f"q, k, v must be float32, float16 or bfloat16, got {q.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"flashattn runs on cpu and cuda tensors, got device {q.device}")
    qd, kd, vd = (_layout.to_bhsd(L, tuple(t.shape)) for t in (q, k, v))
    check_shapes(qd, kd, vd)
    B, H, Sq, _ = qd
    Sk = kd[2]

    def same_device(name, t):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")

    if bias is not None:
        _check_tensor("bias", bias)
        same_device("bias", bias)
        if not 2 <= bias.dim() <= 4:
            raise ValueError(f"bias must have 2 to 4 dims ([B or 1, H or 1, Sq, Sk]), got shape {tuple(bias.shape)}")
        if bias.is_complex():
            raise ValueError(f"bias must be real, got {bias.dtype}")
        bias = bias.to(torch.float32).reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
        bb, bh = bias.shape[0], bias.shape[1]
        if tuple(bias.shape[2:]) != (Sq, Sk) or bb not in (1, B) or bh not in (1, H):
            raise ValueError(f"bias shape {tuple(bias.shape)} must be [1 or batch ({B}), 1 or heads ({H}), {Sq}, {Sk}]")
    if alibi_slopes is not None:
        _check_tensor("alibi_slopes", alibi_slopes)
        same_device("alibi_slopes", alibi_slopes)
        if tuple(alibi_slopes.shape) != (H,):
            raise ValueError(f"alibi_slopes must have shape [H] = [{H}], got {tuple(alibi_slopes.shape)}")
        alibi_slopes = alibi_slopes.detach().to(torch.float32).contiguous()
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("q_segment_ids and kv_segment_ids go together: pass both or neither")
    if q_segment_ids is not None:
        segs = []
        for name, t, S in (("q_segment_ids", q_segment_ids, Sq), ("kv_segment_ids", kv_segment_ids, Sk)):
            _check_tensor(name, t)
            same_device(name, t)
            if tuple(t.shape) != (B, S) or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
                raise ValueError(f"{name} must be integers of shape [B, S] = [{B}, {S}], got {t.dtype} {tuple(t.shape)}")
            segs.append(t.to(torch.int32).contiguous())
        q_segment_ids, kv_segment_ids = segs
    wl, wr = window_pair(window)
    softcap = 0.0 if softcap is None else float(softcap)
    scale = None if scale is None else float(scale)
    bias_scale = None if bias_scale is None else float(bias_scale)
    diag_offset = None if diag_offset is None else int(diag_offset)
    o, lse = _attention_fwd(q, k, v, bias, alibi_slopes, q_segment_ids, kv_segment_ids,
                            bool(causal), wl, wr, softcap, scale, L, diag_offset, bias_scale)
    return (o, lse) if return_lse else o


# the inference shapes (packed batches, kv-cache decoding): python/flashattn/_torch_inference.py
from ._torch_inference import kvcache_attention, varlen_attention  # noqa: E402,F401
