"""The XLA FFI targets behind flashattn.jax: loading the handler library, registering its
forward and backward handlers with XLA, and calling them through jax.ffi.ffi_call.

The handlers (python/csrc/jax_ffi.c) take the tensors as buffers and the options as scalar
attributes, build one fa_problem from them, plan and run. Under jax.vmap the calls use
vmap_method="expand_dims": the handler folds the added leading dims into the batch.
"""

from __future__ import annotations

import ctypes
import os
import re
from typing import NamedTuple

import jax

# The oldest JAX flashattn.jax runs on as documented: jax.ffi came with 0.5.0, but under 0.5
# varlen_attention's gradient fails (custom_vjp's output structure) and under 0.6 an unused
# lse's zero cotangent under dropout still raises. pyproject.toml's [jax] extra says the same
# (tests/python/test_packaging.py). Checked before anything else uses JAX's API.
MIN_JAX = (0, 7, 0)


def _version_tuple(version: str) -> tuple:
    """(major, minor, patch) of a version string such as "0.5.0", "0.10.2rc1" or "0.6.0.dev20250101"."""
    return tuple(int(re.match(r"\d*", part).group() or 0) for part in (version.split(".") + ["0", "0"])[:3])


def check_jax(version: str, has_ffi: bool) -> None:
    """ImportError, naming the versions, for a JAX older than MIN_JAX (or without jax.ffi)."""
    if _version_tuple(version) < MIN_JAX or not has_ffi:
        need = ".".join(map(str, MIN_JAX))
        raise ImportError(f"flashattn.jax needs jax>={need}; this is jax {version}. "
                          f"Upgrade it: pip install 'jax>={need}' (or 'flashattn[jax]')")


check_jax(jax.__version__, hasattr(jax, "ffi"))

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from .. import _native  # noqa: E402
from .._problem import problem_diag_offset  # noqa: E402
from ..masks import took_call_offset  # noqa: E402
from . import _partition  # noqa: E402

_LIB_NAME = "libflashattn_jax.so"
FORWARD_TARGET = "flashattn_forward"
BACKWARD_TARGET = "flashattn_backward"
# packed variable-length batches and kv-cache decoding (target, handler symbol)
INFERENCE_TARGETS = (("flashattn_varlen_forward", "fa_jax_varlen_forward_cpu"),
                     ("flashattn_varlen_backward", "fa_jax_varlen_backward_cpu"),
                     ("flashattn_kvcache", "fa_jax_kvcache_cpu"))


class Options(NamedTuple):
    """Everything about a call that is not a tensor: hashable, so it can be static."""

    layout: str  # "bshd" or "bhsd"
    causal: bool
    window: tuple[int, int]  # (left, right), -1 unbounded
    softcap: float  # 0: off
    scale: float | None  # None: 1/sqrt(D)
    diag_offset: int | None  # None: masks align bottom-right (Sk - Sq)
    bias_scale: float | None  # None: 1
    has_bias: bool
    has_alibi: bool
    has_segment_ids: bool
    threads: int = 0  # fa_options.threads for this call; 0: the library's default
    has_sinks: bool = False  # attention sinks [Hq] (docs/semantics.md)
    dropout_p: float = 0.0  # docs/semantics.md, "Dropout"; 0: off (its seed: an operand, seed_words)
    mask: int = 0  # the address of a library-built fa_mask (flashattn.masks), 0: none; kept alive by _attention


def _find_library() -> str:
    """Beside the libflashattn.so that flashattn loaded ($FLASHATTN_LIBDIR or the package).
    Where it is missing, the ImportError says which of the two it looked in: a build folder
    configured without the handler, or a package built without jaxlib's FFI headers."""
    path = os.path.join(os.path.dirname(_native.LIB_PATH), _LIB_NAME)
    if os.path.exists(path):
        return path
    libdir = os.environ.get("FLASHATTN_LIBDIR")
    if libdir:
        raise ImportError(
            f"flashattn.jax: {path} does not exist (from FLASHATTN_LIBDIR={libdir!r}): that build folder has "
            f"{_native.LIB_NAME} but not the JAX handler. Configure it with -DFA_JAX_FFI=ON (jaxlib installed, "
            "for its FFI headers) and build again, or unset FLASHATTN_LIBDIR to use the package's own copy.")
    raise ImportError(
        f"flashattn.jax: {path} does not exist: the package was built without jaxlib's FFI "
        "headers. Reinstall with jaxlib in the build environment (pip install . does), or "
        "point FLASHATTN_LIBDIR at a build folder configured with -DFA_JAX_FFI=ON.")


# The newest XLA FFI API version (major, minor) of a jaxlib known to accept the handlers'
# answer (python/csrc/jax_ffi_frame.h: 0.1, which jaxlib 0.5 to 0.10, FFI API 0.1 to 0.3, take)
KNOWN_FFI_API = (0, 3)


def framework_ffi_api():
    """The installed jaxlib's XLA FFI API version (major, minor), from the header it ships
    (jax.ffi.include_dir()); None where it ships none."""
    try:
        with open(os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")) as f:
            text = f.read()
    except (OSError, AttributeError):
        return None
    found = [re.search(rf"#define XLA_FFI_API_{part} (\d+)", text) for part in ("MAJOR", "MINOR")]
    return tuple(int(m.group(1)) for m in found) if all(found) else None


def handler_ffi_api(lib):
    """The XLA FFI API version (major, minor) the handlers answer XLA with; None for a handler
    library built before they said (a development build's, through FLASHATTN_LIBDIR: it
    answers its own headers' version, registered unchecked as then)."""
    fn = getattr(lib, "fa_jax_ffi_api_version", None)
    if fn is None:
        return None
    fn.restype, fn.argtypes = ctypes.c_int, []
    return divmod(fn(), 1000)


def _versions(ours, framework) -> str:
    import jaxlib
    fw = "unknown" if framework is None else "%d.%d" % framework
    return (f"jax {jax.__version__}, jaxlib {getattr(jaxlib, '__version__', '?')} (XLA FFI API {fw}); "
            f"flashattn's handlers speak XLA FFI API {'unknown' if ours is None else '%d.%d' % ours}")


_registered = False


def register() -> None:
    """Loads the handler library and registers its targets (once per process). XLA asks each
    handler for its FFI API version and refuses one it does not take; a refusal met where
    JAX sets up its CPU backend fails that backend, JAX's own computations included. So a
    jaxlib of another major FFI version is refused here (ImportError), and with a jaxlib
    newer than those known to take the handlers' version (KNOWN_FFI_API) the targets are
    registered with the CPU backend already up, where a refusal raises here."""
    global _registered
    if _registered:
        return
    # _native has loaded libflashattn.so; the handler library's NEEDED entry (the
    # library's SONAME) resolves to that copy
    lib = ctypes.CDLL(_find_library())
    ours, framework = handler_ffi_api(lib), framework_ffi_api()
    if ours is not None and framework is not None and framework[0] != ours[0]:
        raise ImportError(f"flashattn.jax does not support this jaxlib: {_versions(ours, framework)}")
    if ours is not None and (framework is None or framework > KNOWN_FFI_API):
        try:
            jax.devices("cpu")
        except RuntimeError:  # no CPU backend (JAX_PLATFORMS): nothing to register with now
            pass
    try:
        jax.ffi.register_ffi_target(FORWARD_TARGET, jax.ffi.pycapsule(lib.fa_jax_forward_cpu), platform="cpu")
        jax.ffi.register_ffi_target(BACKWARD_TARGET, jax.ffi.pycapsule(lib.fa_jax_backward_cpu), platform="cpu")
        # the inference shapes (python/csrc/jax_ffi_inference.c, flashattn.jax._inference): CPU only
        for target, symbol in INFERENCE_TARGETS:
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    except Exception as e:  # XLA's refusal (jaxlib's XlaRuntimeError or JaxRuntimeError)
        raise ImportError(f"flashattn.jax: XLA refused its handlers: {_versions(ours, framework)}: {e}") from e
    # The CUDA handlers exist in every build; they plan with the CUDA backend and report
    # "not built" from the library where it has no CUDA. jaxlib without a CUDA plugin may
    # refuse the platform name, which is harmless: no GPU call can reach them then.
    try:
        jax.ffi.register_ffi_target(FORWARD_TARGET, jax.ffi.pycapsule(lib.fa_jax_forward_cuda), platform="CUDA")
        jax.ffi.register_ffi_target(BACKWARD_TARGET, jax.ffi.pycapsule(lib.fa_jax_backward_cuda), platform="CUDA")
    except Exception:  # noqa: BLE001 - only the optional platform
        pass
    _refuse_exported_masks()
    _partition.lower_plainly_for_export()
    _registered = True


def _refuse_exported_masks() -> None:
    """jax.export of a call with a flashattn.masks mask raises ValueError: the call holds the
    mask's address (attribute "mask", a pointer into this process), so the artifact would
    read freed or foreign memory in any other process (a fresh one crashed). Judged where
    the call is lowered, the one step that knows it is for export (the trace may come from
    jit's cache): flashattn's targets go through JAX's own ffi_call lowering after this
    check, every other target straight to it. A JAX without these internals keeps its
    rule, and such an export is unchecked (docs/python.md, "jax.export")."""
    try:
        from jax._src import ffi as jffi
        from jax._src.interpreters import mlir
        base, prim, unwrap = jffi.ffi_call_lowering, jffi.ffi_call_p, jffi._unwrap_kwargs_hashable
    except (ImportError, AttributeError):
        return
    ours = {FORWARD_TARGET, BACKWARD_TARGET}

    def rule(ctx, *operands, target_name, attributes, **params):
        if target_name in ours and getattr(getattr(ctx.module_context, "lowering_parameters", None),
                                           "for_export", False) and unwrap(attributes).get("mask", 0):
            raise ValueError("flashattn: jax.export of a call with a flashattn.masks mask is not supported: the "
                             "compiled call holds the mask's address in this process, which no other process has. "
                             "Export with a boolean mask= array (or jax.nn's mask=) instead, or keep the jitted "
                             "function in this process")
        return base(ctx, *operands, target_name=target_name, attributes=attributes, **params)

    mlir.register_lowering(prim, rule)


def _diag(opt: Options):
    """The problem's diag_offset (_problem.problem_diag_offset: a mask built for the call took it)."""
    return problem_diag_offset(opt.diag_offset, opt.causal, opt.window, opt.has_alibi, took_call_offset(opt.mask))


def _attributes(opt: Options) -> dict:
    i64, f32 = np.int64, np.float32
    return dict(
        layout=i64(1 if opt.layout == "bshd" else 0),
        causal=i64(opt.causal),
        window_left=i64(opt.window[0]),
        window_right=i64(opt.window[1]),
        softcap=f32(opt.softcap),
        has_scale=i64(opt.scale is not None),
        scale=f32(0.0 if opt.scale is None else opt.scale),
        has_diag_offset=i64(_diag(opt) is not None),
        diag_offset=i64(0 if _diag(opt) is None else _diag(opt)),
        has_bias_scale=i64(opt.bias_scale is not None),
        bias_scale=f32(1.0 if opt.bias_scale is None else opt.bias_scale),
        has_bias=i64(opt.has_bias),
        has_alibi=i64(opt.has_alibi),
        has_segment_ids=i64(opt.has_segment_ids),
        threads=i64(opt.threads),
        has_sinks=i64(opt.has_sinks),
        dropout_p=f32(opt.dropout_p),
        mask=i64(opt.mask),
    )


def _extras(bias, slopes, q_seg, kv_seg, sinks=None, seed=None) -> list:
    """The optional operands, in the handler's order; seed: uint32 [4] (seed_words), given
    with dropout_p > 0."""
    return [x for x in (bias, slopes, q_seg, kv_seg, sinks, seed) if x is not None]


def _extra_names(bias, slopes, q_seg, kv_seg, sinks=None, seed=None) -> list:
    """_extras' operands' names (_partition.roles)."""
    names = ("bias", "slopes", "q_seg", "kv_seg", "sinks", "seed")
    return [n for n, x in zip(names, (bias, slopes, q_seg, kv_seg, sinks, seed)) if x is not None]


def raw_call(kind, opt, bias_grad, names, *operands):
    """The FFI call itself ("forward" or "backward") on operands (named as names), a tuple of
    its results, shaped from the operands (a shard's, when partitioned: _partition)."""
    x = dict(zip(names, operands))
    if kind == "forward":
        o_shape, lse_shape = out_shapes(opt, x["q"], x["v"])
        shapes = [jax.ShapeDtypeStruct(o_shape, x["q"].dtype), jax.ShapeDtypeStruct(lse_shape, jnp.float32)]
    else:
        shapes = [jax.ShapeDtypeStruct(x[n].shape, x[n].dtype) for n in ("q", "k", "v")]
        if bias_grad:
            shapes.append(jax.ShapeDtypeStruct(x["bias"].shape, jnp.float32))
        if "sinks" in x:
            shapes.append(jax.ShapeDtypeStruct(x["sinks"].shape, jnp.float32))
    call = jax.ffi.ffi_call(FORWARD_TARGET if kind == "forward" else BACKWARD_TARGET, tuple(shapes),
                            vmap_method="expand_dims")
    attrs = _attributes(opt)
    if kind == "backward":
        attrs["bias_grad"] = np.int64(bias_grad)
    return tuple(call(*operands, **attrs))


def out_shapes(opt: Options, q, v):
    """o's and lse's shapes: o in q's layout with v's head dim, lse [B, H, Sq]."""
    if opt.layout == "bshd":
        b, s, h, _ = q.shape
        o = (b, s, h, v.shape[-1])
    else:
        b, h, s, _ = q.shape
        o = (b, h, s, v.shape[-1])
    return o, (b, h, s)


def _varying_axes(xs) -> tuple:
    """The shard_map axes that some operand varies along (none outside shard_map, or on a JAX
    without varying-axis types)."""
    typeof = getattr(jax, "typeof", None)  # older JAX: no varying-axis types to keep
    if typeof is None:
        return ()
    axes = set()
    for x in xs:
        if x is None:
            continue
        t = typeof(x)
        m = getattr(t, "manual_axis_type", None)
        axes |= set(m.varying) if m is not None else set(getattr(t, "vma", ()) or ())
    return tuple(sorted(axes))


def _vary(x, axes):
    """x cast to vary along axes too (None stays None; a no-op cast where it already does)."""
    if x is None:
        return None
    need = tuple(a for a in axes if a not in _varying_axes([x]))
    if not need:
        return x
    cast = getattr(jax.lax, "pcast", None)
    return cast(x, need, to="varying") if cast is not None else jax.lax.pvary(x, need)


def varying_like(results, operands):
    """The results of an FFI call, typed as varying along every shard_map axis its operands
    vary along. A custom call is opaque to JAX's varying-axis types: typed invariant, its
    results made a gradient inside shard_map fail (the backward's cotangents not of the
    inputs' type) and let out_specs=P() pass one shard's value unchecked."""
    axes = _varying_axes(operands)
    if not axes:
        return results
    return type(results)(_vary(r, axes) for r in results)


def vary_together(*xs):
    """xs, each cast to vary along every shard_map axis that any of them varies along. For
    the operands of a custom_vjp: its backward's cotangents come from an FFI call
    (varying_like), so they vary along all those axes, and JAX requires each to have its
    input's type. A replicated bias or sinks (in_specs P()) beside a batch-sharded q thus
    enters the custom_vjp varying, and the cast's transpose, a psum, sums its gradient over
    the shards, as jax.nn's is (it raised "the manual axis types do not match")."""
    axes = _varying_axes(xs)
    if not axes:
        return xs
    return tuple(_vary(x, axes) for x in xs)


def _explicit(x):
    """x's sharding where it is typed (an Explicit mesh axis, jax.set_mesh), else None."""
    sh = getattr(jax.typeof(x), "sharding", None) if x is not None and hasattr(jax, "typeof") else None
    types = getattr(getattr(sh, "mesh", None), "axis_types", ())
    return sh if sh is not None and any(str(t).endswith("Explicit") for t in types) else None


def typed_like(ct, x):
    """A cotangent with its primal's type: under Explicit mesh axes the FFI calls' results are
    typed replicated, and a custom_vjp's cotangents must carry their inputs' shardings (JAX
    raised "Custom VJP bwd rule must produce an output with the same type as the args tuple"):
    resharded to them (docs/python.md, "Several devices"). Every custom_vjp of the JAX front
    returns its cotangents through this."""
    sh = None if ct is None else _explicit(x)
    if sh is None or jax.typeof(ct).sharding == sh:
        return ct
    return jax.sharding.reshard(ct, sh)


@jax.custom_jvp
def not_differentiable(xs):
    """xs as they are (no op in the program), before every FFI call (_partition.call_plain).
    The fronts' custom_vjp rules never differentiate their calls; a gradient of a gradient
    does (the inner gradient's calls, forward and backward, differentiated), and then this
    raises in flashattn's words, not JAX's "Differentiation rule for 'custom_partitioning'
    not implemented"."""
    return xs


@not_differentiable.defjvp
def _not_differentiable_jvp(primals, tangents):
    raise NotImplementedError("flashattn's attention calls are not differentiable themselves: a gradient of a "
                              "gradient (grad of grad, a gradient penalty) through flashattn's attention is not "
                              "supported (the gradient itself is: jax.grad, jax.vjp)")


def forward(opt: Options, q, k, v, bias, slopes, q_seg, kv_seg, sinks=None, seed=None):
    """(o, lse) from the forward handler."""
    register()
    operands = (q, k, v, *_extras(bias, slopes, q_seg, kv_seg, sinks, seed))
    names = ["q", "k", "v", *_extra_names(bias, slopes, q_seg, kv_seg, sinks, seed)]
    res = _partition.call("forward", opt, False, names, ["o", "lse"], operands)
    return varying_like(res, operands)


def backward(opt: Options, bias_grad: bool, q, k, v, o, lse, do, bias, slopes, q_seg, kv_seg, sinks=None, seed=None):
    """(dq, dk, dv, dbias or None, dsink or None) from the backward handler."""
    register()
    operands = (q, k, v, o, lse, do, *_extras(bias, slopes, q_seg, kv_seg, sinks, seed))
    names = ["q", "k", "v", "o", "lse", "do", *_extra_names(bias, slopes, q_seg, kv_seg, sinks, seed)]
    outs_named = ["dq", "dk", "dv"] + ["dbias"] * bool(bias_grad) + ["dsink"] * (sinks is not None)
    outs = varying_like(_partition.call("backward", opt, bias_grad, names, outs_named, operands), operands)
    return (*outs[:3], outs[3] if bias_grad else None, outs[-1] if sinks is not None else None)
