"""Layouts and strides, for every front: which [B, H, S, D] order a tensor's dims are in,
whether its strides can go to the library as they are, and the strides its gradient gets.

All of it works on shape and element-stride tuples, so numpy, torch (real and fake tensors)
and jax share one set of rules.
"""

LAYOUTS = ("bhsd", "bshd")
# position in the caller's dims of the library's B, H, S, D
_AXES = {"bhsd": (0, 1, 2, 3), "bshd": (0, 2, 1, 3)}
# largest gradient buffer, in elements per element of the tensor, kept with its input's strides
# (a q sliced from a packed qkv spans 3x); beyond it the input is copied to a dense layout
MAX_SPAN_RATIO = 4


def check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'bhsd' ([B, H, S, D]) or 'bshd' ([B, S, H, D]), got {layout!r}")
    return layout


def to_bhsd(layout, seq):
    """The caller's 4 dims (or strides) in the library's [B, H, S, D] order."""
    return tuple(seq[i] for i in _AXES[layout])


def from_bhsd(layout, seq):
    """[B, H, S, D]-ordered dims back in the caller's order (the permutation is its own inverse)."""
    return tuple(seq[i] for i in _AXES[layout])


def passes_as_is(shape, strides):
    """Whether element strides describe the tensor to the library: non-negative, and not all
    zero unless there is a single element (all-zero strides mean "contiguous" to it)."""
    if any(s < 0 for s in strides):
        return False
    n = 1
    for d in shape:
        n *= d
    return n <= 1 or any(s != 0 for s in strides)


def non_overlapping(shape, strides):
    """Whether no two elements share memory: sorted by stride, each dim steps past the
    whole extent of the smaller ones. Sufficient, and exact for the layouts people use. A
    tensor of no elements overlaps nothing (numpy gives an empty array all-zero strides)."""
    if any(d == 0 for d in shape):
        return True
    dims = [(s, d) for d, s in zip(shape, strides) if d != 1]
    # by stride, then size: an insertion sort of plain comparisons, which torch.compile traces
    # as guards where the strides are symbolic (dynamic shapes); it refuses sorted() there
    for i in range(1, len(dims)):
        j = i
        while j > 0 and (dims[j][0] < dims[j - 1][0] or (dims[j][0] == dims[j - 1][0] and dims[j][1] < dims[j - 1][1])):
            dims[j], dims[j - 1] = dims[j - 1], dims[j]
            j -= 1
    extent = 1
    for s, d in dims:
        if s < extent:
            return False
        extent = s * (d - 1) + extent
    return True


def span(shape, strides):
    """Elements from the first to one past the last that the strides reach."""
    if any(d == 0 for d in shape):
        return 0
    return 1 + sum((d - 1) * s for d, s in zip(shape, strides))


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def writable_strides(shape, strides):
    """Whether an output (or a gradient buffer) may have these strides."""
    return passes_as_is(shape, strides) and non_overlapping(shape, strides)


def grad_strides_ok(shape, strides):
    """Whether the gradient of a tensor can be allocated with the tensor's own strides (the
    library writes dq with q's strides): writable, and not too sparse a span."""
    return writable_strides(shape, strides) and span(shape, strides) <= MAX_SPAN_RATIO * max(numel(shape), 1)


def contiguous_strides(shape):
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))
