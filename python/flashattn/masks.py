"""flashattn.masks: masks as data (docs/python_masks.md; the C type: docs/masks.md).

    causal(diag_offset=None)             key j visible to query i iff j <= d
    window(left, right, diag_offset=None)   d - left <= j <= d + right (None or -1: unbounded)
    chunked(size, diag_offset=None)      j <= d and j // size == d // size (Llama 4's attention_chunk)
    prefix_lm(prefix_lengths, diag_offset=None)   j < prefix_b or j <= d
    documents(lengths)                   same document (lengths of packed documents)
    from_array(bool_array)               True = attend, broadcastable to [B, H, Sq, Sk]
    from_fn(fn)                          fn(b, h, i, j) on numpy index arrays, evaluated once
    per_head([m0, m1, ...])              one mask per query head
    a & b, a | b                         both, either

where d = i + diag_offset is query i's key position: None aligns as the call does (its own
diag_offset=, else bottom-right: Sk - Sq, as causal=). A Mask is a description: it is bound
to the call's shapes (seq_q, seq_k, batch, heads) when a front or flashattn.plan gets it as
mask=, then built once by the C library as a block-sparse fa_mask (every front shares the
library's constructors; nothing is evaluated here but a from_fn predicate) and cached for
those shapes. The plan of a call with a Mask stays exact: flops count the blocks that run,
flops_useful the visible pairs.
"""
import os
import sys
import threading

import numpy as np

from . import _mask_native as native
from ._problem import _int, is_tracer

_CACHE_SIZE = 8
# guards every mask's cache of built masks; one for the module, so that making a mask takes
# no lock (torch.compile traces a mask made inside a compiled function)
_BUILT_LOCK = threading.Lock()


def _new_built_lock_in_child():
    """As _native's plan cache lock: a fork while another thread held it left it held in the
    child for good."""
    global _BUILT_LOCK
    _BUILT_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_new_built_lock_in_child)


class Mask:
    """A mask description; combine with & and |. Bound and built by the fronts."""

    # the block size a mask is given at (a FlexAttention BlockMask's); None: any
    fixed_block = None
    # whether building it reads the call's diag_offset (a diagonal mask given without its own)
    takes_call_offset = False

    def __init__(self):
        self._built = {}

    def __and__(self, other):
        return _Combined("&", self, _check_mask(other))

    def __or__(self, other):
        return _Combined("|", self, _check_mask(other))

    def __bool__(self):
        raise TypeError("a flashattn mask has no truth value: combine masks with & and |, not `and` / `or`")

    def __getstate__(self):
        """copy, deepcopy and pickle take the description without the library objects built
        from it (a copy builds its own; copied, the objects were freed under the original)."""
        state = self.__dict__.copy()
        state["_built"] = {}
        return state

    def build(self, batch, heads, seq_q, seq_k, *, diag_offset=None, block=(0, 0)):
        """The library's fa_mask for a call of these shapes (a NativeMask; cached).
        diag_offset: the call's own (None: bottom-right, seq_k - seq_q); block: the mask's
        (block_q, block_k), 0 for the library's default (128)."""
        dims = tuple(_int(n, v) for n, v in (("batch", batch), ("heads", heads), ("seq_q", seq_q),
                                              ("seq_k", seq_k)))
        for n, v in zip(("batch", "heads"), dims[:2]):
            if v < 0:
                raise ValueError(f"a mask's {n} must be >= 0, got {v}")
        diag = dims[3] - dims[2] if diag_offset is None else _int("diag_offset", diag_offset)
        key = (dims, diag, tuple(_int("mask block", b) for b in block))
        with _BUILT_LOCK:
            m = self._built.get(key)
        if m is None:
            m = self._build(dims, diag, key[2])
            with _BUILT_LOCK:
                if len(self._built) >= _CACHE_SIZE:  # the oldest the process does not hold (pinned)
                    old = next((k for k, b in self._built.items() if not b.pinned), None)
                    if old is not None:
                        self._built.pop(old)
                self._built[key] = m
        return m

    def to_array(self, batch, heads, seq_q, seq_k, *, diag_offset=None):
        """The mask as the library built it, [batch or 1, heads or 1, seq_q, seq_k] bool."""
        return self.build(batch, heads, seq_q, seq_k, diag_offset=diag_offset).to_dense()

    def _build(self, dims, diag, block):
        raise NotImplementedError

    def _shape(self, dims, block, batch=1, heads=1):
        return native.shape(batch, heads, dims[2], dims[3], *block)


def _check_mask(m):
    if not isinstance(m, Mask):
        raise TypeError(f"a flashattn mask combines with another flashattn mask, got {type(m).__name__}; "
                        "wrap a boolean array with flashattn.masks.from_array")
    return m


def _traced(x):
    """Whether x is, or holds, a traced JAX value (_problem.is_tracer)."""
    return is_tracer(x) or isinstance(x, (list, tuple)) and any(_traced(e) for e in x)


def _static(name, x):
    """x, unless it is or holds a traced JAX value: ValueError naming the argument (JAX's own
    TracerArrayConversionError came from inside the mask before)."""
    if _traced(x):
        raise ValueError(f"{name} must be static (concrete: known when the mask is built, a Python, numpy or "
                         f"concrete JAX value), got a traced value inside jit, vmap or grad: a mask is built "
                         f"from values when the call is traced; pass them from outside the traced function "
                         f"(or as static arguments)")
    return x


def host_values(x):
    """x's values as numpy, where x is a torch tensor (a list or tuple: its items, as a list);
    x itself otherwise. Inside a torch.func transform (grad, vjp, jacrev) reading a tensor on
    the host failed, even a plain one ("Cannot access data pointer of Tensor that doesn't
    have storage"): the transform wraps it. A mask's data are values, never differentiated,
    so functorch's wrappers are taken off and the value read with functorch's dispatch off.
    A tensor batched by torch.func.vmap is refused: a mask is built once, from one value, not
    one per mapped example; so is one under torch.compile(fullgraph=True), where the value is
    not known. torch is looked up, not imported (masks serve every front)."""
    if isinstance(x, (list, tuple)):
        return [host_values(e) for e in x]
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor):
        return x
    if torch.compiler.is_compiling():  # only fullgraph=True reaches the user: the others graph-break here
        raise ValueError("a flashattn mask made from a tensor (from_array's array, prefix_lm's or documents' "
                         "lengths) reads its values in Python, outside the graph: torch.compile(fullgraph=True) "
                         "cannot hold it (compile without fullgraph: a graph break around it), or make the mask "
                         "outside the compiled function")
    ft = torch._C._functorch
    with torch._C._DisableFuncTorch():
        while ft.is_functorch_wrapped_tensor(x) or ft.is_batchedtensor(x):
            if ft.is_batchedtensor(x):
                raise ValueError("a flashattn mask's data (an array, lengths, a BlockMask's block lists) vary over "
                                 "torch.func.vmap's mapped dim: a mask is built once from values, not per mapped "
                                 "example; make the mask outside vmap (a mask of its own per example is the "
                                 "batched call's B dim), or loop")
            x = ft.get_unwrapped(x)
        return x.detach().cpu().numpy()


def _offset(name, diag_offset):
    return None if diag_offset is None else _int(f"{name} diag_offset", diag_offset)


class _Combined(Mask):
    def __init__(self, op, a, b):
        super().__init__()
        self.op, self.a, self.b = op, a, b

    @property
    def fixed_block(self):
        return self.a.fixed_block or self.b.fixed_block

    @property
    def takes_call_offset(self):
        return self.a.takes_call_offset or self.b.takes_call_offset

    def _build(self, dims, diag, block):
        block = self.fixed_block or block  # both sides at the block size one of them is given at
        return native.combine(self.op, self.a.build(*dims, diag_offset=diag, block=block),
                              self.b.build(*dims, diag_offset=diag, block=block))

    def __repr__(self):
        return f"({self.a!r} {self.op} {self.b!r})"


class _Causal(Mask):
    def __init__(self, diag_offset):
        super().__init__()
        self.diag_offset = _offset("causal", diag_offset)

    def _build(self, dims, diag, block):
        d = diag if self.diag_offset is None else self.diag_offset
        return native.causal(self._shape(dims, block), d)

    @property
    def takes_call_offset(self):
        return self.diag_offset is None

    def __repr__(self):
        return f"causal(diag_offset={self.diag_offset})"


class _Window(Mask):
    def __init__(self, left, right, diag_offset):
        super().__init__()
        side = lambda n, v: -1 if v is None else _int(f"window {n}", v)  # noqa: E731
        self.left, self.right = side("left", left), side("right", right)
        self.diag_offset = _offset("window", diag_offset)

    def _build(self, dims, diag, block):
        d = diag if self.diag_offset is None else self.diag_offset
        return native.window(self._shape(dims, block), d, self.left, self.right)

    @property
    def takes_call_offset(self):
        return self.diag_offset is None

    def __repr__(self):
        return f"window({self.left}, {self.right}, diag_offset={self.diag_offset})"


class _Chunked(Mask):
    def __init__(self, size, diag_offset):
        super().__init__()
        self.size = _int("chunk size", size)
        self.diag_offset = _offset("chunked", diag_offset)

    def _build(self, dims, diag, block):
        d = diag if self.diag_offset is None else self.diag_offset
        return native.chunked(self._shape(dims, block), d, self.size)

    @property
    def takes_call_offset(self):
        return self.diag_offset is None

    def __repr__(self):
        return f"chunked({self.size}, diag_offset={self.diag_offset})"


def _per_batch(name, n, batch):
    """A per-batch argument's count: 1 (every batch item alike) or the call's batch."""
    if n not in (1, batch):
        raise ValueError(f"{name} gives {n} batch items but the call has batch {batch} "
                         f"({'give 1' if batch == 1 else f'give 1 or {batch}'})")


class _PrefixLM(Mask):
    def __init__(self, prefix_lengths, diag_offset):
        super().__init__()
        a = np.asarray(host_values(_static("prefix_lm's prefix_lengths", prefix_lengths)))
        if a.ndim > 1 or a.dtype.kind not in "iu" or a.size == 0:
            raise ValueError(f"prefix_lengths must be an integer or a 1-dim sequence of integers (one per "
                             f"batch item), got {prefix_lengths!r}")
        self.lengths = [_int("prefix length", x) for x in a.reshape(-1)]
        self.diag_offset = _offset("prefix_lm", diag_offset)

    def _build(self, dims, diag, block):
        _per_batch("prefix_lm's prefix_lengths", len(self.lengths), dims[0])
        d = diag if self.diag_offset is None else self.diag_offset
        return native.prefix_lm(self._shape(dims, block, batch=len(self.lengths)), d, self.lengths)

    @property
    def takes_call_offset(self):
        return self.diag_offset is None

    def __repr__(self):
        return f"prefix_lm({self.lengths}, diag_offset={self.diag_offset})"


class _Documents(Mask):
    def __init__(self, lengths):
        super().__init__()
        jax = sys.modules.get("jax")
        if jax is not None and isinstance(_static("documents' lengths", lengths), jax.Array):
            lengths = np.asarray(lengths)  # a concrete one: iterated inside jit, its items came out traced
        given, lengths = lengths, host_values(lengths)  # torch tensors (and lists of them) as numpy
        if not hasattr(lengths, "__iter__") or (isinstance(lengths, np.ndarray) and lengths.ndim == 0):
            raise TypeError(f"documents(lengths): lengths must be a list of document lengths (one document of "
                            f"{given!r} keys is [{given!r}]), or one such list per batch item, got {given!r}")
        rows = list(lengths)
        if rows and all(np.ndim(r) == 0 for r in rows):
            rows = [rows]  # one list: the same documents in every batch item
        if not rows or any(np.ndim(r) != 1 or len(r) == 0 for r in rows):
            raise ValueError("documents(lengths): lengths must be a non-empty list of document lengths, or one "
                             f"such list per batch item, got {given!r}")
        self.rows = [[_int("document length", x) for x in r] for r in rows]

    def _build(self, dims, diag, block):
        _per_batch("documents' lengths", len(self.rows), dims[0])
        counts = [len(r) for r in self.rows]
        flat = [x for r in self.rows for x in r]
        return native.documents(self._shape(dims, block, batch=len(self.rows)), counts, flat)

    def __repr__(self):
        return f"documents({self.rows})"


def _dense_dims(name, shape, dims):
    """A boolean array's 4-dim shape broadcast against [B, H, Sq, Sk]: batch and heads stay 1
    where they are 1 (the library broadcasts them); Sq and Sk are broadcast here."""
    shape = tuple(shape)
    full = dims
    if len(shape) > 4 or any(d not in (1, f) for d, f in zip((1,) * (4 - len(shape)) + shape, full)):
        raise ValueError(f"{name} has shape {shape}, which does not broadcast to [B, H, Sq, Sk] = {list(full)} "
                         "(each dim 1 or full)")
    shape = (1,) * (4 - len(shape)) + shape
    return (shape[0], shape[1], dims[2], dims[3]), shape


def _from_dense(mask, dims, block, out, a, label):
    """The library's mask of boolean array a (out: its [B or 1, H or 1, Sq, Sk] shape). A zero
    batch or heads (an empty call, which computes nothing) builds a one-item mask: the
    library's masks have at least one of each, and no row reads it."""
    if 0 in out[:2]:
        out, a = (1, 1) + tuple(out[2:]), np.ones((1, 1) + tuple(out[2:]), np.bool_)
    return native.from_dense(mask._shape(dims, block, out[0], out[1]), a, label)


class _Array(Mask):
    def __init__(self, array):
        super().__init__()
        a = np.asarray(host_values(_static("from_array's bool_array", array)))
        if a.dtype != np.bool_:
            raise TypeError(f"from_array takes a boolean array (True = attend), got dtype {a.dtype}")
        self.array = a.copy()  # immutable from here: a mask never changes under a plan
        self.array.flags.writeable = False

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.array.flags.writeable = False  # an unpickled array comes back writeable

    def _build(self, dims, diag, block):
        out, shape = _dense_dims("from_array's array", self.array.shape, dims)
        a = np.broadcast_to(self.array.reshape(shape), out)
        return _from_dense(self, dims, block, out, a, "masks.from_array")

    def __repr__(self):
        return f"from_array(<bool {self.array.shape}>)"


class _Fn(Mask):
    def __init__(self, fn):
        super().__init__()
        if not callable(fn):
            raise TypeError(f"from_fn takes a callable fn(b, h, i, j), got {type(fn).__name__}")
        self.fn = fn

    def _build(self, dims, diag, block):
        B, H, Sq, Sk = dims
        idx = np.ix_(np.arange(B), np.arange(H), np.arange(Sq), np.arange(Sk))
        jax = sys.modules.get("jax")
        if jax is not None and hasattr(jax, "ensure_compile_time_eval"):
            # a predicate written with jnp runs on the index arrays now, inside a traced call
            # too (its ops on concrete values stay concrete), as it runs eagerly
            with jax.ensure_compile_time_eval():
                got = self.fn(*idx)
        else:
            got = self.fn(*idx)
        if _traced(got):
            raise ValueError("from_fn's fn returned a traced JAX value: it depends on a value traced by jit, vmap "
                             "or grad (a closure over a traced argument), which is not known when the mask is "
                             "built; the predicate must depend on b, h, i, j and static values only")
        got = np.asarray(host_values(got))
        if got.dtype != np.bool_:
            raise TypeError(f"from_fn's fn must return booleans (True = attend), got dtype {got.dtype}")
        out, shape = _dense_dims("from_fn's result", got.shape, dims)
        a = np.broadcast_to(got.reshape(shape), out)
        return _from_dense(self, dims, block, out, a, "masks.from_fn")

    def __repr__(self):
        return f"from_fn({getattr(self.fn, '__name__', self.fn)!r})"


class _PerHead(Mask):
    def __init__(self, masks):
        super().__init__()
        self.masks = [_check_mask(m) for m in masks]
        if not self.masks:
            raise ValueError("per_head takes one mask per query head, got none")

    @property
    def takes_call_offset(self):
        return any(m.takes_call_offset for m in self.masks)

    @property
    def fixed_block(self):
        return next((m.fixed_block for m in self.masks if m.fixed_block), None)

    def _build(self, dims, diag, block):
        B, H, Sq, Sk = dims
        if len(self.masks) != H:
            raise ValueError(f"per_head has {len(self.masks)} masks but the call has {H} query heads")
        if all(m is self.masks[0] for m in self.masks):
            return self.masks[0].build(B, 1, Sq, Sk, diag_offset=diag, block=block)
        if len({m.fixed_block for m in self.masks if m.fixed_block}) > 1:
            # heads given at different block sizes (BlockMasks of their own): stacked from
            # their arrays, one [Sq, Sk] array per head at a time, at the call's blocks
            parts = [m.build(B, 1, Sq, Sk, diag_offset=diag, block=m.fixed_block or block).to_dense()
                     for m in self.masks]
            b = max(p.shape[0] for p in parts)
            a = np.concatenate([np.broadcast_to(p, (b, 1, Sq, Sk)) for p in parts], axis=1)
            return _from_dense(self, dims, block, (b, H, Sq, Sk), a, "masks.per_head")
        # the heads' own masks stacked by their blocks (the library's fa_mask_stack_heads: no
        # dense array; it took 2 H Sq Sk bytes, 16.5 GB at H = 32, S = 16384), each distinct
        # head's mask built once, all at the block size one of them is given at (a BlockMask's)
        block = self.fixed_block or block
        built = {}
        for m in self.masks:
            if id(m) not in built:
                built[id(m)] = m.build(B, 1, Sq, Sk, diag_offset=diag, block=block)
        return native.stack_heads([built[id(m)] for m in self.masks])

    def __repr__(self):
        return f"per_head({self.masks!r})"


def build_for_call(mask, batch, heads, seq_q, seq_k, *, diag_offset=None, empty=False):
    """mask.build for a call of these shapes, or None for a zero-size call (empty: the
    front's own test, a zero B, H, Hk, Sq or Sk), which computes nothing. Such a call still
    builds the mask where seq_q and seq_k are not 0 (a zero batch or heads builds fine), so
    that bad arguments (a chunk of 0, lengths that do not sum to the sequence) are errors
    there as on any call, as the call's other options are."""
    if seq_q and seq_k:
        built = mask.build(batch, heads, seq_q, seq_k, diag_offset=diag_offset)
        native.TAKES_OFFSET[built.ptr] = mask.takes_call_offset
        return None if empty else built
    return None


def took_call_offset(ptr):
    """True if the mask built at ptr for a call read the call's diag_offset (False for one
    with its own offsets or none: documents, arrays, predicates, FlexAttention BlockMasks)."""
    return bool(ptr) and native.TAKES_OFFSET.get(ptr, False)


def causal(diag_offset=None):
    """Key j visible to query i iff j <= i + diag_offset (None: the call's alignment)."""
    return _Causal(diag_offset)


def window(left, right, diag_offset=None):
    """Keys d - left <= j <= d + right, d = i + diag_offset; None or -1: that side unbounded."""
    return _Window(left, right, diag_offset)


def chunked(size, diag_offset=None):
    """Chunked causal: j <= d and j // size == d // size (d = i + diag_offset)."""
    return _Chunked(size, diag_offset)


def prefix_lm(prefix_lengths, diag_offset=None):
    """Prefix-LM: bidirectional inside each batch item's prefix (j < prefix_lengths[b]),
    causal after it (j <= d). An integer: one prefix length for every batch item."""
    return _PrefixLM(prefix_lengths, diag_offset)


def documents(lengths):
    """Packed documents, each seeing only itself: lengths of the documents in order (summing
    to seq_q == seq_k), or one such list per batch item. Causal within documents:
    documents(lengths) & causal()."""
    return _Documents(lengths)


def from_array(bool_array):
    """A boolean array (True = attend) broadcastable to [B, H, Sq, Sk] (copied once)."""
    return _Array(bool_array)


def from_fn(fn):
    """fn(b, h, i, j) -> bool on broadcastable numpy index arrays ([B,1,1,1], [1,H,1,1],
    [1,1,Sq,1], [1,1,1,Sk]), called once per shape the mask is bound to; a result that does
    not depend on b or h keeps that dim 1 (the mask is shared, not copied)."""
    return _Fn(fn)


def per_head(masks):
    """One mask per query head (a list of Hq masks), as the heads dim of one mask. The same
    object for every head builds once, shared; distinct ones are stacked from their arrays.
    Each entry is built as a one-head mask: a from_fn entry sees h = 0, a from_array entry
    takes one head (or a size-1 heads dim)."""
    return _PerHead(masks)


__all__ = ["Mask", "per_head", "causal", "window", "chunked", "prefix_lm", "documents", "from_array", "from_fn"]
