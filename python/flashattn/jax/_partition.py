"""The FFI calls under plain jit with sharded inputs: split along batch and heads (packed
batches and paged caches: heads).

A custom call is opaque to XLA's partitioner, which therefore gathered every operand onto
each device and ran the whole problem there (every device all of the work, the output
replicated). Each call now goes through jax.experimental.custom_partitioning: where q is
sharded along its batch or heads dimension, every operand that has that dimension is
split the same way and each device runs its own slice of the problem, since attention is
independent per (batch, head); the other dimensions (sequences, head dims) are gathered,
as before. Results are bit-identical to the unsharded call: each (batch, head) runs the
same schedule over the same keys.

Heads are split only where both Hq and Hk divide by the shards (a shard of query heads then
holds exactly its kv heads' groups). A dimension stays whole where its slices would change
the answer: with dropout (its keep mask is drawn at each (b, h)'s global index, which a
slice does not know) and, for a block-sparse mask, along a dimension it is not broadcast
over (the library mask is built for the whole problem). The backward's dbias and dsink sum
over the batch (and dbias over the heads where the bias is broadcast over them): their
per-device parts are summed across the shards (psum).

Under Explicit mesh axes, where q's type is split along batch or heads, the call runs in
shard_map over the same split instead (_explicit_call): custom_partitioning's results are
typed replicated there, which made XLA gather them.

vmap goes to the plain call (custom_vmap: the partitioned one has no batching rule), as do
calls inside shard_map, which already run per shard (_ffi.varying_like), and a call lowered
for jax.export: the partitioning is a callback into this process, which an exported artifact
cannot hold (JAX raises "serialization of host_callbacks is not yet implemented"), so there
the call lowers as the plain one and XLA gathers its operands, as before partitioning.
"""
import ctypes
import math

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

# The dimensions' roles: b batch, h query heads, g kv heads, s query rows, t keys, d head
# dim, e value head dim; None: a dimension of its own (broadcast, or the seed's words).
_LAYOUT = {"bshd": ("b", "s", "h"), "bhsd": ("b", "h", "s")}


def _tensor(layout, heads, seq, dim):
    b, x, y = _LAYOUT[layout]
    roles = {"b": "b", "s": seq, "h": heads}
    return (roles[b], roles[x], roles[y], dim)


def roles(opt):
    """Per operand name, its dimensions' roles (see above)."""
    q = _tensor(opt.layout, "h", "s", "d")
    return {"q": q, "k": _tensor(opt.layout, "g", "t", "d"), "v": _tensor(opt.layout, "g", "t", "e"),
            "o": _tensor(opt.layout, "h", "s", "e"), "do": _tensor(opt.layout, "h", "s", "e"), "lse": ("b", "h", "s"),
            "dq": q, "dk": _tensor(opt.layout, "g", "t", "d"), "dv": _tensor(opt.layout, "g", "t", "e"),
            "bias": ("b", "h", "s", "t"), "dbias": ("b", "h", "s", "t"), "slopes": ("h",), "q_seg": ("b", "s"),
            "kv_seg": ("b", "t"), "sinks": ("h",), "dsink": ("h",), "seed": (None,)}


def _sizes(roles_of, shapes):
    """The full size of each role, from the operands that have it (q, k, v always do)."""
    sizes = {}
    for r, shape in zip(roles_of, shapes):
        for role, n in zip(r, shape):
            if role is not None and role not in sizes and role in "bhgstde":
                sizes[role] = n
    return sizes


def _full(role, n, sizes):
    """The role a dimension of size n plays: its own where it is broadcast (size 1 under a
    larger full size) or has no role."""
    return role if role is not None and sizes.get(role) == n else None


def _axes_size(mesh, axes):
    if axes is None:
        return 1
    names = (axes,) if isinstance(axes, str) else tuple(axes)
    return math.prod(mesh.shape[a] for a in names)


def _names(axes):
    return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)


def _mask_dims(ptr):
    """(batch, heads) of the library mask at ptr (1: broadcast over that dimension)."""
    from .._mask_native import MaskShape, lib
    s = MaskShape()
    lib.fa_mask_get_shape(ctypes.c_void_p(ptr), ctypes.byref(s))
    return s.batch, s.heads


def _split(mesh, q_spec, q_roles, sizes, whole, mask):
    """The mesh axes the batch and the heads are split over (None: whole), from q's sharding.
    whole: True (nothing splits) or the roles that stay whole."""
    if whole is True:
        return None, None
    spec = tuple(q_spec) + (None,) * (len(q_roles) - len(tuple(q_spec)))
    pick = {role: spec[i] for i, role in enumerate(q_roles) if role in ("b", "h") and role not in (whole or ())}
    mb, mh = _mask_dims(mask) if mask else (1, 1)
    bax, hax = pick.get("b"), pick.get("h")
    nb, nh = _axes_size(mesh, bax), _axes_size(mesh, hax)
    if bax is None or nb == 1 or sizes["b"] % nb or mb != 1:
        bax = None
    if hax is None or nh == 1 or sizes["h"] % nh or sizes["g"] % nh or mh != 1 or set(_names(hax)) & set(_names(bax)):
        hax = None
    return bax, hax


def _spec(r, shape, sizes, bax, hax):
    parts = []
    for role, n in zip(r, shape):
        role = _full(role, n, sizes)
        parts.append(bax if role == "b" else hax if role in ("h", "g") else None)
    return PartitionSpec(*parts)


def _rule(in_roles, in_shapes, out_roles, out_shapes, sizes):
    """The Shardy rule: one factor per role (by its full size), one of its own for every
    other dimension."""
    own = iter("ijklmnopqruvwxyzACDEFGHIJKLMNOPQRSTUVWXYZ")  # no role's letter among them

    def value(r, shape):
        return " ".join(_full(role, n, sizes) or next(own) for role, n in zip(r, shape))
    ins = ", ".join(value(r, s) for r, s in zip(in_roles, in_shapes))
    outs = ", ".join(value(r, s) for r, s in zip(out_roles, out_shapes))
    return f"{ins} -> {outs}"


_CACHE = {}


# A packed batch's operands (_inference.py): no batch dimension, so only the heads split;
# rows s and keys t are the packed totals, cu_seqlens whole on every device.
VARLEN_ROLES = {"q": ("s", "h", "d"), "k": ("t", "g", "d"), "v": ("t", "g", "e"), "o": ("s", "h", "e"),
                "do": ("s", "h", "e"), "lse": ("h", "s"), "dq": ("s", "h", "d"), "dk": ("t", "g", "d"),
                "dv": ("t", "g", "e"), "cu_q": (None,), "cu_k": (None,), "slopes": ("h",), "sinks": ("h",),
                "dsink": ("h",), "seed": (None,)}


def kvcache_roles(paged, names):
    """A decode call's operands (_inference.kvcache_attention), results and updated caches: a
    dense cache [B, S, Hk, D] splits along batch and kv heads, a paged one [pages, page_size,
    Hk, D] along kv heads only (its pages are every batch item's); a shared prefix [P, Hk, D]
    along kv heads; the new tokens and lengths along batch."""
    cache = (None, None, "g") if paged else ("b", "t", "g")
    r = {"q": ("b", "s", "h", "d"), "k_cache": cache + ("d",), "v_cache": cache + ("e",), "lens": ("b",),
         "k": ("b", "s", "g", "d"), "v": ("b", "s", "g", "e"), "table": ("b", None), "slopes": ("h",),
         "sinks": ("h",), "k_scale": cache, "v_scale": cache, "k_prefix": (None, "g", "d"),
         "v_prefix": (None, "g", "e"), "o": ("b", "s", "h", "e"), "lse": ("b", "h", "s")}
    return {n: r[n] for n in names}


def call(kind, opt, bias_grad, in_names, out_names, operands):
    """_ffi.raw_call(kind, ...) on operands, through custom_partitioning along batch and heads
    (call_plain)."""
    from ._ffi import raw_call

    def plain(*xs):
        return raw_call(kind, opt, bias_grad, in_names, *xs)
    return call_plain(plain, roles(opt), (kind, opt, bool(bias_grad)), in_names, out_names, operands,
                      whole=opt.dropout_p > 0, mask=opt.mask)


def call_plain(plain, role_of, key, in_names, out_names, operands, *, whole=False, mask=0):
    """plain(*operands) (an FFI call whose results are shaped from its operands) through
    custom_partitioning along batch and heads, the dimensions' roles role_of[name]; the plain
    call inside shard_map, and under vmap (custom_vmap). key: what else plain depends on.
    whole: True, no split (dropout), or the roles that stay whole ("b" for a paged cache,
    which every batch item writes); mask: the library mask's address (0: none)."""
    from ._ffi import _varying_axes, not_differentiable
    operands = not_differentiable(tuple(operands))  # a gradient of a gradient: refused in our words
    if _varying_axes(operands):  # inside shard_map: each shard is its own call already
        return plain(*operands)
    typed = _explicit_call(plain, role_of, in_names, out_names, operands, whole, mask)
    if typed is not None:
        return _typed_as_operands(typed, role_of, in_names, out_names, operands)
    key = (key, tuple(in_names), tuple(out_names), tuple((tuple(x.shape), str(x.dtype)) for x in operands))
    fn = _CACHE.get(key)
    if fn is None:
        shapes = jax.eval_shape(plain, *operands)
        fn = _partitioned(plain, role_of, in_names, out_names, [tuple(x.shape) for x in operands],
                          [tuple(s.shape) for s in shapes], whole, mask)
        if len(_CACHE) > 256:
            _CACHE.clear()
        _CACHE[key] = fn
    return _typed_as_operands(fn(*operands), role_of, in_names, out_names, operands)


def _typed_as_operands(results, r, in_names, out_names, operands):
    """Under Explicit mesh axes, the results typed as the operands are: an updated cache as
    the cache it updates, every other result split along its batch, heads and query rows as
    q's type splits them (the kv heads as the query heads, where they divide). A call that is
    not split (dropout, a size-1 mesh axis, heads that do not divide, a paged cache) had its
    results typed unsplit, so a lax.scan carrying them failed on the carry's type; one that
    is split had them typed split along batch and heads only. A no-op where the types agree
    already (where q is not typed, or not split)."""
    from ._ffi import _explicit
    sh = _explicit(operands[0])
    if sh is None or not any(a is not None for a in sh.spec):
        return results
    q_roles = r[in_names[0]]
    spec = tuple(sh.spec) + (None,) * (len(q_roles) - len(tuple(sh.spec)))
    axes = {role: a for role, a in zip(q_roles, spec) if role in ("b", "h", "s") and a is not None}
    sizes = _sizes([r[n] for n in in_names], [tuple(x.shape) for x in operands])
    if "h" in axes and sizes.get("g", 0) % _axes_size(sh.mesh, axes["h"]) == 0:
        axes["g"] = axes["h"]
    out = []
    for name, y in zip(out_names, results):
        target = _explicit(operands[in_names.index(name)]) if name in in_names else None
        if target is None:
            target = NamedSharding(sh.mesh, PartitionSpec(*(axes.get(_full(role, n, sizes))
                                                            for role, n in zip(r[name], y.shape))))
        out.append(y if jax.typeof(y).sharding == target else jax.sharding.reshard(y, target))
    return type(results)(out)


def _explicit_call(plain, r, in_names, out_names, operands, whole, mask):
    """Under Explicit mesh axes (jax.make_mesh's default), q typed as split along batch or
    heads: the plain call in shard_map over the same split, so that its results are typed
    split as jax.nn's are. custom_partitioning splits the work there too, but its results are typed
    replicated, and XLA then gathered every output (each layer's o onto every device). None
    where q is not typed or not split along batch or heads (the partitioned call, as before)."""
    from ._ffi import _explicit, varying_like
    sh = _explicit(operands[0])
    if sh is None:
        return None
    in_roles, out_roles = [r[n] for n in in_names], [r[n] for n in out_names]
    in_shapes = [tuple(x.shape) for x in operands]
    sizes = _sizes(in_roles, in_shapes)
    bax, hax = _split(sh.mesh, sh.spec, in_roles[0], sizes, whole, mask)
    if bax is None and hax is None:
        return None
    out_shapes = [tuple(s.shape) for s in jax.eval_shape(plain, *operands)]
    in_specs = tuple(_spec(ro, s, sizes, bax, hax) for ro, s in zip(in_roles, in_shapes))
    out_specs = tuple(_spec(ro, s, sizes, bax, hax) for ro, s in zip(out_roles, out_shapes))
    sums = _sum_axes(out_roles, out_shapes, sizes, bax, hax)

    def body(*xs):
        res = varying_like(plain(*xs), xs)
        return tuple(jax.lax.psum(y, axes) if axes else y for y, axes in zip(res, sums))
    xs = tuple(jax.sharding.reshard(x, NamedSharding(sh.mesh, s)) for x, s in zip(operands, in_specs))
    return jax.shard_map(body, mesh=sh.mesh, in_specs=in_specs, out_specs=out_specs)(*xs)


def _sum_axes(out_roles, out_shapes, sizes, bax, hax):
    """Per result, the mesh axes its shards' parts are summed over: those of the batch (or
    heads) where it has no full batch (or heads) dimension (dbias over a broadcast batch,
    dsink over the batch)."""
    sums = []
    for ro, s in zip(out_roles, out_shapes):
        full = {_full(role, n, sizes) for role, n in zip(ro, s)}
        sums.append(_names(bax) * ("b" not in full) + _names(hax) * ("h" not in full and "g" not in full))
    return sums


def _partitioned(plain, r, in_names, out_names, in_shapes, out_shapes, whole, mask):
    in_roles, out_roles = [r[n] for n in in_names], [r[n] for n in out_names]
    sizes = _sizes(in_roles, in_shapes)

    def decide(mesh, arg_shapes):
        q_spec = getattr(arg_shapes[0].sharding, "spec", PartitionSpec())
        bax, hax = _split(mesh, q_spec, in_roles[0], sizes, whole, mask)
        args = tuple(NamedSharding(mesh, _spec(ro, s, sizes, bax, hax)) for ro, s in zip(in_roles, in_shapes))
        outs = tuple(NamedSharding(mesh, _spec(ro, s, sizes, bax, hax)) for ro, s in zip(out_roles, out_shapes))
        return bax, hax, args, outs

    def infer(mesh, arg_shapes, result_shape):
        return decide(mesh, arg_shapes)[3]

    def partition(mesh, arg_shapes, result_shape):
        bax, hax, args, outs = decide(mesh, arg_shapes)
        sums = _sum_axes(out_roles, out_shapes, sizes, bax, hax)

        def lower(*xs):
            res = plain(*xs)
            return tuple(jax.lax.psum(y, axes) if axes else y for y, axes in zip(res, sums))
        return mesh, lower, outs, args

    part = custom_partitioning(lambda *xs: plain(*xs))
    partition.flashattn = True  # ours: lowered plainly for export (lower_plainly_for_export)
    part.def_partition(infer_sharding_from_operands=infer, partition=partition,
                       sharding_rule=_rule(in_roles, in_shapes, out_roles, out_shapes, sizes))

    vm = jax.custom_batching.custom_vmap(lambda *xs: part(*xs))

    @vm.def_vmap
    def _batched(axis_size, in_batched, *xs):
        out = jax.vmap(plain, in_axes=tuple(0 if b else None for b in in_batched), axis_size=axis_size)(*xs)
        return out, tuple(True for _ in out)

    return vm


def lower_plainly_for_export():
    """Installed once (_ffi.register): flashattn's custom_partitioning calls, lowered for
    jax.export, lower as their body (the plain FFI call), as JAX lowers any of them on one
    device; every other call, and ours outside export, goes to JAX's own rule. A JAX without
    these internals keeps its rule, and such an export fails as JAX says (docs/python.md,
    "Several devices")."""
    try:
        from jax._src import core
        from jax._src import custom_partitioning as jcp
        from jax._src.interpreters import mlir
        base, prim = jcp._custom_partitioning_lowering_rule, jcp.custom_partitioning_p
    except (ImportError, AttributeError):
        return

    def rule(ctx, *values, call, partition, **params):
        if getattr(partition, "flashattn", False) and getattr(
                getattr(ctx.module_context, "lowering_parameters", None), "for_export", False):
            return mlir.lower_fun(core.jaxpr_as_fun(call), multiple_results=True)(ctx, *values)
        return base(ctx, *values, call=call, partition=partition, **params)

    mlir.register_lowering(prim, rule)
