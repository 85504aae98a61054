"""One fa_problem from shapes, strides and options; shared by the plan and every front.

Dims and strides arrive in the library's logical order [B, H, S, D] (the fronts translate
their layouts); strides are in elements. Options are checked here only where Python can say
more than the library would (types, tuple shapes); everything else is the library's call,
so the messages stay the library's.
"""
import math
import sys

import numpy as np

from . import _native

DTYPES = {"f32": _native.F32, "f16": _native.F16, "bf16": _native.BF16}
BACKENDS = {"auto": _native.BACKEND_AUTO, "cpu": _native.BACKEND_CPU, "cuda": _native.BACKEND_CUDA}


# numpy's (and torch's, JAX's) names for the same three
_DTYPE_ALIASES = {"float32": "f32", "float16": "f16", "half": "f16", "bfloat16": "bf16"}


def dtype_code(dtype):
    """The library's code for a dtype given as "f32", "f16" or "bf16", their numpy names
    ("float32", "float16", "bfloat16"), a numpy, ml_dtypes, torch or JAX dtype of those, or
    the library's own code (an int, as the fronts pass it)."""
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return dtype
    name = dtype
    if not isinstance(dtype, str):
        if type(dtype).__module__.split(".")[0] == "torch":  # torch.bfloat16 -> "bfloat16"
            name = str(dtype).rsplit(".", 1)[-1]
        else:
            try:
                name = np.dtype(dtype).name  # numpy, ml_dtypes and JAX dtypes and scalar types
            except TypeError:
                name = repr(dtype)
    name = _DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        raise _dtype_error(dtype)
    return DTYPES[name]


def _dtype_error(dtype):
    return ValueError(f"dtype must be f32, f16 or bf16 (or float32, float16, bfloat16: a name or a numpy, torch or "
                      f"JAX dtype), got {dtype!r}")


def public_dtype(dtype):
    """dtype as a user gave it to a public function: every form dtype_code takes but the
    library's own int code, which the fronts pass internally (a bare 0, 1 or 2 planned as
    some dtype without a word)."""
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        raise _dtype_error(dtype)
    return dtype


def dtype_kind(dtype):
    """numpy's kind letter ("f", "i", "u", "b", "c", ...) for a numpy, ml_dtypes, JAX or torch
    dtype; ml_dtypes' types (bfloat16, float8_*, int4, ...), which numpy files as "V", by
    their names."""
    if type(dtype).__module__.split(".")[0] == "torch":
        import torch
        if dtype == torch.bool:
            return "b"
        if dtype.is_complex:
            return "c"
        if dtype.is_floating_point:
            return "f"
        try:
            torch.iinfo(dtype)
        except TypeError:  # quantized and other dtypes that are no plain numbers
            return "V"
        return "i" if dtype.is_signed else "u"
    d = np.dtype(dtype)
    if d.kind == "V":
        for prefix, kind in (("bfloat", "f"), ("float", "f"), ("uint", "u"), ("int", "i")):
            if d.name.startswith(prefix):
                return kind
    return d.kind


BOOL_BIAS = ("bias is boolean: bias= is added to the scores; pass a boolean mask as mask= (True: attend), "
             "or cast it to float for an additive 0/1 bias")


def check_not_masked(name, a):
    """numpy masked arrays (np.ma) are refused: the library would read their data and ignore
    their mask (an attention mask is mask=, a boolean array)."""
    if isinstance(a, np.ma.MaskedArray):
        raise ValueError(f"{name} is a numpy masked array (np.ma): flashattn would read its data and ignore "
                         "its mask; pass a plain array (a.filled(...)), and attention masks as mask=")


def check_real(name, dtype, shape_desc):
    """The rule of every front (numpy, torch, JAX) for its option arrays (bias, alibi_slopes,
    sinks): real numbers, float of any width or signed or unsigned integer, which the front
    converts to the library's float32. A boolean bias raises TypeError pointing to mask=;
    any other boolean or a complex array raises ValueError (converting would turn it into
    0 / 1, or drop its imaginary part)."""
    kind = dtype_kind(dtype)
    if kind == "b" and name == "bias":
        raise TypeError(BOOL_BIAS)
    if kind not in ("f", "i", "u"):
        raise ValueError(f"{name} must be real numbers (float or integer; {shape_desc}), got dtype {dtype}")


def window_pair(window):
    """None -> (-1, -1); (left, right) with None for unbounded sides."""
    if window is None:
        return (-1, -1)
    try:
        left, right = window
    except (TypeError, ValueError):
        raise ValueError(f"window must be None or a pair (left, right), got {window!r}") from None
    left = -1 if left is None else left
    right = -1 if right is None else right
    return (_int("window left", left), _int("window right", right))


def problem_diag_offset(diag_offset, causal, window, alibi, masked, takes_masks=True):
    """The diag_offset the library's problem gets (None: unset). It places causal, the
    window and ALiBi (fa_problem.has_diag_offset, which the library refuses without one of
    them); the masks a front builds for the call take it when they are built (masked: a
    flashattn.masks mask that read it, masks.took_call_offset), so with only such a mask the
    problem goes without it. Given with nothing at all to place (a mask with its own offsets
    or none, a BlockMask, a boolean array places nothing): ValueError, as the library would
    refuse it; takes_masks: the call takes flashattn.masks masks (packed batches and kv caches
    do not, and their message does not name them)."""
    if diag_offset is None:
        return None
    if causal or alibi or any(side >= 0 for side in window_pair(window)):
        return diag_offset
    if masked:
        return None
    masks = (" (and flashattn.masks masks made without their own diag_offset: causal, window, chunked, prefix_lm)"
             if takes_masks else "")
    raise ValueError(f"diag_offset places causal, window and ALiBi{masks}, and none is given: it would change nothing")


def is_tracer(x):
    """Whether x is a traced JAX value (inside jit, vmap, grad): its value is not known when the
    call is built. jax is looked up, not imported: every front uses this, and a program that
    never imported jax has no tracers."""
    tracer = getattr(getattr(sys.modules.get("jax"), "core", None), "Tracer", None)
    return tracer is not None and isinstance(x, tracer)


def _index(name, v):
    """v as a Python int: an integer (numpy's, a 0-dim integer tensor), not a bool;
    ValueError naming the argument otherwise, a traced JAX value's included."""
    if type(v).__name__ == "_DimExpr":  # jax.export's symbolic dimension (shape polymorphism)
        raise ValueError(f"{name} is the symbolic dimension {v!r}: flashattn plans from concrete shapes, so "
                         "jax.export with shape polymorphism is not supported; export with concrete shapes, "
                         "allowing flashattn's custom calls (they have no compatibility guarantee: the artifact "
                         "runs only where the same flashattn is imported): jax.export.export(jax.jit(f), "
                         "disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(t) for t in "
                         "('flashattn_forward', 'flashattn_backward', 'flashattn_varlen_forward', "
                         "'flashattn_varlen_backward', 'flashattn_kvcache')])(*concrete_args) "
                         "(docs/python.md, \"jax.export\")")
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    try:
        return int(v.__index__())
    except TypeError:
        if is_tracer(v):
            raise ValueError(f"{name} must be an integer known when the call is built (a static value), "
                             f"got {type(v).__name__}") from None
        raise ValueError(f"{name} must be an integer, got {v!r}") from None  # np.array(4.9): numpy's float


def _int(name, v, bits=64):
    """v as a Python int that fits a signed C integer of `bits` bits (ctypes would wrap a
    larger one silently: 2**64 + 1 becomes 1); ValueError naming the argument otherwise.
    The range that makes sense is the library's to judge."""
    v = _index(name, v)
    if not -(2 ** (bits - 1)) <= v < 2 ** (bits - 1):
        raise ValueError(f"{name} = {v} does not fit a {bits}-bit signed integer")
    return v


def flag(name, v):
    """A yes/no option (causal, return_lse, bias_grad, a plan's alibi, ...) as a Python bool, in
    every front and in the plans: True or False, numpy's bool, an integer 0 or 1, or a 0-d
    boolean or integer array or tensor of one; ValueError naming the option otherwise, a traced
    JAX value's included. Taken by its truth, "False", 2 or 0.5 turned the option on silently.
    (The drop-ins take theirs as their frameworks do: _torch_sdpa, jax/_attention.truth.)"""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    zero_d_bool = str(getattr(v, "dtype", "")) in ("bool", "torch.bool") and tuple(getattr(v, "shape", (0,))) == ()
    if zero_d_bool or (not isinstance(v, (str, bytes, float)) and hasattr(v, "__index__")):
        try:
            i = bool(v) if zero_d_bool else v.__index__()
        except TypeError:
            if is_tracer(v):
                raise ValueError(f"{name} must be True or False known when the call is built (a static value), "
                                 f"got {type(v).__name__}") from None
            i = None
        if i in (0, 1):
            return bool(i)
    raise ValueError(f"{name} must be True or False, got {v!r}")


def refuse_text_and_bools(name, v, bool_array=False):
    """A string or a bool is not a number for a float option, in every front ("0.3" and True
    were taken as 0.3 and 1.0), as the integer options refuse them (the drop-ins take bools as
    their frameworks do, before this); a 0-d bool array or tensor neither (bool_array: the
    front's own test of its array type; a numpy one is tested here). Only isinstance tests:
    torch.compile traces this with symbolic floats, whose attributes it cannot look up."""
    if isinstance(v, (str, bytes, bool, np.bool_)) or bool_array or (isinstance(v, np.ndarray) and v.dtype == np.bool_):
        raise ValueError(f"{name} must be a number, got {v!r}")


def _float(name, v):
    """v as a float for one of the problem's float32 fields: a finite value beyond float32's
    range is refused here by its own value (as float32 it would be reported as inf); strings
    and bools are refused (refuse_text_and_bools)."""
    refuse_text_and_bools(name, v)
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {v!r}") from None
    if math.isfinite(f) and abs(f) > float(np.finfo(np.float32).max):
        raise ValueError(f"{name} = {f!r} does not fit float32")
    return f


def dropout_p_value(v, name="dropout_p"):
    """dropout_p as a float in [0, 1) (0: off), judged by the value the caller gave: a negative
    one too small for float32 (-1e-50 became -0.0, taken as off) is refused as negative, and
    one below 1 that float32 rounds to 1 (0.9999999999) is refused by its own value, where the
    library would report "got 1"."""
    f = _float(name, v)
    if not 0.0 <= f < 1.0:
        raise ValueError(f"{name} must be in [0, 1) (0 = off), got {v!r}")
    if f >= 1.0 - 2.0**-25:  # float32 rounds from halfway above its largest value below 1 (plain floats:
        # torch.compile would trace numpy's float32 as a tensor and break its graph on the branch)
        raise ValueError(f"{name} = {v!r} rounds to 1 in float32, the library's type (0 <= dropout_p <= "
                         f"{1.0 - 2.0**-24!r})")
    return f


def bias_dims(shape, batch, heads, seq_q, seq_k):
    """A bias shape, left-padded with ones to 4 dims as numpy broadcasting would, checked
    against [B or 1, Hq or 1, Sq or 1, Sk] (the library broadcasts size-1 B, H and Sq
    itself); returns the 4-tuple."""
    shape = tuple(int(n) for n in shape)
    if not 2 <= len(shape) <= 4:
        raise ValueError(f"bias must have 2 to 4 dims ([B or 1, Hq or 1, Sq, Sk]), got shape {shape}")
    shape = (1,) * (4 - len(shape)) + shape
    if shape[2] not in (1, seq_q) or shape[3] != seq_k:
        raise ValueError(f"bias shape {shape} must end in (seq_q or 1, seq_k) = ({seq_q}, {seq_k})")
    if shape[0] not in (1, batch) or shape[1] not in (1, heads):
        raise ValueError(f"bias shape {shape} must be [1 or batch ({batch}), 1 or heads ({heads}), "
                         f"{seq_q}, {seq_k}]")
    return shape


def broadcast_dims(name, shape, batch, heads, seq_q, seq_k):
    """A bias or mask shape broadcastable to [B, Hq, Sq, Sk] (left-padded with ones as numpy
    does; every dim 1 or full), as a 4-tuple."""
    shape = tuple(int(n) for n in shape)
    full = (batch, heads, seq_q, seq_k)
    if len(shape) > 4 or any(d not in (1, f) for d, f in zip((1,) * (4 - len(shape)) + shape, full)):
        raise ValueError(f"{name} has shape {shape}, which does not broadcast to [B, Hq, Sq, Sk] = "
                         f"{list(full)} (each dim 1 or full)")
    return (1,) * (4 - len(shape)) + shape


def combined_bias_dims(bias_shape, mask_shape, batch, heads, seq_q, seq_k):
    """The [1 or B, 1 or Hq, 1 or Sq, Sk] shape of the bias the library gets for a bias and a mask
    (a mask goes as a 0 / -inf bias, added to the bias): B, H and Sq stay 1 where both are 1
    (the library broadcasts them: bias_batch, bias_heads, bias_seq_q); Sk is always full,
    since the library's bias has no size-1 key dim (the fronts broadcast it, without a copy
    where they can)."""
    dims = [broadcast_dims(n, s, batch, heads, seq_q, seq_k)
            for n, s in (("bias", bias_shape), ("mask", mask_shape)) if s is not None]
    if not dims:
        return None
    # per dim: 1 where every shape broadcasts it, else its full size (0 included: a size-1 dim
    # of one beside a 0 of the other is 0, as numpy broadcasts them; max made it 1)
    return tuple(1 if all(d[i] == 1 for d in dims) else min(d[i] for d in dims if d[i] != 1)
                 for i in range(3)) + (seq_k,)


def library_bias_scale(bias_scale, has_bias, masked):
    """The bias_scale the library gets (fold_bias_scale: none with a mask). A bias_scale without
    a bias is refused, as the library refuses it: with only a boolean mask (which goes to the
    library as a bias) it would otherwise vanish without a word."""
    if bias_scale is not None and not has_bias:
        raise ValueError("bias_scale needs a bias (bias=): there is no bias to scale"
                         + (" (a boolean mask hides keys; it is not scaled)" if masked else ""))
    return None if masked else bias_scale


def fold_bias_scale(bias, bias_scale, masked):
    """(bias, bias_scale) as the library gets them where a boolean mask goes to it as a 0 / -inf
    bias added to bias (every front): with a mask the scale multiplies bias here and the
    library gets none, so that a zero or negative bias_scale cannot turn a hidden key's -inf
    into NaN or +inf (docs/nonfinite.md); the gradient of the caller's bias is then bias_scale
    times the library's. Without a mask both pass as they are. bias: None, a numpy array, a
    torch tensor or a JAX array (float32 already)."""
    scale = library_bias_scale(bias_scale, bias is not None, masked)
    if not masked or bias_scale is None:
        return bias, scale
    bias_scale = _float("bias_scale", bias_scale)
    if isinstance(bias, np.ndarray):  # 0 or inf times the -inf, NaN or inf a hidden key may hold: no warning
        with np.errstate(invalid="ignore", over="ignore"):
            return bias * np.float32(bias_scale), None
    return (None if bias is None else bias * bias_scale), None


def check_sinks_finite(values, what="attention"):
    """The library's rule for sinks (src/args.c, check_sinks), for the fronts that fill a
    problem without keys themselves (no library call to judge them): every sink finite."""
    values = np.asarray(values, np.float64).reshape(-1)
    for h, x in enumerate(values):
        if not math.isfinite(x):
            raise ValueError(f"{what}: sinks[{h}] (head {h}) is {x:g}; sinks must be finite")


def empty_dims(*dims):
    """Whether a problem with these sizes has no element to compute (a zero B, H, Sq or Sk);
    the torch and JAX fronts fill such calls' outputs themselves (their tensors may live on a
    GPU, be meta tensors or XLA buffers) after the library has planned the problem."""
    return any(int(d) == 0 for d in dims)


def check_shapes(q_dims, k_dims, v_dims):
    """q [B, Hq, Sq, D], k [B, Hk, Sk, D], v [B, Hk, Sk, Dv] in logical order: agreement
    between the tensors, with messages that name them."""
    B, Hq, Sq, D = q_dims
    kB, Hk, Sk, kD = k_dims
    vB, vH, vS, Dv = v_dims
    if kB != B or vB != B:
        raise ValueError(f"batch sizes differ: q {B}, k {kB}, v {vB}")
    if vH != Hk:
        raise ValueError(f"k has {Hk} heads but v has {vH}")
    if vS != Sk:
        raise ValueError(f"k has {Sk} keys but v has {vS}")
    if kD != D:
        raise ValueError(f"k has head_dim {kD} but q has {D}")
    if Hk == 0 and Hq > 0:
        raise ValueError(f"k and v have 0 heads but q has {Hq} (each query head reads a kv head; "
                         "docs/semantics.md, \"Empty problems\")")
    if Hk > 0 and Hq % Hk:
        raise ValueError(f"q's heads ({Hq}) are not a multiple of k's and v's heads ({Hk})")


def make_problem(*, q_dims, k_dims, v_dims, dtype, causal=False, window=None, softcap=None,
                 scale=None, bias_shape=None, alibi=False, segment_ids=False,
                 q_stride=None, k_stride=None, v_stride=None, o_stride=None, bias_stride=None,
                 diag_offset=None, bias_scale=None, bias_grad=False, sinks=False, dropout_p=None, seed=None,
                 dropout_offset=None, mask=None, takes_masks=True):
    """q_dims [B, Hq, Sq, D], k_dims [B, Hk, Sk, D], v_dims [B, Hk, Sk, Dv] (logical order);
    strides None for contiguous BHSD. The fronts check tensor shapes first (check_shapes),
    so that their messages name tensors; the rest is the library's to judge. mask: the
    address of a library-built fa_mask (flashattn.masks), which the caller keeps alive."""
    B, Hq, Sq, D = q_dims
    _, Hk, Sk, _ = k_dims
    Dv = v_dims[3]
    # the library reads head_dim_v 0 as "the same as head_dim" (fa_problem's default); a v
    # whose head dim really is 0 must not become one of D columns, read past its end (a zero
    # D the library refuses itself)
    if int(Dv) == 0 and int(D) != 0:
        raise ValueError("head_dim_v must be positive: v's head dim is 0, and a zero head dim is an error "
                         "(docs/semantics.md, \"Empty problems\")")
    # likewise heads_kv 0 reads as "the same as heads_q": k and v with no heads would be read
    # as Hq heads, past their ends
    if int(Hk) == 0 and int(Hq) != 0:
        raise ValueError(f"kv_heads is 0 but heads is {int(Hq)}: each query head reads a kv head (docs/semantics.md, "
                         "\"Empty problems\")")
    p = _native.new_problem()
    for field, name, n in (("batch", "batch", B), ("heads_q", "heads", Hq), ("heads_kv", "kv_heads", Hk),
                           ("seq_q", "seq_q", Sq), ("seq_k", "seq_k", Sk), ("head_dim", "head_dim", D),
                           ("head_dim_v", "head_dim_v", Dv)):
        setattr(p, field, _int(name, n))
    p.dtype = dtype_code(dtype)
    for name, st in (("q_stride", q_stride), ("k_stride", k_stride), ("v_stride", v_stride),
                     ("o_stride", o_stride), ("bias_stride", bias_stride)):
        if st is not None:
            getattr(p, name).s[:] = [_int(name, x) for x in st]
    if scale is not None:
        p.has_scale, p.scale = 1, _float("scale", scale)
    p.causal = int(flag("causal", causal))
    p.window_left, p.window_right = window_pair(window)
    if softcap is not None:
        cap = p.softcap = _float("softcap", softcap)
        if cap < 0:  # by the value given: -1e-50 is negative, not a cap that rounds to 0
            raise ValueError(f"softcap must be >= 0 (0 or None: off), got {softcap!r}")
        if cap != 0 and p.softcap == 0:  # rounded to 0 in the float32 field, which means off
            raise ValueError(f"softcap = {cap!r} rounds to 0 in float32, which would turn the cap off "
                             "(softcap must be 0 or within [2^-126, 2^100])")
    if bias_shape is not None:
        bb, bh, bq, _ = bias_dims(bias_shape, B, Hq, Sq, Sk)
        p.has_bias, p.bias_batch, p.bias_heads, p.bias_seq_q = 1, bb, bh, bq
    p.has_alibi = int(bool(alibi))
    p.has_segment_ids = int(bool(segment_ids))
    from .masks import took_call_offset  # (masks imports this module)
    diag_offset = problem_diag_offset(diag_offset, causal, window, alibi, took_call_offset(mask), takes_masks)
    if diag_offset is not None:
        p.has_diag_offset, p.diag_offset = 1, _int("diag_offset", diag_offset)
    if bias_scale is not None:
        library_bias_scale(bias_scale, bias_shape is not None, False)  # the fronts' words, not the struct's
        p.has_bias_scale, p.bias_scale = 1, _float("bias_scale", bias_scale)
    p.bias_grad = int(flag("bias_grad", bias_grad))
    p.has_sinks = int(bool(sinks))
    set_dropout(p, dropout_p, seed, dropout_offset)
    if mask:
        p.mask = mask
    return p


def _uint64(name, v):
    v = _index(name, v)
    if not 0 <= v < 2 ** 64:
        raise ValueError(f"{name} = {v} is not in 0 .. 2**64 - 1")
    return v


def set_dropout(p, dropout_p, seed, dropout_offset=None):
    """Dropout's fields of problem p (docs/semantics.md, "Dropout"): dropout_p in [0, 1) (None
    or 0: off; the library judges the range), seed and offset unsigned 64-bit integers. A
    dropout_p > 0 needs a seed: the numpy and JAX fronts take it explicitly (the torch front
    draws one from torch's generator before it gets here). Every front's rule: with dropout
    off, a seed or offset given is checked as it would be with dropout, and unused (the
    problem is the one without them)."""
    if dropout_p is not None:
        p.dropout_p = dropout_p_value(dropout_p)
    if p.dropout_p > 0 and seed is None:
        raise ValueError("dropout_p > 0 needs seed= (an integer in 0 .. 2**64 - 1): the keep mask is a function "
                         "of the seed, so that the backward regenerates the forward's")
    seed = _uint64("seed", 0 if seed is None else seed)
    offset = _uint64("dropout_offset", 0 if dropout_offset is None else dropout_offset)
    if p.dropout_p != 0:
        p.dropout_seed, p.dropout_offset = seed, offset


def threads_int(threads):
    """threads= of every front and plan: None or 0, the library's default (fa_options.threads);
    else 1 .. the library's limit, checked here too, so that a call whose plan waits for
    traced lengths (JAX) says so at trace time, in the library's words."""
    t = 0 if threads is None else _int("threads", threads, 32)
    if not 0 <= t <= _native.MAX_THREADS:
        raise ValueError(f"threads must be 1..{_native.MAX_THREADS} (0 = default), got {t}")
    return t


def make_options(backend="auto", threads=0, block_q=0, block_k=0):
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {sorted(BACKENDS)}, got {backend!r}")
    o = _native.Options()
    o.backend = BACKENDS[backend]
    o.threads = threads_int(threads)
    o.block_q = _int("block_q", block_q)
    o.block_k = _int("block_k", block_k)
    return o
