"""FlexAttention's BlockMask as a flashattn mask (flashattn.torch.attention(block_mask=),
flashattn.torch.flex_cost): its blocks as they are, at its own block size (docs/python.md,
"FlexAttention's BlockMask").

A BlockMask (torch.nn.attention.flex_attention.create_block_mask) lists, per (batch, head,
query block), the key blocks that need mask_mod (kv_indices, kv_num_blocks) and, kept apart,
the full ones (full_kv_indices, full_kv_num_blocks; absent when it was made with
separate_full_blocks=False: then every listed block is partial). Full blocks run without
masking; a partial block's bitmap is mask_mod evaluated on that block only (one vmapped call
over all partial blocks); unlisted blocks are never visited. The library builds the mask
from those block kinds and bitmaps (fa_mask_from_blocks)."""
import weakref

import numpy as np
import torch

from . import _mask_native as native
from .masks import Mask

_CONVERTED = weakref.WeakKeyDictionary()


def _block_kinds(bm):
    """[B', H', nq, nk] int8 fa_block_kind from the BlockMask's index lists."""
    nq = bm.kv_num_blocks.shape[-1]
    nk = -(-bm.seq_lengths[1] // bm.BLOCK_SIZE[1])
    Bm, Hm = bm.kv_num_blocks.shape[:2]
    kinds = np.zeros((Bm, Hm, nq, nk), np.int8)

    def mark(num, idx, kind):
        num = num.detach().cpu().numpy().astype(np.int64)
        idx = idx.detach().cpu().numpy().astype(np.int64)
        slot = np.arange(idx.shape[-1])
        listed = slot[None, None, None, :] < num[..., None]  # the first num entries of each row count
        b, h, q, s = np.nonzero(listed)
        kv = idx[b, h, q, s]
        keep = kv < nk  # padded lists may hold indices past the sequence
        kinds[b[keep], h[keep], q[keep], kv[keep]] = kind

    mark(bm.kv_num_blocks, bm.kv_indices, native.BLOCK_PARTIAL)
    if bm.full_kv_num_blocks is not None:
        mark(bm.full_kv_num_blocks, bm.full_kv_indices, native.BLOCK_FULL)
    return kinds


def _bitmaps(bm, kinds):
    """mask_mod on each partial block, in row-major order of kinds: [n, bq, bk] bool.
    Indices past the sequence are clamped (the library ignores those bits)."""
    bq, bk = bm.BLOCK_SIZE
    Qlen, Klen = bm.seq_lengths
    b, h, qb, kb = (torch.from_numpy(x) for x in np.nonzero(kinds == native.BLOCK_PARTIAL))
    if b.numel() == 0:
        return np.zeros((0, bq, bk), np.bool_)
    dev = bm.kv_indices.device
    qi = (qb[:, None] * bq + torch.arange(bq)).clamp(max=Qlen - 1).to(dev)
    ki = (kb[:, None] * bk + torch.arange(bk)).clamp(max=Klen - 1).to(dev)
    fn = bm.mask_mod
    fn = torch.vmap(fn, in_dims=(None, None, None, 0))
    fn = torch.vmap(fn, in_dims=(None, None, 0, None))
    fn = torch.vmap(fn, in_dims=(0, 0, 0, 0))
    with torch.no_grad():
        out = fn(b.to(dev), h.to(dev), qi, ki)
    return out.to(torch.bool).cpu().numpy()


class _BlockMask(Mask):
    """A FlexAttention BlockMask, bound to its own sequence lengths and block size."""

    def __init__(self, bm):
        super().__init__()
        self.seq = tuple(int(n) for n in bm.seq_lengths)
        self.block = tuple(int(n) for n in bm.BLOCK_SIZE)
        self.kinds = _block_kinds(bm)
        self.bitmaps = _bitmaps(bm, self.kinds)
        self.fixed_block = self.block

    def _build(self, dims, diag, block):
        B, H, Sq, Sk = dims
        if (Sq, Sk) != self.seq:
            raise ValueError(f"the BlockMask is for (Q_LEN, KV_LEN) = {self.seq} but the call has Sq = {Sq}, Sk = {Sk}")
        Bm, Hm = self.kinds.shape[:2]
        if Bm not in (1, B) or Hm not in (1, H):
            raise ValueError(f"the BlockMask has B = {Bm}, H = {Hm}; the call has B = {B}, H = {H} (each 1 or equal)")
        s = native.shape(Bm, Hm, Sq, Sk, *self.block)
        return native.from_blocks(s, self.kinds, self.bitmaps, "block_mask")

    def __repr__(self):
        return f"<flashattn mask of a BlockMask {self.kinds.shape}, blocks {self.block}>"


def from_block_mask(bm):
    """The flashattn mask of a BlockMask (converted once per BlockMask object)."""
    if not all(hasattr(bm, a) for a in ("kv_num_blocks", "kv_indices", "mask_mod", "BLOCK_SIZE", "seq_lengths")):
        raise TypeError(f"block_mask must be a torch.nn.attention.flex_attention.BlockMask, got {type(bm).__name__}")
    try:
        m = _CONVERTED.get(bm)
    except TypeError:  # not weakly referenceable: convert every time
        return _BlockMask(bm)
    if m is None:
        m = _BlockMask(bm)
        _CONVERTED[bm] = m
    return m
