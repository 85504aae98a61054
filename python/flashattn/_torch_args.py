"""Argument checks shared by the PyTorch fronts (attention, the inference functions, the
SDPA drop-in): tensors, dtypes and devices, integers that must fit the library's types,
autocast, and boolean masks lowered to the library's hidden-key rule (docs/nonfinite.md: a
-inf bias term hides its key)."""
import torch

from ._problem import (_float, _int, check_real, dropout_p_value, fold_bias_scale, refuse_text_and_bools, threads_int,
                       window_pair)
from ._torch_ops import DTYPES

DTYPE_NAMES = "float32, float16 or bfloat16"


def check_dense(name, t):
    """A tensor the library can read through its strides: not nested, not sparse (else torch's
    own internal errors came back from deep in the op: "unsupported memory format option",
    "'NestedIntNode' object has no attribute 'mod'")."""
    if t.is_nested:
        raise ValueError(f"{name} is a nested tensor: flashattn takes dense tensors; sequences of different "
                         "lengths go to varlen_attention (packed, with cu_seqlens)")
    if t.layout != torch.strided:
        raise ValueError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")


def check_tensor(name, t, ndim=None):
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_dense(name, t)
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    return t


def check_floats(names, tensors):
    """One dtype the library computes in, one device it runs on (meta: shapes only)."""
    q = tensors[0]
    for name, t in zip(names, tensors):
        if t.dtype != q.dtype:
            raise ValueError(f"{', '.join(names)} must have one dtype, got {', '.join(str(x.dtype) for x in tensors)}")
        if t.device != q.device:
            raise ValueError(f"{', '.join(names)} must be on one device: {name} is on {t.device} but "
                             f"{names[0]} is on {q.device}")
    if q.dtype not in DTYPES:
        raise ValueError(f"{', '.join(names)} must be {DTYPE_NAMES} (the dtypes flashattn computes in), "
                        f"got {q.dtype}")
    if q.device.type not in ("cpu", "cuda", "meta"):
        raise ValueError(f"flashattn runs on cpu and cuda tensors (meta: shapes only), got device {q.device}")


def check_devices(q, named, host=()):
    """Every tensor argument of a call on q's device, the one device the op runs on, else
    ValueError naming it and both devices. Those named in host (lengths and block tables,
    which the op reads on the host) may be on the CPU too. Without this, a meta tensor
    beside CPU ones dispatched the op to its fake kernel: uninitialized outputs, nothing
    computed or written."""
    for name, t in named:
        if isinstance(t, torch.Tensor) and t.device != q.device and not (name in host and t.device.type == "cpu"):
            also = " (or the CPU: it is read on the host)" if name in host and q.device.type != "cpu" else ""
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}{also}")


def _per_head(name, t, H, device):
    """A per-head tensor [H] on q's device as the library's f32 (None stays None): real
    numbers (_problem.check_real, every front's rule)."""
    if t is None:
        return None
    check_tensor(name, t)
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}")
    check_real(name, t.dtype, f"[H] = [{H}]")
    if tuple(t.shape) != (H,):
        raise ValueError(f"{name} must have shape [H] = [{H}], got {tuple(t.shape)}")
    return t.to(torch.float32).contiguous()


def alibi(alibi_slopes, H, device):
    """alibi_slopes [H] as the library's f32. The library computes no gradient for them, so
    slopes that require one are refused (they were detached, and their gradient silently
    stayed None); detached or constant slopes pass."""
    if isinstance(alibi_slopes, torch.Tensor) and alibi_slopes.requires_grad and torch.is_grad_enabled():
        raise TypeError("alibi_slopes requires grad, but flashattn computes no gradient for the ALiBi slopes; "
                        "pass alibi_slopes.detach() (or learn a bias= instead)")
    s = _per_head("alibi_slopes", alibi_slopes, H, device)
    return None if s is None else s.detach()


def sinks_arg(sinks, H, device):
    """sinks [H] as the library's f32, still differentiable (autograd gives their gradient)."""
    return _per_head("sinks", sinks, H, device)


def int_in(name, v, bits=64, optional=False):
    """v as a Python int that fits a signed `bits`-bit integer, or ValueError naming it: the
    problem builder's one rule (_problem._int), None passed through where optional."""
    return None if v is None and optional else _int(name, v, bits)


def window_sides(window):
    return window_pair(window)  # checked to fit int64 by the problem builder


def threads_arg(threads):
    """threads= per call: None or 0 use the library's default (fa_options.threads)."""
    return threads_int(threads)


def float_or_none(name, x):
    """A scalar option (scale, softcap, bias_scale, dropout_p) as a float. A tensor is taken as
    F.scaled_dot_product_attention takes its scale: a 0-dim one that requires no gradient is
    its value; one that requires a gradient (a learned temperature) or has dims is refused, as
    there, since no gradient would reach it."""
    if x is None:
        return None
    refuse_text_and_bools(name, x, isinstance(x, torch.Tensor) and x.dtype == torch.bool)  # as in every front
    if isinstance(x, torch.Tensor):
        if x.dim() == 0 and not (x.requires_grad and torch.is_grad_enabled()):
            return float(x)
        raise TypeError(f"{name} must be a number or a 0-dim tensor that requires no grad, got a tensor of shape "
                        f"{tuple(x.shape)}{' that requires grad' if x.requires_grad else ''}: flashattn takes no "
                        f"gradient through {name} (as F.scaled_dot_product_attention); pass {name}.detach() for a "
                        "constant")
    if torch.compiler.is_compiling():  # a traced (symbolic) float: float() as before; the float32
        return float(x)                # range check's math on it would break the graph
    return _float(name, x)


def float_or_zero(name, x):
    """float_or_none, with None as 0.0 (off), without testing the value's truth (a traced
    float would be guarded on data it does not have: torch.compile's fullgraph failed)."""
    return 0.0 if x is None else float_or_none(name, x)


def dropout_p_arg(dropout_p):
    """dropout_p as a float in [0, 1) (None: 0), judged as every front judges it
    (_problem.dropout_p_value); traced by torch.compile, by comparisons alone (math on a
    symbolic float breaks the graph), as before the shared rule."""
    p = float_or_zero("dropout_p", dropout_p)
    if torch.compiler.is_compiling():
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout_p must be in [0, 1) (0 = off), got {p}")
        return p
    return dropout_p_value(p)


def autocast(*tensors):
    """The tensors in autocast's dtype where autocast is on for their device, as
    F.scaled_dot_product_attention gets them (it is on autocast's lower-precision list):
    every floating-point tensor but float64 (autocast leaves it as it is), each of its own
    dtype. The fronts cast before they check dtypes, as SDPA does, so that mixed float32 /
    bfloat16 inputs under autocast are one dtype."""
    dev = tensors[0].device.type
    if dev not in ("cpu", "cuda") or not torch.is_autocast_enabled(dev):
        return tensors
    dtype = torch.get_autocast_dtype(dev)
    return tuple(t.to(dtype) if t.is_floating_point() and t.dtype != torch.float64 else t for t in tensors)


def distinct(*tensors):
    """The tensors, each a separate object (k passed as v too becomes a view of it): Dynamo
    refuses an autograd.Function given one tensor for two inputs. Compared with `is`, not by
    id(): Dynamo guarded on every input's id() and recompiled the caller for each new tensor
    (fullgraph=True failed at the 9th call); `is` between inputs is its aliasing, which it
    guards as such."""
    out = []
    for t in tensors:
        if t is not None and any(t is s for s in out):
            t = t.view_as(t)
        out.append(t)
    return out


def no_memory(t):
    """A meta or fake tensor (FakeTensorMode, torch.compile's tracing): no bytes to compare."""
    if t.device.type == "meta":
        return True
    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:
        return False
    return isinstance(t, FakeTensor)


def shares_memory(a, b):
    """Whether tensors a and b have a byte in common: exact on the CPU (numpy's
    shares_memory over views of their bytes, so that interleaved views of one buffer, k and
    v of a combined cache, are told apart); on other devices, one storage and overlapping
    byte ranges."""
    if a is None or b is None or a.numel() == 0 or b.numel() == 0:
        return False
    if no_memory(a) or no_memory(b):  # every meta storage is at 0, a fake one has no pointer to ask
        return a is b
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False

    def span(t):
        extent = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
        return t.data_ptr(), t.data_ptr() + (extent + 1) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    if a1 <= b0 or b1 <= a0:
        return False
    if a.device.type != "cpu":
        return True
    import ctypes
    import numpy as np

    def view(t):
        es, lo = t.element_size(), t.data_ptr()
        raw = np.frombuffer((ctypes.c_uint8 * (span(t)[1] - lo)).from_address(lo), dtype=np.uint8)
        return np.lib.stride_tricks.as_strided(raw, tuple(t.shape) + (es,), tuple(s * es for s in t.stride()) + (1,))

    return bool(np.shares_memory(view(a), view(b)))


def refuse_bool_bias(bias):
    """A bias tensor's dtype by every front's rule (_problem.check_real): real numbers; a
    boolean one raises TypeError pointing to mask=."""
    if isinstance(bias, torch.Tensor):
        check_real("bias", bias.dtype, "broadcastable to [B, H, Sq, Sk]")


def mask_to_bias(mask, name="mask"):
    """A boolean mask (True = attend) as the f32 additive bias 0 / -inf, same shape."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = type(mask).__name__ if not isinstance(mask, torch.Tensor) else mask.dtype
        raise TypeError(f"{name} must be a boolean torch.Tensor (True = attend), got {got}")
    # out of place, so that a mask vmapped over (torch.func.vmap) works too
    return torch.zeros((), dtype=torch.float32, device=mask.device).masked_fill(~mask, float("-inf"))


def expand_seq_dims(bias, seq_q, seq_k):
    """A 4-dim bias with a size-1 Sk dim expanded to seq_k as a stride-0 view (the library
    reads a bias through its strides; batch, heads and a size-1 Sq it broadcasts itself, so
    that dbias comes back in that shape: bias_seq_q). seq_q: checked, never expanded to."""
    if bias.shape[2] not in (1, seq_q):
        raise ValueError(f"bias has {bias.shape[2]} query rows, not 1 or seq_q = {seq_q}")
    return bias.expand(bias.shape[0], bias.shape[1], bias.shape[2], seq_k)


def combine_bias_mask(bias, mask, B, H, Sq, Sk, bias_scale):
    """bias (float, 2 to 4 dims) and mask (bool) as one f32 bias [B or 1, H or 1, Sq or 1, Sk]
    and the bias_scale to pass with it. With a mask the scale is applied here, so that a
    negative or zero scale cannot turn a hidden key's -inf into +inf or NaN
    (_problem.fold_bias_scale, every front's rule)."""
    def four(t, what):
        if t.dim() > 4:  # fewer dims are left-padded with ones, as torch broadcasts (numpy's front too)
            raise ValueError(f"{what} must have at most 4 dims (broadcastable to [B, H, Sq, Sk]), "
                             f"got shape {tuple(t.shape)}")
        given = tuple(t.shape)  # the caller's shape, for the message
        t = t.reshape((1,) * (4 - t.dim()) + given)
        want = (B, H, Sq, Sk)
        if any(n not in (1, w) for n, w in zip(t.shape, want)):
            raise ValueError(f"{what} shape {given} must broadcast to [B, H, Sq, Sk] = "
                             f"[{B}, {H}, {Sq}, {Sk}] (each dim that size or 1)")
        return t
    if bias is not None:
        refuse_bool_bias(bias)
        bias = four(bias, "bias").to(torch.float32)
        if mask is None:
            if bias.shape[3] != Sk:  # the library's bias covers Sk itself
                bias = expand_seq_dims(bias, Sq, Sk)
            return bias, bias_scale
    m = four(mask_to_bias(mask), "mask")
    bias, bias_scale = fold_bias_scale(bias, bias_scale, True)
    if bias is not None:  # where, not bias + m: a NaN or inf bias at a hidden key stays hidden
        m = torch.where(m == 0, bias, m)
    return expand_seq_dims(m, Sq, Sk), bias_scale
