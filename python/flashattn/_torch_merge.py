"""flashattn.torch.merge_states: fa_merge_states on CPU tensors (docs/semantics.md, "Merging
attention states"), as the numpy front's flashattn.merge_states. Not differentiable: it
composes the forward states of attention that ran elsewhere (cascades, paged splits)."""
import ctypes

import torch

from . import _native
from ._merge import _DTYPE_IDS, check_merge_shapes
from ._problem import check_real
from ._torch_args import check_dense
from ._torch_ops import DTYPES


@torch.compiler.disable(reason="flashattn.torch.merge_states runs the library on the tensors' memory, outside "
                        "compiled graphs: call it outside the compiled function (without fullgraph: a graph "
                        "break around it)")
def merge_states(o_a, lse_a, o_b, lse_b, sinks=None):
    """(o, lse) over the union of two disjoint key sets: o_a, o_b [..., H, Dv] of one dtype
    (float32, float16, bfloat16), lse_a, lse_b [..., H] and sinks [H] real (float32 to the
    library, as numpy's merge_states takes them), CPU tensors; sinks are attention-sink
    logits, added once: pass them to the final merge only. Not differentiable: inputs that
    require grad, with grad mode on, are refused rather than detached. torch.compile does not
    trace it (a graph break; with fullgraph=True an error saying so)."""
    for name, t in (("o_a", o_a), ("lse_a", lse_a), ("o_b", o_b), ("lse_b", lse_b), ("sinks", sinks)):
        if (t is not None or name != "sinks") and (not isinstance(t, torch.Tensor) or t.device.type != "cpu"):
            raise ValueError(f"{name} must be a CPU tensor, got {type(t).__name__}"
                             f"{'' if not isinstance(t, torch.Tensor) else ' on ' + str(t.device)}")
        if t is not None:
            check_dense(name, t)
    for name, t in (("lse_a", lse_a), ("lse_b", lse_b), ("sinks", sinks)):
        if t is not None:
            check_real(name, t.dtype, "[..., H]" if name != "sinks" else "[H]")
    heads, dv = check_merge_shapes((tuple(o_a.shape), o_a.dtype), (tuple(o_b.shape), o_b.dtype), tuple(lse_a.shape),
                                   tuple(lse_b.shape), None if sinks is None else tuple(sinks.shape))
    if o_a.dtype not in DTYPES:
        raise ValueError(f"o_a and o_b must be float32, float16 or bfloat16, got {o_a.dtype}")
    if torch.is_grad_enabled():
        grads = [n for n, t in (("o_a", o_a), ("lse_a", lse_a), ("o_b", o_b), ("lse_b", lse_b), ("sinks", sinks))
                 if t is not None and t.requires_grad]
        if grads:
            raise RuntimeError(f"merge_states is not differentiable, but {', '.join(grads)} require grad: "
                               "detach() them, or merge under torch.no_grad()")
    o_a, o_b = o_a.contiguous(), o_b.contiguous()
    lse_a, lse_b = (t.to(torch.float32).contiguous() for t in (lse_a, lse_b))
    sinks = None if sinks is None else sinks.to(torch.float32).contiguous()
    o, lse = torch.empty_like(o_a), torch.empty_like(lse_a)
    if lse.numel() == 0:  # no rows or heads (Dv 0 still merges the lse: the library's head_dim_v 0)
        return o, lse
    fp = ctypes.POINTER(ctypes.c_float)
    f = lambda t: None if t is None else ctypes.cast(t.data_ptr(), fp)  # noqa: E731
    rows = lse_a.numel() // heads
    _native.check(_native.lib.fa_merge_states(_DTYPE_IDS[DTYPES[o_a.dtype]], rows, heads, dv, o_a.data_ptr(),
                                              f(lse_a), o_b.data_ptr(), f(lse_b), f(sinks), o.data_ptr(), f(lse)),
                  "merge_states")
    return o, lse
