"""The C library's block-sparse masks through ctypes (include/flashattn.h, "masks as data";
docs/masks.md): the fa_mask_shape mirror, the constructors' signatures, and NativeMask, the
owner of one fa_mask* (destroyed with the object; a plan that uses it holds its own
reference, so a plan never outlives its mask). Nothing here evaluates a mask: the library
builds every one and answers every query."""
import ctypes

import numpy as np

from . import _native

c_int64 = ctypes.c_int64
P = ctypes.POINTER

# fa_block_kind
BLOCK_EMPTY, BLOCK_PARTIAL, BLOCK_FULL = 0, 1, 2


class MaskShape(ctypes.Structure):
    _fields_ = [("batch", c_int64), ("heads", c_int64), ("seq_q", c_int64), ("seq_k", c_int64),
                ("block_q", c_int64), ("block_k", c_int64)]


_SIG = {
    "fa_mask_causal": [P(MaskShape), c_int64, P(ctypes.c_void_p)],
    "fa_mask_window": [P(MaskShape), c_int64, c_int64, c_int64, P(ctypes.c_void_p)],
    "fa_mask_chunked": [P(MaskShape), c_int64, c_int64, P(ctypes.c_void_p)],
    "fa_mask_prefix_lm": [P(MaskShape), c_int64, P(c_int64), P(ctypes.c_void_p)],
    "fa_mask_documents": [P(MaskShape), P(c_int64), P(c_int64), P(ctypes.c_void_p)],
    "fa_mask_from_dense": [P(MaskShape), ctypes.c_void_p, P(ctypes.c_void_p)],
    "fa_mask_from_blocks": [P(MaskShape), ctypes.c_void_p, ctypes.c_void_p, P(ctypes.c_void_p)],
    "fa_mask_and": [ctypes.c_void_p, ctypes.c_void_p, P(ctypes.c_void_p)],
    "fa_mask_or": [ctypes.c_void_p, ctypes.c_void_p, P(ctypes.c_void_p)],
    "fa_mask_stack_heads": [P(ctypes.c_void_p), c_int64, P(ctypes.c_void_p)],
    "fa_mask_get_shape": [ctypes.c_void_p, P(MaskShape)],
    "fa_mask_to_dense": [ctypes.c_void_p, ctypes.c_void_p],
    "fa_mask_stats": [ctypes.c_void_p, P(c_int64), P(c_int64), P(c_int64)],
}
lib = _native.lib
for _name, _args in _SIG.items():
    _fn = getattr(lib, _name)
    _fn.restype, _fn.argtypes = ctypes.c_int, _args
lib.fa_mask_destroy.restype = None
lib.fa_mask_destroy.argtypes = [ctypes.c_void_p]


def shape(batch, heads, seq_q, seq_k, block_q=0, block_k=0):
    return MaskShape(batch, heads, seq_q, seq_k, block_q, block_k)


def _i64(values):
    """An int64 array's pointer (which keeps the array alive)."""
    return np.ascontiguousarray(values, dtype=np.int64).ctypes.data_as(P(c_int64))


# whether the live mask at an address was built from a description that read the call's
# diag_offset (masks.build_for_call records it, masks.took_call_offset reads it); an entry
# goes with its mask
TAKES_OFFSET = {}


class NativeMask:
    """One fa_mask*, owned: built by one of the constructors below, destroyed with the object."""

    __slots__ = ("ptr", "pinned", "__weakref__")

    def __init__(self, build, what):
        out = ctypes.c_void_p()
        _native.check(build(ctypes.byref(out)), what)
        self.ptr = out.value
        self.pinned = False  # True: held for the process (a compiled JAX call has its address)

    def __reduce__(self):
        raise TypeError("a built mask (the library's object) cannot be copied or pickled; copy or pickle the "
                        "flashattn.masks mask it was built from")

    def __del__(self, _destroy=lib.fa_mask_destroy, _takes=TAKES_OFFSET, _forget=_native.forget_mask):
        ptr = getattr(self, "ptr", None)
        if ptr:
            _takes.pop(ptr, None)
            _forget(ptr)  # the cached plans that hold it go too (each plan holds the mask)
            _destroy(ptr)
            self.ptr = None

    @property
    def shape(self):
        s = MaskShape()
        _native.check(lib.fa_mask_get_shape(self.ptr, ctypes.byref(s)), "mask")
        return s

    def dims(self):
        s = self.shape
        return (s.batch, s.heads, s.seq_q, s.seq_k)

    def to_dense(self):
        """[batch, heads, seq_q, seq_k] bool, the mask's own batch and heads (1 or full)."""
        out = np.empty(self.dims(), np.uint8)
        _native.check(lib.fa_mask_to_dense(self.ptr, out.ctypes.data), "mask")
        return out.view(np.bool_)

    def stats(self):
        """(visible pairs, full blocks, partial blocks), summed over the mask's batch and heads."""
        n, full, part = c_int64(), c_int64(), c_int64()
        _native.check(lib.fa_mask_stats(self.ptr, ctypes.byref(n), ctypes.byref(full), ctypes.byref(part)), "mask")
        return n.value, full.value, part.value


def causal(s, diag_offset):
    return NativeMask(lambda out: lib.fa_mask_causal(ctypes.byref(s), diag_offset, out), "masks.causal")


def window(s, diag_offset, left, right):
    return NativeMask(lambda out: lib.fa_mask_window(ctypes.byref(s), diag_offset, left, right, out),
                      "masks.window")


def chunked(s, diag_offset, chunk):
    return NativeMask(lambda out: lib.fa_mask_chunked(ctypes.byref(s), diag_offset, chunk, out), "masks.chunked")


def prefix_lm(s, diag_offset, prefix_lengths):
    p = _i64(prefix_lengths)
    return NativeMask(lambda out: lib.fa_mask_prefix_lm(ctypes.byref(s), diag_offset, p, out), "masks.prefix_lm")


def documents(s, counts, lengths):
    c, n = _i64(counts), _i64(lengths)
    return NativeMask(lambda out: lib.fa_mask_documents(ctypes.byref(s), c, n, out), "masks.documents")


def from_dense(s, attend, label="masks.from_array"):
    """attend: [batch, heads, seq_q, seq_k] bool or uint8 (nonzero: attend); label names the
    constructor in errors."""
    a = np.ascontiguousarray(attend).view(np.uint8) if attend.dtype == np.bool_ else \
        np.ascontiguousarray(attend != 0).view(np.uint8)
    return NativeMask(lambda out: lib.fa_mask_from_dense(ctypes.byref(s), a.ctypes.data, out), label)


def from_blocks(s, kinds, bitmaps, what="mask from blocks"):
    """kinds [batch, heads, nqb, nkb] int8 (fa_block_kind); bitmaps [n_partial, block_q,
    block_k] (nonzero: attend), one per PARTIAL block in row-major order of kinds."""
    k = np.ascontiguousarray(kinds, dtype=np.int8)
    bm = np.ascontiguousarray(bitmaps).view(np.uint8) if bitmaps is not None and bitmaps.size else None
    return NativeMask(lambda out: lib.fa_mask_from_blocks(
        ctypes.byref(s), k.ctypes.data, None if bm is None else bm.ctypes.data, out), what)


def combine(op, a, b):
    fn = lib.fa_mask_and if op == "&" else lib.fa_mask_or
    return NativeMask(lambda out: fn(a.ptr, b.ptr, out), f"mask {op} mask")


def stack_heads(masks):
    """A mask per query head (NativeMasks of 1 head each) as one [batch, len(masks)] mask."""
    ptrs = (ctypes.c_void_p * len(masks))(*(m.ptr for m in masks))
    return NativeMask(lambda out: lib.fa_mask_stack_heads(ptrs, len(masks), out), "masks.per_head")
