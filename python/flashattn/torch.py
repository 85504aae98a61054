"""The PyTorch front: flashattn.torch.attention, differentiable (autograd and torch.func),
opaque to torch.compile; scaled_dot_product_attention, the drop-in for SDPA
(python/flashattn/_torch_sdpa.py); varlen_attention and kvcache_attention, the inference
shapes (python/flashattn/_torch_inference.py and _torch_decode.py); flex_cost, the exact
cost of a call with a FlexAttention BlockMask (python/flashattn/_torch_flex.py converts it).

The custom ops and their autograd live in python/flashattn/_torch_ops.py: CPU tensors
always; CUDA tensors on the current stream where the library was built with CUDA; meta and
fake tensors give shapes only."""
import torch

from . import _layout
from ._problem import check_shapes, empty_dims, flag
from ._torch_args import (alibi, autocast, check_floats, check_tensor, combine_bias_mask, distinct,
                          float_or_none, float_or_zero, int_in, refuse_bool_bias, sinks_arg, threads_arg, window_sides)
from ._torch_ops import DTYPES, attention_function, dropout_args, dropout_seed, refused_lse_grad
from .masks import Mask, build_for_call


def _segment_ids(q_segment_ids, kv_segment_ids, B, Sq, Sk, device):
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("q_segment_ids and kv_segment_ids go together: pass both or neither")
    if q_segment_ids is None:
        return None, None
    for name, t, S in (("q_segment_ids", q_segment_ids, Sq), ("kv_segment_ids", kv_segment_ids, Sk)):
        check_tensor(name, t)
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but q is on {device}")
        if tuple(t.shape) != (B, S) or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise ValueError(f"{name} must be integers of shape [B, S] = [{B}, {S}], got {t.dtype} {tuple(t.shape)}")
    # values are checked against int32 where the op runs (flashattn::attention_fwd)
    return q_segment_ids.detach(), kv_segment_ids.detach()


def attention(q, k, v, *, causal=False, window=None, softcap=None, scale=None, bias=None, mask=None,
              alibi_slopes=None, q_segment_ids=None, kv_segment_ids=None, layout="bhsd",
              return_lse=False, bias_scale=None, diag_offset=None, threads=None, sinks=None, dropout_p=0.0,
              seed=None, block_mask=None):
    """Exact attention softmax(scale * q k^T [+ bias, masks]) v, differentiable in q, k, v
    and bias, through o and lse (autograd, torch.func.grad / vjp / vmap; not forward mode).

    q [B, Hq, Sq, D], k [B, Hk, Sk, D], v [B, Hk, Sk, Dv] (layout "bhsd", as
    F.scaled_dot_product_attention), or [B, S, H, D] each with layout="bshd"; float32,
    float16 or bfloat16, one dtype, one device (under torch.autocast: autocast's dtype, as
    SDPA). Hq a multiple of Hk (GQA/MQA). Masks align bottom-right (causal: key j <= i +
    Sk - Sq; for Sq == Sk the same as is_causal). window (left, right), -1 unbounded;
    softcap > 0: cap * tanh(s / cap); bias (f32, or converted to it) broadcastable to
    [B, Hq, Sq, Sk]; mask, a boolean tensor broadcastable to [B, Hq, Sq, Sk], True =
    attend, ANDed with causal, window and segment ids (size-1 dims are broadcast, not
    copied, where the library's strides allow); alibi_slopes [Hq]; segment ids [B, Sq] and
    [B, Sk]. A row with no visible key gives o = 0 and lse = -inf (docs/nonfinite.md);
    zero-size B, H, Sq or Sk give empty outputs. Returns o in q's layout, and lse
    [B, Hq, Sq] f32 with return_lse. Beyond the issue's signature: bias_scale (s +=
    bias_scale * bias), diag_offset (query i sits at key position i + diag_offset; 0 aligns
    masks top-left, as SDPA's is_causal) and threads (None or 0: the library's default).
    sinks [Hq] (finite): a per-head logit in each row's softmax denominator that adds nothing
    to o (gpt-oss's attention sinks; docs/semantics.md); lse includes it, a row with no
    visible key gets lse = sink, and autograd gives the sinks' gradient.
    dropout_p in [0, 1) drops each weight after the softmax, scaling the kept ones by
    1 / (1 - dropout_p) (docs/semantics.md, "Dropout"); the mask is a function of seed (an
    integer in 0 .. 2**63 - 1 or an integer scalar tensor; None: drawn from torch's
    generator as dropout_seed() draws it, as a tensor, so that torch.compile keeps one
    graph) and the element's (b, h, i, j), and the backward regenerates it. lse stays undropped; its
    gradient under dropout is not supported.
    mask may also be a flashattn.masks mask (built by the library as a block-sparse mask:
    empty blocks skipped, the plan exact). block_mask: a FlexAttention BlockMask
    (torch.nn.attention.flex_attention.create_block_mask), taken as it is: the blocks it
    lists visited and no others, its partial blocks masked by its mask_mod (evaluated on
    those blocks only); the same results as flex_attention(q, k, v, block_mask=bm); ANDed
    with every other mask (docs/python_masks.md)."""
    causal, return_lse = flag("causal", causal), flag("return_lse", return_lse)
    L = _layout.check_layout(layout)
    q, k, v = (check_tensor(n, t, 4) for n, t in (("q", q), ("k", k), ("v", v)))
    q, k, v = autocast(q, k, v)
    check_floats(("q", "k", "v"), (q, k, v))
    qd, kd, vd = (_layout.to_bhsd(L, tuple(t.shape)) for t in (q, k, v))
    check_shapes(qd, kd, vd)
    B, H, Sq, _ = qd
    Sk = kd[2]
    refuse_bool_bias(bias)
    native_mask = None
    if q.device.type == "meta" and getattr(getattr(block_mask, "kv_num_blocks", None), "device", None) == q.device:
        if tuple(block_mask.seq_lengths) != (Sq, Sk):  # the shapes are checked all the same
            raise ValueError(f"the BlockMask is for (Q_LEN, KV_LEN) = {tuple(block_mask.seq_lengths)} but the call "
                             f"has Sq = {Sq}, Sk = {Sk}")
        block_mask = None  # shapes only (meta in, meta out): no blocks to read, none needed
    if isinstance(mask, Mask) or block_mask is not None:
        native_mask = _native_mask(mask if isinstance(mask, Mask) else None, block_mask, B, H, Sq, Sk,
                                   kd[1], diag_offset, None if q.device.type == "meta" else q.device)
        if isinstance(mask, Mask):
            mask = None
    for name, t in (("bias", bias), ("mask", mask)):
        if t is not None:
            check_tensor(name, t)
            if t.device != q.device:
                raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    bias_scale = float_or_none("bias_scale", bias_scale)
    if bias is not None or mask is not None:
        bias, bias_scale = combine_bias_mask(bias, mask, B, H, Sq, Sk, bias_scale)
    q_seg, kv_seg = _segment_ids(q_segment_ids, kv_segment_ids, B, Sq, Sk, q.device)
    wl, wr = window_sides(window)
    q, k, v = distinct(q, k, v)
    dropout_p, seed = dropout_args(dropout_p, seed)
    o, lse = attention_function().apply(q, k, v, bias, alibi(alibi_slopes, H, q.device), q_seg, kv_seg, bool(causal),
                             wl, wr, float_or_zero("softcap", softcap), float_or_none("scale", scale),
                             L, int_in("diag_offset", diag_offset, optional=True), bias_scale,
                             threads_arg(threads), sinks_arg(sinks, H, q.device), dropout_p, seed, native_mask)
    if return_lse and dropout_p > 0.0:
        lse = refused_lse_grad(lse, q, k, v)
    return (o, lse) if return_lse else o


def _native_mask(mask, block_mask, B, H, Sq, Sk, Hk, diag_offset, device):
    """The library's fa_mask for a flashattn.masks mask and a BlockMask (ANDed); None for a
    zero-size call, which computes nothing."""
    from ._torch_flex import from_block_mask
    if torch.compiler.is_exporting():
        raise ValueError("a flashattn.masks mask or a BlockMask under torch.export: the op takes the mask by "
                         "its address, which an exported program cannot carry; pass a boolean mask= tensor, "
                         "or export without it")
    if torch.compiler.is_compiling():  # only fullgraph=True reaches the user: the others graph-break here
        raise ValueError("a flashattn.masks mask or a BlockMask is built in Python, outside the graph: "
                         "torch.compile(fullgraph=True) cannot hold it (compile without fullgraph: a graph "
                         "break around the call), or pass a boolean mask= tensor")
    if block_mask is not None:
        bm = from_block_mask(block_mask, device)
        mask = bm if mask is None else mask & bm
    return build_for_call(mask, B, H, Sq, Sk, diag_offset=int_in("diag_offset", diag_offset, optional=True),
                          empty=empty_dims(B, H, Hk, Sq, Sk))


@torch.compiler.disable(reason="flashattn.torch.flex_cost reads the BlockMask's blocks and plans on the host, "
                        "outside compiled graphs: call it outside the compiled function (without fullgraph: a "
                        "graph break around it)")
def flex_cost(block_mask, q, k, v, *, scale=None, softcap=None, layout="bhsd", threads=None):
    """flashattn's own exact cost of attention(q, k, v, block_mask=block_mask): the plan's
    figures (every fa_cost field) for "forward" and "backward", from q, k, v's shapes and
    dtype (tensors, meta tensors included), planned for their device's backend. torch.compile
    does not trace it (a graph break; with fullgraph=True an error saying so)."""
    import flashattn
    from ._torch_flex import from_block_mask
    L = _layout.check_layout(layout)
    q, k, v = (check_tensor(n, t, 4) for n, t in (("q", q), ("k", k), ("v", v)))
    check_floats(("q", "k", "v"), (q, k, v))
    qd, kd, vd = (_layout.to_bhsd(L, tuple(t.shape)) for t in (q, k, v))
    check_shapes(qd, kd, vd)
    p = flashattn.plan(batch=qd[0], heads=qd[1], seq_q=qd[2], head_dim=qd[3], seq_k=kd[2], head_dim_v=vd[3],
                       kv_heads=kd[1], dtype=DTYPES[q.dtype], scale=float_or_none("scale", scale),
                       softcap=float_or_zero("softcap", softcap), mask=from_block_mask(block_mask),
                       backend="cuda" if q.device.type == "cuda" else "cpu", threads=threads_arg(threads))
    return {"forward": dict(p.forward), "backward": dict(p.backward)}


# the SDPA drop-in and the inference shapes (packed batches, kv-cache decoding)
from ._torch_sdpa import scaled_dot_product_attention  # noqa: E402,F401
from ._torch_decode import kvcache_attention, quantize_cache  # noqa: E402,F401
from ._torch_inference import varlen_attention  # noqa: E402,F401
from ._torch_merge import merge_states  # noqa: E402,F401
