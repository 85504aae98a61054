"""Splash attention's masks (jax.experimental.pallas.ops.tpu.splash_attention) as flashattn
masks, and splash_cost_estimate: the cost of the splash kernel itself (docs/python_masks.md,
"Splash attention's masks").

Analytic masks map to the library's constructors (CausalMask(offset) -> causal at diag
offset `offset`, LocalMask(window_size=(l, r), offset) -> window, ChunkedCausalMask ->
chunked, FullMask -> an unbounded window), NumpyMask to a dense array, & and | to the
library's AND and OR, MultiHeadMask to one mask per head (equal heads shared). Splash masks
align top-left (query i at key position i + offset), whatever the call's alignment.
"""

from __future__ import annotations

import weakref

import numpy as np

from .. import masks

# splash masks converted, by identity (a NumpyMask's hash reads its whole array): id -> (weak
# reference, flashattn mask), so a mask passed again is not converted (and built) again
_CONVERTED = {}

NUM_LANES = 128  # the TPU vector width splash's kernel keeps its row statistics in


def _splash_module():
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as m
    return m


def is_splash_mask(x) -> bool:
    try:
        return isinstance(x, _splash_module().Mask)
    except ImportError:  # a jax without Pallas' TPU ops has no splash masks to pass
        return False


def _plain_q_sequence(m):
    q = getattr(m, "q_sequence", None)
    if q is not None and not np.array_equal(q, np.arange(m.shape[0])):
        raise NotImplementedError(f"{type(m).__name__} with a sharded q_sequence (shard_count > 1) is not supported: "
                                  "pass the unsharded mask")


def _local(window_size, offset, m):
    """LocalMask: keys i + offset - left <= j <= i + offset + right (None: unbounded), a side
    of any sign. flashattn's window reads -1 as unbounded, so a window with a negative side
    (its keys all on one side of the diagonal) is anchored at its other bound instead."""
    left, right = window_size
    if (left is None or left >= 0) and (right is None or right >= 0):
        return masks.window(left, right, diag_offset=offset)
    if left is not None and right is not None:
        if left + right < 0:  # no key at all: the mask's own (all-false) array
            return masks.from_array(np.asarray(m[:, :], np.bool_))
        return masks.window(left + right, 0, diag_offset=offset + right)
    if left is None:  # right < 0: keys up to i + offset + right
        return masks.window(None, 0, diag_offset=offset + right)
    return masks.window(0, None, diag_offset=offset - left)  # left < 0: keys from i + offset - left


def _convert_2d(m, sm):
    """One [Sq, Sk] splash mask as a flashattn mask (its own alignment: top-left + offset)."""
    if isinstance(m, sm.CausalMask):
        _plain_q_sequence(m)
        return masks.causal(diag_offset=int(m.offset))
    if isinstance(m, sm.LocalMask):
        _plain_q_sequence(m)
        return _local(m.window_size, int(m.offset), m)
    chunked = getattr(sm, "ChunkedCausalMask", None)
    if chunked is not None and isinstance(m, chunked):
        _plain_q_sequence(m)
        return masks.chunked(int(m.chunk_size), diag_offset=0)
    if isinstance(m, sm.FullMask):
        return masks.window(None, None, diag_offset=0)
    if isinstance(m, sm.NumpyMask):
        return masks.from_array(np.asarray(m.array, np.bool_))
    if isinstance(m, sm.LogicalAnd):
        return _convert_2d(m.left, sm) & _convert_2d(m.right, sm)
    if isinstance(m, sm.LogicalOr):
        return _convert_2d(m.left, sm) | _convert_2d(m.right, sm)
    # any other splash mask (a user's _ComputableMask): its own dense array, read once
    return masks.from_array(np.asarray(m[:, :], np.bool_))


def from_splash(m):
    """(flashattn mask, (heads or None, seq_q, seq_k)) for a splash mask (cached per object)."""
    hit = _CONVERTED.get(id(m))
    if hit is not None and hit[0]() is m:
        return hit[1]
    out = _from_splash(m)
    try:
        ref = weakref.ref(m, lambda _, key=id(m): _CONVERTED.pop(key, None))
    except TypeError:  # not weakly referenceable: not cached
        return out
    _CONVERTED[id(m)] = (ref, out)
    return out


def _from_splash(m):
    sm = _splash_module()
    if isinstance(m, sm.MultiHeadMask):
        seen = {}
        out = []
        for head in m.masks:
            try:
                key = head
                hash(key)
            except (TypeError, NotImplementedError):
                key = id(head)
            if key not in seen:
                seen[key] = _convert_2d(head, sm)
            out.append(seen[key])
        return masks.per_head(out), tuple(m.shape)
    if len(m.shape) == 3:  # & or | of MultiHeadMasks (splash refuses them too)
        raise ValueError(f"a splash mask of shape {m.shape} that is not a MultiHeadMask ({type(m).__name__}: & or | "
                         "of MultiHeadMasks) is not taken: combine per head, MultiHeadMask([a & b for a, b in "
                         "zip(x.masks, y.masks)])")
    if len(m.shape) != 2:
        raise ValueError(f"a splash mask must be [Sq, Sk] or a MultiHeadMask [H, Sq, Sk], got shape {m.shape}")
    return _convert_2d(m, sm), (None,) + tuple(m.shape)


def check_splash_shape(shape, hq, sq, sk):
    heads, msq, msk = shape
    if (msq, msk) != (sq, sk):
        raise ValueError(f"the splash mask is [Sq, Sk] = [{msq}, {msk}] but the call has Sq = {sq}, Sk = {sk}")
    if heads is not None and heads != hq:
        raise ValueError(f"the MultiHeadMask has {heads} heads but the call has {hq} query heads")


def as_mask(mask, hq, sq, sk):
    """A flashattn mask for mask= (a flashattn mask or a splash mask); None for other values."""
    if isinstance(mask, masks.Mask):
        return mask
    if is_splash_mask(mask):
        m, shape = from_splash(mask)
        check_splash_shape(shape, hq, sq, sk)
        return m
    return None


def _dims(q, k, v):
    """Splash's own shapes: q [..., Hq, Sq, D], k and v [..., Hk, Sk, D] (multi-head) or
    [..., Sk, D] (MQA); leading dims (a vmapped batch) multiply."""
    qs, ks, vs = (tuple(x.shape) for x in (q, k, v))
    if len(qs) < 3:
        raise ValueError(f"q must be [..., heads, seq_q, head_dim] (splash's layout), got shape {qs}")
    lead = qs[:-3]
    hq, sq, d = qs[-3:]
    if len(ks) == len(qs) - 1:  # MQA: one k and v for every query head
        hk, sk, dk = 1, ks[-2], ks[-1]
    elif len(ks) == len(qs):
        hk, sk, dk = ks[-3:]
    else:
        raise ValueError(f"k must be [..., heads, seq_k, head_dim] or [..., seq_k, head_dim] (MQA), got shape {ks}")
    if dk != d:
        raise ValueError(f"k has head_dim {dk} but q has {d}")
    if vs[:-1] != ks[:-1]:
        raise ValueError(f"v's leading dims {vs[:-1]} must be k's {ks[:-1]}")
    if hq % hk:
        raise ValueError(f"q's heads ({hq}) must be a multiple of k's ({hk})")
    return int(np.prod(lead, dtype=np.int64)), hq, sq, sk, d, vs[-1]


def _computable(m, sm):
    """Whether splash computes the mask in the kernel (one analytic mask for every head:
    no partial-block bitmaps are read, only the q positions)."""
    if isinstance(m, sm.MultiHeadMask):
        return all(h == m.masks[0] for h in m.masks) and _computable(m.masks[0], sm)
    return isinstance(m, sm._ComputableMask)


def splash_cost_estimate(mask, q, k, v, *, block_sizes=None, attn_logits_soft_cap=None):
    """A pl.CostEstimate of splash attention's forward kernel for this mask, as it runs with
    block_sizes (a splash BlockSizes; None: BlockSizes.get_default()): the grid visits the
    (block_q x block_kv) blocks with any visible pair, and those only.

    mask: a splash mask ([Sq, Sk], or a MultiHeadMask [Hq, Sq, Sk]) or a flashattn mask
    (aligned top-left). q [..., Hq, Sq, D], k and v [..., Hk, Sk, D] or [..., Sk, D] (MQA),
    arrays or ShapeDtypeStructs; leading dims (a batch under vmap) multiply.

    Per visited block, exact from the library's block structure at splash's block sizes:
    flops 2 * block_q * block_kv * (D + Dv) (its two matmuls); transcendentals
    block_q * block_kv (exp of the scores, plus as many tanh with a soft cap) and
    block_q * 128 per block_kv_compute step (the rescale exp, kept lane-wide). Bytes are a
    model of its block reads (docs/python_masks.md, "Splash attention's masks"): q read and o
    written once per query block, k and v once per visited block, a partial block's bitmap
    (block_q * block_kv bytes) for masks splash does not compute in the kernel;
    scalar-prefetched block tables ignored."""
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk_

    bs = sk_.BlockSizes.get_default() if block_sizes is None else block_sizes
    bq, bkv = int(bs.block_q), int(bs.block_kv)
    bkv_c = int(bs.block_kv_compute or bkv)
    batch, hq, sq, skv, d, dv = _dims(q, k, v)
    if sq % bq or skv % bkv:
        raise ValueError(f"splash needs block_q ({bq}) to divide seq_q ({sq}) and block_kv ({bkv}) to divide "
                         f"seq_k ({skv})")
    if bkv % bkv_c:
        raise ValueError(f"block_kv ({bkv}) must be a multiple of block_kv_compute ({bkv_c})")
    fm = as_mask(mask, hq, sq, skv)
    if fm is None:
        raise TypeError(f"mask must be a splash attention mask or a flashattn mask, got {type(mask).__name__}")
    built = fm.build(1, hq, sq, skv, diag_offset=0, block=(bq, bkv))
    _, full, partial = built.stats()
    per_head = hq // built.dims()[1]  # a mask shared by every head counts once per head
    visited, partial = batch * per_head * (full + partial), batch * per_head * partial
    es = jnp.dtype(q.dtype).itemsize
    flops = visited * 2 * bq * bkv * (d + dv)
    trans = visited * (bq * bkv * (2 if attn_logits_soft_cap else 1) + (bkv // bkv_c) * bq * NUM_LANES)
    rows = batch * hq * (sq // bq)
    nbytes = rows * bq * (d + dv) * es + visited * bkv * (d + dv) * es
    sm = _splash_module() if is_splash_mask(mask) else None
    if sm is not None and _computable(mask, sm):
        nbytes += rows * bq * NUM_LANES * 4  # the q positions the kernel computes the mask from
    else:
        nbytes += partial * bq * bkv
    return pl.CostEstimate(flops=int(flops), transcendentals=int(trans), bytes_accessed=int(nbytes))
