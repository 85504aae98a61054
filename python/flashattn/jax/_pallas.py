"""A drop-in for jax.experimental.pallas.ops.tpu.flash_attention.flash_attention.

Same signature and semantics ([B, H, S, D]; ab added to q.k before scaling; causal aligned
top-left; SegmentIds(q, kv)), computed by the flashattn library on the CPU or, where built,
CUDA: a script written for that kernel runs elsewhere with one import changed. The math is
the library's (bias_scale = sm_scale, diag_offset 0); nothing is reimplemented here.

One difference: a query row with no visible key (every key masked by segment ids, or a
causal row of a block that sees none) gives o = 0 here, where the Pallas kernel and its
mha_reference, masking with a finite value, return the plain average of v over all keys.
"""

from __future__ import annotations

from typing import NamedTuple

import jax

from . import _attention


class SegmentIds(NamedTuple):
    """Segment ids of queries [B, Sq] and keys [B, Sk]: a query sees keys of its segment
    (the Pallas module's SegmentIds; either class is accepted)."""

    q: jax.Array
    kv: jax.Array


def flash_attention(q, k, v, ab=None, segment_ids=None, *, causal=False, sm_scale=1.0, block_sizes=None,
                    debug=False):
    """o = softmax(((q k^T) + ab) * sm_scale, masked) v for q, k, v [B, H, S, D].

    As the Pallas TPU kernel: ab [B, H, Sq, Sk] (optional) is added before scaling; causal
    shows key j to query i when j <= i (top-left, whatever Sq and Sk); segment_ids is a
    SegmentIds(q=[B, Sq], kv=[B, Sk]) of either module. Gradients for q, k, v and ab.
    block_sizes and debug are accepted and ignored: the library chooses its own tiles.
    """
    del block_sizes, debug
    for name, x in (("q", q), ("k", k), ("v", v)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(f"{name} must be [batch_size, num_heads, seq_len, d_model], got shape "
                             f"{getattr(x, 'shape', None)}")
    if not (q.shape[1] == k.shape[1] == v.shape[1]):
        raise ValueError(f"Head count mismatch: got {q.shape[1]}, {k.shape[1]}, {v.shape[1]} (for q, k, v "
                         "respectively); the Pallas kernel has no GQA (flashattn.jax.attention has)")
    if v.shape[3] != q.shape[3]:
        raise NotImplementedError("V model dimension unequal to KV model dimension unsupported (as in the "
                                  "Pallas kernel; flashattn.jax.attention supports it)")
    if ab is not None and tuple(ab.shape) != (q.shape[0], q.shape[1], q.shape[2], k.shape[2]):
        raise ValueError(f"Attention bias shape mismatch: expected {(q.shape[0], q.shape[1], q.shape[2], k.shape[2])}, "
                         f"got {tuple(ab.shape)}")
    causal = _attention.truth("causal", causal)  # as the Pallas kernel takes it
    sm_scale = _attention._finite("sm_scale", sm_scale)  # a traced one is refused naming sm_scale, not "scale"
    q_seg = kv_seg = None
    if segment_ids is not None:
        q_seg, kv_seg = segment_ids.q, segment_ids.kv
    o = _attention.call(q, k, v, causal=causal, scale=sm_scale, bias=ab, q_segment_ids=q_seg,
                        kv_segment_ids=kv_seg, layout="bhsd", diag_offset=0 if causal else None,
                        bias_scale=sm_scale if ab is not None else None)
    return o
