"""FlexAttention's BlockMask as a flashattn mask (flashattn.torch.attention(block_mask=),
flashattn.torch.flex_cost): its blocks as they are, at its own block size (docs/python_masks.md,
"FlexAttention's BlockMask").

A BlockMask (torch.nn.attention.flex_attention.create_block_mask) lists, per (batch, head,
query block), the key blocks that need mask_mod (kv_indices, kv_num_blocks) and, kept apart,
the full ones (full_kv_indices, full_kv_num_blocks; absent when it was made with
separate_full_blocks=False: then every listed block is partial). Full blocks run without
masking; a partial block's bitmap is mask_mod evaluated on that block only (one vmapped call
over all partial blocks); unlisted blocks are never visited. A BlockMask made with B=None
or H=None shares its block lists over batch items or heads, but flex_attention calls
mask_mod with the real b and h: a call with more batch items or heads evaluates the
partial blocks' bitmaps at every b and h of the call (the block lists stay shared; a dim
the bitmaps turn out not to depend on stays 1). The library builds the mask from those
block kinds and bitmaps (fa_mask_from_blocks)."""
import weakref

import numpy as np
import torch

from . import _mask_native as native
from .masks import Mask, host_values

_CONVERTED = weakref.WeakKeyDictionary()


def _block_kinds(bm):
    """[B', H', nq, nk] int8 fa_block_kind from the BlockMask's index lists: the rows of
    ceil(Q_LEN / BLOCK_SIZE[0]) query blocks, as flex_attention reads them (a BlockMask may
    list more, e.g. after _adjust to a shorter Q_LEN; one that lists fewer is refused: the
    library would read past its rows)."""
    nq = -(-bm.seq_lengths[0] // bm.BLOCK_SIZE[0])
    listed = bm.kv_num_blocks.shape[-1]
    if listed < nq:
        raise ValueError(f"block_mask lists {listed} query blocks of {bm.BLOCK_SIZE[0]} rows, but its Q_LEN "
                         f"{bm.seq_lengths[0]} needs {nq}: its block lists do not cover its seq_lengths")
    nk = -(-bm.seq_lengths[1] // bm.BLOCK_SIZE[1])
    Bm, Hm = bm.kv_num_blocks.shape[:2]
    kinds = np.zeros((Bm, Hm, nq, nk), np.int8)

    def mark(num, idx, kind):
        num = host_values(num).astype(np.int64)  # inside torch.func.grad too (host_values)
        idx = host_values(idx).astype(np.int64)
        slot = np.arange(idx.shape[-1])
        listed = slot[None, None, None, :] < num[..., None]  # the first num entries of each row count
        listed[:, :, nq:] = False  # rows past Q_LEN's blocks: flex_attention never reads them
        b, h, q, s = np.nonzero(listed)
        kv = idx[b, h, q, s]
        keep = kv < nk  # padded lists may hold indices past the sequence
        kinds[b[keep], h[keep], q[keep], kv[keep]] = kind

    mark(bm.kv_num_blocks, bm.kv_indices, native.BLOCK_PARTIAL)
    if bm.full_kv_num_blocks is not None:
        mark(bm.full_kv_num_blocks, bm.full_kv_indices, native.BLOCK_FULL)
    return kinds


def _bitmaps(src, kinds, B, H):
    """mask_mod on each partial block of kinds [Bm, Hm, nq, nk], for a call of B batch items
    and H heads: (bitmaps [n, bq, bk] bool, one per PARTIAL block in row-major order of the
    kinds broadcast to [B', H', nq, nk], (B', H')). A dim the BlockMask shares (1) but the
    call has more of is evaluated at every b < B (h < H), as flex_attention evaluates mask_mod
    with the real b and h; B' = B (H' = H) unless the bitmaps came out the same for every b
    (h), then B' = 1 (H' = 1). The block lists stay the BlockMask's. One vmapped call; indices
    past the sequence are clamped (the library ignores those bits). src: the BlockMask's
    mask_mod, (Q_LEN, KV_LEN), BLOCK_SIZE and device."""
    mask_mod, (Qlen, Klen), (bq, bk), dev = src
    Bm, Hm = kinds.shape[:2]
    nz = np.nonzero(kinds == native.BLOCK_PARTIAL)
    b, h, qb, kb = (torch.from_numpy(x) for x in nz)
    if b.numel() == 0:
        return np.zeros((0, bq, bk), np.bool_), (Bm, Hm)
    eb, eh = Bm == 1 and B > 1, Hm == 1 and H > 1  # shared dims the call has more of
    qi = (qb[:, None] * bq + torch.arange(bq)).clamp(max=Qlen - 1).to(dev)
    ki = (kb[:, None] * bk + torch.arange(bk)).clamp(max=Klen - 1).to(dev)
    fn = torch.vmap(mask_mod, in_dims=(None, None, None, 0))
    fn = torch.vmap(fn, in_dims=(None, None, 0, None))
    fn = torch.vmap(fn, in_dims=(None if eb else 0, None if eh else 0, 0, 0))  # the partial blocks
    if eh:
        fn = torch.vmap(fn, in_dims=(None, 0, None, None))
    if eb:
        fn = torch.vmap(fn, in_dims=(0, None, None, None))
    bs = torch.arange(B) if eb else b
    hs = torch.arange(H) if eh else h
    with torch.no_grad():
        out = fn(bs.to(dev), hs.to(dev), qi, ki)
    out = host_values(out.to(torch.bool))  # read on the host inside torch.func.grad too (host_values)
    if not eb:
        out = out[None]
    if not eh:
        out = out[:, None]
    # out: [B or 1, H or 1, n, bq, bk]; a dim mask_mod ignores comes back with stride 0

    def same(axis):
        return out.strides[axis] == 0 or bool((out == out.take([0], axis)).all())

    if eb and same(0):
        eb, out = False, out[:1]
    if eh and same(1):
        eh, out = False, out[:, :1]
    n = b.numel()
    bitmaps = out.reshape(-1, bq, bk)
    if (eb and Hm > 1) or (eh and Bm > 1):  # interleave: row-major over (b, h, qb, kb)
        shape = out.shape[:3]
        bb = np.broadcast_to((np.arange(B)[:, None, None] if eb else nz[0][None, None, :]), shape)
        hh = np.broadcast_to((np.arange(H)[None, :, None] if eh else nz[1][None, None, :]), shape)
        jj = np.broadcast_to(np.arange(n)[None, None, :], shape)
        bitmaps = bitmaps[np.lexsort((jj.ravel(), hh.ravel(), bb.ravel()))]
    return bitmaps, (B if eb else Bm, H if eh else Hm)


class _BlockMask(Mask):
    """A FlexAttention BlockMask, bound to its own sequence lengths and block size."""

    def __init__(self, bm):
        super().__init__()
        self.seq = tuple(int(n) for n in bm.seq_lengths)
        self.block = tuple(int(n) for n in bm.BLOCK_SIZE)
        self.kinds = _block_kinds(bm)
        self.fixed_block = self.block
        # what _bitmaps needs (not bm itself: _CONVERTED holds this object weakly keyed by bm)
        self._src = (bm.mask_mod, self.seq, self.block, bm.kv_indices.device)
        self.bitmaps, _ = _bitmaps(self._src, self.kinds, *self.kinds.shape[:2])

    def _build(self, dims, diag, block):
        B, H, Sq, Sk = dims
        # a zero batch or heads computes nothing: the mask is built for one (the library's
        # masks have at least one of each) and broadcasts over none
        B, H = max(B, 1), max(H, 1)
        if (Sq, Sk) != self.seq:
            raise ValueError(f"the BlockMask is for (Q_LEN, KV_LEN) = {self.seq} but the call has Sq = {Sq}, Sk = {Sk}")
        Bm, Hm = self.kinds.shape[:2]
        if 1 < Bm < B or 1 < Hm < H:
            raise ValueError(f"the BlockMask has B = {Bm}, H = {Hm}; the call has B = {B}, H = {H} (each 1, equal "
                             "or larger: flex_attention reads its first B and H)")
        kinds, bitmaps = self.kinds, self.bitmaps
        if Bm > B or Hm > H:  # flex_attention reads the first B batch items and H heads of a larger one
            kinds = np.ascontiguousarray(kinds[:B if Bm > B else Bm, :H if Hm > H else Hm])
            Bm, Hm = kinds.shape[:2]
            bitmaps = None
        if (Bm, Hm) != (B, H) or bitmaps is None:  # shared over batch or heads: mask_mod at the call's every b and h
            bitmaps, (Bm, Hm) = _bitmaps(self._src, kinds, B, H)
            kinds = np.broadcast_to(kinds, (Bm, Hm) + kinds.shape[2:])
        s = native.shape(Bm, Hm, Sq, Sk, *self.block)
        return native.from_blocks(s, kinds, bitmaps, "block_mask")

    def __repr__(self):
        return f"<flashattn mask of a BlockMask {self.kinds.shape}, blocks {self.block}>"


def _parts(bm):
    """What a conversion depends on: the objects (mask_mod and the block lists, compared by
    identity: a user may assign any of them on the BlockMask, as torch's messages suggest for
    mask_mod) and values (the lists' version counters, for edits in place: flex_attention
    reads them at every call; the lengths and block size). State that mask_mod reads is not
    tracked (make a new BlockMask)."""
    objects = (bm.mask_mod, bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices)
    return objects, (tuple(_version(x) for x in objects), tuple(bm.seq_lengths), tuple(bm.BLOCK_SIZE))


def _version(x):
    """A tensor's version counter; None for what has none (mask_mod, None, and inference
    tensors, which track none: a BlockMask made under torch.inference_mode)."""
    try:
        return getattr(x, "_version", None)
    except RuntimeError:
        return None


def from_block_mask(bm, device=None):
    """The flashattn mask of a BlockMask (converted once per BlockMask object and contents).
    device: the call's (q's); the BlockMask must be on it, as flex_attention requires."""
    if not all(hasattr(bm, a) for a in ("kv_num_blocks", "kv_indices", "mask_mod", "BLOCK_SIZE", "seq_lengths")):
        raise TypeError(f"block_mask must be a torch.nn.attention.flex_attention.BlockMask, got {type(bm).__name__}")
    dev = bm.kv_num_blocks.device
    if device is not None and dev != device:
        raise ValueError(f"block_mask is on {dev} but q is on {device} (flex_attention wants them on one device)")
    if dev.type == "meta":
        raise ValueError("block_mask is on the meta device: it holds no blocks to read")
    objects, values = _parts(bm)
    try:
        seen = _CONVERTED.get(bm)
    except TypeError:  # not weakly referenceable: convert every time
        return _BlockMask(bm)
    if seen is None or seen[1] != values or any(a is not b for a, b in zip(seen[0], objects)):
        seen = (objects, values, _BlockMask(bm))
        _CONVERTED[bm] = seen
    return seen[2]
