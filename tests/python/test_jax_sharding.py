"""flashattn.jax inside shard_map (two host devices, in a subprocess: the device count is
fixed when JAX starts). The FFI calls' results vary along the manual axes their operands
vary along: gradients inside shard_map equal the unsharded ones (they once failed on the
cotangents' types), and out_specs=P() without a psum is refused as jax.nn's is (it once
returned one shard's value). A replicated bias or sinks gets its gradient summed over the
shards, shard_map runs without jit, and the documented dropout recipe draws per-shard masks.
Seeded by the run's seed (conftest.py)."""
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import SEED

pytest.importorskip("jax")

SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax, jax.numpy as jnp, numpy as np
    import flashattn.jax as fj
    from jax.sharding import NamedSharding, PartitionSpec as P
    from jax import shard_map
    mesh = jax.make_mesh((2,), ("b",))
    rng = np.random.default_rng(int(sys.argv[1]))
    q, k, v = (jnp.asarray(rng.standard_normal((4, 32, 2, 16)), jnp.float32) for _ in range(3))
    sh = NamedSharding(mesh, P("b"))
    qs, ks, vs = (jax.device_put(x, sh) for x in (q, k, v))
    grad = lambda att: lambda q, k, v: jax.grad(lambda *a: (att(*a) ** 2).sum(), argnums=(0, 1, 2))(q, k, v)
    for name, att in (("attention", lambda q, k, v: fj.attention(q, k, v, causal=True)),
                      ("dot_product_attention", lambda q, k, v: fj.dot_product_attention(q, k, v, is_causal=True))):
        want = grad(att)(q, k, v)
        got = jax.jit(shard_map(grad(att), mesh=mesh, in_specs=(P("b"),) * 3, out_specs=(P("b"),) * 3))(qs, ks, vs)
        err = max(float(jnp.abs(a - b).max() / jnp.abs(b).max()) for a, b in zip(got, want))
        assert err < 1e-5, (name, err)
        try:
            jax.jit(shard_map(lambda q, k, v: att(q, k, v).sum(), mesh=mesh, in_specs=(P("b"),) * 3,
                              out_specs=P()))(qs, ks, vs)
        except ValueError as e:
            assert "out_specs" in str(e), str(e)
        else:
            raise AssertionError(name + ": out_specs=P() without a psum was not refused")
    # packed batches: one sequence per device, the gradient under shard_map
    cu = jnp.asarray([0, 32], jnp.int32)
    f = lambda q, k, v: jax.grad(lambda q: (fj.varlen_attention(q[0], k[0], v[0], cu, cu, causal=True) ** 2).sum())(q)
    qp, kp, vp = (jnp.asarray(rng.standard_normal((2, 32, 2, 16)), jnp.float32) for _ in range(3))
    g = jax.jit(shard_map(f, mesh=mesh, in_specs=(P("b"),) * 3, out_specs=P("b")))(
        *(jax.device_put(x, sh) for x in (qp, kp, vp)))
    w = jnp.concatenate([f(qp[i:i + 1], kp[i:i + 1], vp[i:i + 1]) for i in range(2)])
    assert float(jnp.abs(g - w).max()) <= 1e-5 * float(jnp.abs(w).max()), "varlen"
    print("ok")
""")


# A replicated differentiable operand (in_specs P()) beside a batch-sharded q: its gradient
# is the sum over the shards, as jax.nn's (the custom_vjp's cotangent varied along the axis
# and JAX raised "the manual axis types do not match"); and shard_map without jit (the
# custom_vjp's symbolic_zeros raised NotImplementedError in an eager shard_map, even forward
# only). References: jax.nn.dot_product_attention (bias) and float64 numpy (sinks).
REPLICATED = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax, jax.numpy as jnp, numpy as np
    import flashattn.jax as fj
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from jax import shard_map
    mesh = Mesh(np.array(jax.devices()), ("b",))
    rng = np.random.default_rng(int(sys.argv[1]))
    B, S, H, D = 4, 16, 2, 16
    q, k, v = (jnp.asarray(rng.standard_normal((B, S, H, D)), jnp.float32) for _ in range(3))
    sinks = jnp.asarray(rng.standard_normal(H), jnp.float32)
    bias = jnp.asarray(rng.standard_normal((1, H, 1, S)), jnp.float32)
    sh = NamedSharding(mesh, P("b"))
    qs, ks, vs = (jax.device_put(x, sh) for x in (q, k, v))

    def sinks_ref(q, k, v, sinks):
        # float64: o and d(sum o^2)/d sinks, causal; d o_i / d sink = -psink_i o_i
        q, k, v, sinks = (np.asarray(x, np.float64) for x in (q, k, v, sinks))
        s = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(q.shape[-1])
        s = np.where(np.tril(np.ones((q.shape[1], k.shape[1]), bool)), s, -np.inf)
        sk = np.broadcast_to(sinks[None, :, None, None], s.shape[:3] + (1,))
        m = np.maximum(s.max(-1, keepdims=True), sk)
        e, es = np.exp(s - m), np.exp(sk - m)
        z = e.sum(-1, keepdims=True) + es
        o = np.einsum("bhij,bjhd->bihd", e / z, v)
        psink = (es / z)[..., 0]  # [B, H, Sq]
        return o, -np.einsum("bhi,bihd->h", psink, 2 * o * o)

    def check(name, got, want, tol):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        err = float(np.abs(got - want).max() / np.abs(want).max())
        assert err < tol, (name, err)

    specs = (P("b"),) * 3 + (P(),)
    if sys.argv[2] == "eager_forward":  # shard_map without jit, forward only
        o = shard_map(lambda q, k, v, s: fj.attention(q, k, v, causal=True, sinks=s), mesh=mesh, in_specs=specs,
                      out_specs=P("b"))(qs, ks, vs, sinks)
        check("eager o", o, sinks_ref(q, k, v, sinks)[0], 1e-5)
        o = shard_map(lambda q, k, v: fj.dot_product_attention(q, k, v, is_causal=True), mesh=mesh,
                      in_specs=specs[:3], out_specs=P("b"))(qs, ks, vs)
        check("eager drop-in o", o, jax.nn.dot_product_attention(q, k, v, is_causal=True), 1e-5)
        cu = jnp.asarray([0, S], jnp.int32)
        o = shard_map(lambda q, k, v: fj.varlen_attention(q[0], k[0], v[0], cu, cu)[None], mesh=mesh,
                      in_specs=specs[:3], out_specs=P("b"))(qs[:2], ks[:2], vs[:2])
        check("eager varlen o", o, jax.nn.dot_product_attention(q[:2], k[:2], v[:2]), 1e-5)
        print("ok")
        sys.exit(0)
    for jit in (False, True):
        wrap = jax.jit if jit else (lambda f: f)
        # sinks: attention and varlen_attention (one sequence per device)
        att = lambda q, k, v, s: fj.attention(q, k, v, causal=True, sinks=s)
        loss = lambda q, k, v, s: jax.lax.psum((att(q, k, v, s) ** 2).sum(), "b")
        g = wrap(jax.grad(shard_map(loss, mesh=mesh, in_specs=specs, out_specs=P()), argnums=3))(qs, ks, vs, sinks)
        o_ref, g_ref = sinks_ref(q, k, v, sinks)
        check(f"dsinks jit={jit}", g, g_ref, 1e-5)
        o = wrap(shard_map(att, mesh=mesh, in_specs=specs, out_specs=P("b")))(qs, ks, vs, sinks)
        check(f"o sinks jit={jit}", o, o_ref, 1e-5)
        cu = jnp.asarray([0, S], jnp.int32)
        vl = lambda q, k, v, s: fj.varlen_attention(q[0], k[0], v[0], cu, cu, causal=True, sinks=s)[None]
        vloss = lambda q, k, v, s: jax.lax.psum((vl(q, k, v, s) ** 2).sum(), "b")
        g = wrap(jax.grad(shard_map(vloss, mesh=mesh, in_specs=specs, out_specs=P()), argnums=3))(
            qs[:2], ks[:2], vs[:2], sinks)
        check(f"varlen dsinks jit={jit}", g, sinks_ref(q[:2], k[:2], v[:2], sinks)[1], 1e-5)
        o = wrap(shard_map(vl, mesh=mesh, in_specs=specs, out_specs=P("b")))(qs[:2], ks[:2], vs[:2], sinks)
        check(f"varlen o jit={jit}", o, o_ref[:2], 1e-5)
        # bias [1, H, 1, S]: attention and the jax.nn drop-in, against jax.nn unsharded
        want_o = jax.nn.dot_product_attention(q, k, v, bias=bias, is_causal=True)
        want_g = jax.grad(lambda b: (jax.nn.dot_product_attention(q, k, v, bias=b, is_causal=True) ** 2).sum())(bias)
        for fname, f in (("attention", lambda q, k, v, b: fj.attention(q, k, v, causal=True, bias=b)),
                         ("dot_product_attention",
                          lambda q, k, v, b: fj.dot_product_attention(q, k, v, bias=b, is_causal=True))):
            loss = lambda q, k, v, b: jax.lax.psum((f(q, k, v, b) ** 2).sum(), "b")
            g = wrap(jax.grad(shard_map(loss, mesh=mesh, in_specs=specs, out_specs=P()), argnums=(0, 3)))(
                qs, ks, vs, bias)
            check(f"{fname} dbias jit={jit}", g[1], want_g, 1e-5)
            check(f"{fname} dq jit={jit}", g[0],
                  jax.grad(lambda q: (jax.nn.dot_product_attention(q, k, v, bias=bias, is_causal=True) ** 2).sum())(q),
                  1e-5)
            o = wrap(shard_map(f, mesh=mesh, in_specs=specs, out_specs=P("b")))(qs, ks, vs, bias)
            check(f"{fname} o jit={jit}", o, want_o, 1e-5)
    print("ok")
""")

# Dropout inside shard_map: each shard draws the masks of its local batch indices, so without
# more every shard drew the same masks. The documented recipe (docs/python.md, "Several
# devices") folds the shard's index into the seed: each shard then draws its own masks,
# checked against a float64 reference built from flashattn.dropout_keep_mask, forward and dv,
# eager and jitted.
DROPOUT = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax, jax.numpy as jnp, numpy as np
    import flashattn, flashattn.jax as fj
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from jax import shard_map
    mesh = Mesh(np.array(jax.devices()), ("b",))
    rng = np.random.default_rng(int(sys.argv[1]))
    B, S, H, D, p = 4, 16, 2, 8, 0.5
    q, k, v, w = (jnp.asarray(rng.standard_normal((B, S, H, D)), jnp.float32) for _ in range(4))
    key = jax.random.key(int(rng.integers(1 << 62)))
    sh = NamedSharding(mesh, P("b"))
    qs, ks, vs, ws = (jax.device_put(x, sh) for x in (q, k, v, w))

    def att(q, k, v):  # the recipe
        return fj.attention(q, k, v, dropout_p=p, seed=jax.random.fold_in(key, jax.lax.axis_index("b")))

    def loss(q, k, v, w):
        return jax.lax.psum((att(q, k, v) * w).sum(), "b")

    # the float64 reference: shard r's seed is fold_in(key, r), its items local indices 0, 1
    keep = np.zeros((B, H, S, S), bool)
    for r in range(2):
        lo, hi = (int(x) for x in np.asarray(jax.random.key_data(jax.random.fold_in(key, r))))
        for bl in range(2):
            for h in range(H):
                keep[2 * r + bl, h] = flashattn.dropout_keep_mask(p, lo | hi << 32, bl, h, S, S)
    q64, k64, v64, w64 = (np.asarray(x, np.float64) for x in (q, k, v, w))
    s = np.einsum("bihd,bjhd->bhij", q64, k64) / np.sqrt(D)
    pr = np.exp(s - s.max(-1, keepdims=True))
    pd = pr / pr.sum(-1, keepdims=True) * keep / (1 - p)
    o_ref = np.einsum("bhij,bjhd->bihd", pd, v64)
    dv_ref = np.einsum("bhij,bihd->bjhd", pd, w64)
    assert not (keep[:2] == keep[2:]).all(), "the shards' masks agree"
    for jit in (False, True):
        wrap = jax.jit if jit else (lambda f: f)
        o = np.asarray(wrap(shard_map(att, mesh=mesh, in_specs=(P("b"),) * 3, out_specs=P("b")))(qs, ks, vs))
        assert np.abs(o - o_ref).max() < 1e-5 * np.abs(o_ref).max(), ("o", jit)
        dv = np.asarray(wrap(jax.grad(shard_map(loss, mesh=mesh, in_specs=(P("b"),) * 4, out_specs=P()),
                                      argnums=2))(qs, ks, vs, ws))
        assert np.abs(dv - dv_ref).max() < 1e-5 * np.abs(dv_ref).max(), ("dv", jit)
    print("ok")
""")


def _run(script, *args):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    r = subprocess.run([sys.executable, "-c", script, str(SEED), *args], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), f"seed {SEED}:\n{r.stdout}\n{r.stderr[-3000:]}"


def test_shard_map_gradients_and_varying_results():
    _run(SCRIPT)


def test_shard_map_without_jit():
    _run(REPLICATED, "eager_forward")


def test_shard_map_replicated_bias_and_sinks():
    _run(REPLICATED, "gradients")


def test_shard_map_dropout_recipe_draws_per_shard_masks():
    _run(DROPOUT)


# Plain jit with sharded inputs (no shard_map): the FFI calls are partitioned along batch and
# heads (_partition.py, custom_partitioning). Before, XLA gathered every operand onto each
# device (an all-gather in the compiled program) and ran the whole problem there, the output
# replicated. Now: the output keeps q's batch / heads sharding, the compiled program gathers
# nothing for a plain call, o, lse, dq, dk and dv are bit-identical to the unsharded call's,
# and dbias (over a broadcast batch) and dsink, the shards' parts summed, equal it to
# rounding. GQA
# heads split where Hq and Hk both divide; dropout stays whole (its keep mask is drawn at
# global indices) and equals the unsharded call's; a block-sparse mask broadcast over the
# batch splits along it; a packed batch splits along its heads, a kv cache along batch and
# heads (paged: heads); vmap of the jitted function still runs.
JIT_SHARDED = textwrap.dedent("""
    import os, sys, warnings
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax, jax.numpy as jnp, numpy as np
    import flashattn.jax as fj
    from flashattn import masks
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((2,), ("x",))
    rng = np.random.default_rng(int(sys.argv[1]))
    B, S, Hq, Hk, D = 4, 48, 4, 2, 16
    q = jnp.asarray(rng.standard_normal((B, S, Hq, D)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((B, S, Hk, D)), jnp.float32) for _ in range(2))
    bias = jnp.asarray(rng.standard_normal((1, Hq, S, S)), jnp.float32)
    sinks = jnp.asarray(rng.standard_normal((Hq,)), jnp.float32)

    def put(spec, *xs):
        return [jax.device_put(x, NamedSharding(mesh, spec)) for x in xs]

    def same(got, want, what):
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert a.shape == b.shape and bool(jnp.array_equal(a, b)), (what, float(jnp.abs(a - b).max()))

    def fwd(q, k, v, bias, sinks):
        return fj.attention(q, k, v, causal=True, bias=bias, sinks=sinks, return_lse=True)

    def grads(q, k, v, bias, sinks):
        return jax.grad(lambda *a: (fwd(*a)[0] ** 2).sum(), argnums=(0, 1, 2, 3, 4))(q, k, v, bias, sinks)

    for spec, axis in ((P("x"), 0), (P(None, None, "x"), 2)):  # batch, then heads (GQA: 4 and 2 heads)
        qs, ks, vs = put(spec, q, k, v)
        f = jax.jit(fwd)
        o, lse = f(qs, ks, vs, bias, sinks)
        assert o.sharding.spec[axis] == "x", (spec, o.sharding)
        text = f.lower(qs, ks, vs, bias, sinks).compile().as_text()
        assert "all-gather" not in text, (spec, "the forward gathered its operands")
        same((o, lse), fwd(q, k, v, bias, sinks), ("forward", spec))
        g = jax.jit(grads)(qs, ks, vs, bias, sinks)
        assert g[0].sharding.spec[axis] == "x", (spec, g[0].sharding)
        want = grads(q, k, v, bias, sinks)
        same(g[:3], want[:3], ("dq, dk, dv", spec))
        for a, b, name in zip(g[3:], want[3:], ("dbias", "dsink")):  # the shards' parts summed: another order
            assert float(jnp.abs(a - b).max()) <= 1e-6 * float(jnp.abs(b).max()), (name, spec)
    # dropout: whole on each device (the keep mask's global indices), equal to the unsharded call
    qs, ks, vs = put(P("x"), q, k, v)
    drop = lambda q, k, v: fj.attention(q, k, v, dropout_p=0.2, seed=7)
    same(jax.jit(drop)(qs, ks, vs), drop(q, k, v), "dropout")
    # a block-sparse mask broadcast over the batch: split along it
    m = masks.chunked(16)
    fm = jax.jit(lambda q, k, v: fj.attention(q, k, v, mask=m))
    om = fm(qs, ks, vs)
    assert om.sharding.spec[0] == "x", om.sharding
    same(om, fj.attention(q, k, v, mask=m), "mask")
    # jax.export of a sharded call: lowered as the plain call (the partitioning is a callback
    # into this process, which JAX cannot serialize: it raised "serialization of host_callbacks")
    from jax import export
    targets = ("flashattn_forward", "flashattn_backward")
    ex = export.export(jax.jit(lambda q, k, v: fj.attention(q, k, v, causal=True)),
                       disabled_checks=[export.DisabledSafetyCheck.custom_call(t) for t in targets])(qs, ks, vs)
    same(ex.call(qs, ks, vs), fj.attention(q, k, v, causal=True), "export")
    # Explicit mesh axes (jax.set_mesh): the gradient has its inputs' types (JAX raised "Custom
    # VJP bwd rule must produce an output with the same type"); the results are typed split
    # along batch or heads as q is, as jax.nn's are, with nothing gathered (they were typed
    # replicated: every layer's o gathered onto every device); dbias and dsink the shards'
    # parts summed; jax.nn's drop-in too (its GQA fill of empty rows repeated along the
    # sharded heads: jnp.repeat raised "Please pass sharding to `jnp.repeat`")
    from jax.sharding import AxisType
    emesh = jax.make_mesh((2,), ("x",), axis_types=(AxisType.Explicit,))
    want_f, want_g = fwd(q, k, v, bias, sinks), grads(q, k, v, bias, sinks)
    nn_mask = jnp.asarray(rng.random((B, 1, S, S)) < 0.05)  # rows with no visible key among them
    nn = lambda q, k, v: fj.dot_product_attention(q, k, v, mask=nn_mask)
    for spec, axis in ((P("x"), 0), (P(None, None, "x"), 2)):
        with jax.set_mesh(emesh):
            qe, ke, ve = (jax.device_put(x, spec) for x in (q, k, v))
            fe = jax.jit(fwd)
            oe, lse_e = fe(qe, ke, ve, bias, sinks)
            assert jax.typeof(oe).sharding.spec[axis] == "x", jax.typeof(oe)
            assert jax.typeof(lse_e).sharding.spec[1 if axis == 2 else 0] == "x", jax.typeof(lse_e)
            assert "all-gather" not in fe.lower(qe, ke, ve, bias, sinks).compile().as_text(), ("explicit", spec)
            ge5 = jax.jit(grads)(qe, ke, ve, bias, sinks)
            assert all(jax.typeof(a).sharding.spec[axis] == "x" for a in ge5[:3]), [jax.typeof(a) for a in ge5]
            one = jax.jit(nn)(qe, ke, ve)
            assert jax.typeof(one).sharding.spec[axis] == "x", jax.typeof(one)
        same((oe, lse_e), want_f, ("explicit axes: forward", spec))
        same(ge5[:3], want_g[:3], ("explicit axes: dq, dk, dv", spec))
        for a, b, name in zip(ge5[3:], want_g[3:], ("dbias", "dsink")):
            assert float(jnp.abs(a - b).max()) <= 1e-6 * float(jnp.abs(b).max()), ("explicit axes", name, spec)
        # (rows with no visible key are XLA's mean of v, its sum's order the shard's own)
        ref_nn = jax.jit(nn)(q, k, v)
        assert float(jnp.abs(one - ref_nn).max()) <= 1e-6 * float(jnp.abs(ref_nn).max()), ("explicit axes: nn", spec)
    with jax.set_mesh(emesh):
        qe, ke, ve = (jax.device_put(x, P("x")) for x in (q, k, v))
        loss = lambda q, k, v: (fj.attention(q, k, v, causal=True) ** 2).sum()
        ge = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(qe, ke, ve)
        assert all(jax.typeof(a).sharding.spec[0] == "x" for a in ge), [jax.typeof(a) for a in ge]
        # through lse too (its cotangent joins v, o, do as a column: concatenate raised
        # ShardingTypeError on the column's replicated type)
        lloss = lambda q, k, v: (lambda o, l: (o ** 2).sum() + l.sum())(*fj.attention(q, k, v, return_lse=True))
        gl = jax.jit(jax.grad(lloss, argnums=(0, 1, 2)))(qe, ke, ve)
    same(ge, jax.grad(loss, argnums=(0, 1, 2))(q, k, v), "explicit axes: gradients")
    same(gl, jax.jit(jax.grad(lloss, argnums=(0, 1, 2)))(q, k, v), "explicit axes: gradients through lse")
    # the packed batch's custom_vjp too (its own backward): two sequences of B * S / 2 rows
    cu = jnp.asarray([0, B * S // 2, B * S], jnp.int32)
    qp, kp, vp = (x[:, :, :Hk].reshape(B * S, Hk, D) for x in (q, k, v))
    vloss = lambda q, k, v: (fj.varlen_attention(q, k, v, cu, cu, causal=True) ** 2).sum()
    with jax.set_mesh(emesh):
        gv = jax.jit(jax.grad(vloss, argnums=(0, 1, 2)))(*(jax.device_put(x, P("x")) for x in (qp, kp, vp)))
        assert all(jax.typeof(a).sharding.spec[0] == "x" for a in gv), [jax.typeof(a) for a in gv]
    same(gv, jax.grad(vloss, argnums=(0, 1, 2))(qp, kp, vp), "explicit axes: packed gradients")
    # a packed batch sharded along its heads (its only batch-like dimension): each device runs
    # its heads, forward and backward (dsink per head), bit-identical, no gather (it gathered)
    T = B * S // 2
    qv = q.reshape(T * 2, Hq, D)[:T]
    kv_, vv = (x.reshape(T * 2, Hk, D)[:T] for x in (k, v))
    cuv = jnp.asarray([0, T // 3, T], jnp.int32)
    pfwd = lambda q, k, v, s: fj.varlen_attention(q, k, v, cuv, cuv, causal=True, sinks=s, return_lse=True)
    ploss = lambda q, k, v, s: (pfwd(q, k, v, s)[0] ** 2).sum() + pfwd(q, k, v, s)[1].sum()
    qh, kh, vh = put(P(None, "x"), qv, kv_, vv)
    pf, pg = jax.jit(pfwd), jax.jit(jax.grad(ploss, argnums=(0, 1, 2, 3)))
    ov, lv = pf(qh, kh, vh, sinks)
    assert ov.sharding.spec[1] == "x" and lv.sharding.spec[0] == "x", (ov.sharding, lv.sharding)
    for fn, what in ((pf, "forward"), (pg, "backward")):
        assert "all-gather" not in fn.lower(qh, kh, vh, sinks).compile().as_text(), ("packed", what, "gathered")
    same((ov, lv), pfwd(qv, kv_, vv, sinks), "packed forward")
    gv = pg(qh, kh, vh, sinks)
    assert gv[0].sharding.spec[1] == "x" and gv[3].sharding.spec[0] == "x", [a.sharding for a in gv]
    same(gv, jax.grad(ploss, argnums=(0, 1, 2, 3))(qv, kv_, vv, sinks), "packed gradients")
    pdrop = lambda q, k, v: fj.varlen_attention(q, k, v, cuv, cuv, dropout_p=0.2, seed=3)
    same(jax.jit(pdrop)(qh, kh, vh), pdrop(qv, kv_, vv), "packed dropout (whole)")
    # kv-cache decoding: a dense cache splits along batch and kv heads, a paged one along kv
    # heads (its pages are every batch item's: a batch-sharded q leaves it whole), an int8
    # cache and its scales alike; appends included, donated or not; bit-identical, and a
    # dense call gathers nothing (every operand was gathered)
    Sn = 2
    qd = jnp.asarray(rng.standard_normal((B, Sn, Hq, D)), jnp.float32)
    kc, vc = (jnp.asarray(rng.standard_normal((B, S, Hk, D)), jnp.float32) for _ in range(2))
    kn, vn = (jnp.asarray(rng.standard_normal((B, Sn, Hk, D)), jnp.float32) for _ in range(2))
    lens = jnp.asarray(rng.integers(0, S - Sn, B), jnp.int32)
    dec = lambda q, kc, vc, kn, vn: fj.kvcache_attention(q, kc, vc, kn, vn, cache_seqlens=lens, causal=True,
                                                         sinks=sinks, return_lse=True)
    want = dec(qd, kc, vc, kn, vn)
    for spec, axis in ((P("x"), 0), (P(None, None, "x"), 2)):
        f = jax.jit(dec)
        xs = put(spec, qd, kc, vc, kn, vn)
        assert "all-gather" not in f.lower(*xs).compile().as_text(), ("kvcache", spec, "gathered")
        got = f(*xs)
        assert got[0].sharding.spec[axis] == "x" and got[2].sharding.spec[axis] == "x", [g.sharding for g in got]
        same(got, want, ("kvcache", spec))
        same(jax.jit(dec, donate_argnums=(1, 2))(*put(spec, qd, kc, vc, kn, vn)), want, ("kvcache donated", spec))
        with jax.set_mesh(emesh), warnings.catch_warnings():  # Explicit axes: the caches typed split,
            warnings.simplefilter("error")  # so the donated buffers are used ("not usable" warned)
            got = jax.jit(dec, donate_argnums=(1, 2))(*(jax.device_put(x, spec) for x in (qd, kc, vc, kn, vn)))
            assert all(jax.typeof(g).sharding.spec[axis] == "x" for g in got[:1] + got[2:]), [jax.typeof(g) for g in got]
        same(got, want, ("kvcache donated, explicit axes", spec))
    npg, ps = 2 * B * S // 16, 16
    kp, vp = (jnp.asarray(rng.standard_normal((npg, ps, Hk, D)), jnp.float32) for _ in range(2))
    table = jnp.asarray(rng.permutation(npg)[:B * (S // ps)].reshape(B, S // ps), jnp.int32)
    pdec = lambda q, kp, vp, kn, vn: fj.kvcache_attention(q, kp, vp, kn, vn, cache_seqlens=lens, block_table=table)
    want = pdec(qd, kp, vp, kn, vn)
    for spec in (P(None, None, "x"), P("x")):
        got = jax.jit(pdec)(*put(spec, qd), *put(P(None, None, "x"), kp, vp), *put(spec, kn, vn))
        same(got, want, ("paged", spec))
    # traced lengths leave the batch whole (heads still split): a bad one on one device's
    # batch items failed that device alone, its peer waited in the next collective and XLA
    # aborted the process; now the call raises naming the whole batch's index
    bad = lens.at[1].set(S - Sn + 1)
    tdec = jax.jit(lambda q, kc, vc, kn, vn, l: fj.kvcache_attention(q, kc, vc, kn, vn, cache_seqlens=l)[0].sum())
    try:
        tdec(*put(P("x"), qd, kc, vc, kn, vn, bad)).block_until_ready()
    except jax.errors.JaxRuntimeError as e:
        assert "cache_seqlens[1]" in str(e), str(e)
    else:
        raise AssertionError("a traced length past the capacity was taken")
    tdo = jax.jit(lambda q, kc, vc, kn, vn, l: fj.kvcache_attention(q, kc, vc, kn, vn, cache_seqlens=l))
    same(tdo(*put(P("x"), qd, kc, vc, kn, vn, lens)), tdo(qd, kc, vc, kn, vn, lens), "traced lengths")
    kq, ksc, vq, vsc = fj.quantize_cache(kc, vc, "int8")
    qdec = lambda q, kq, vq, ks, vs, kn, vn: fj.kvcache_attention(q, kq, vq, kn, vn, cache_seqlens=lens,
                                                                  cache_dtype="int8", k_scale=ks, v_scale=vs)
    want = qdec(qd, kq, vq, ksc, vsc, kn, vn)
    for spec in (P("x"), P(None, None, "x")):
        same(jax.jit(qdec)(*put(spec, qd, kq, vq, ksc, vsc, kn, vn)), want, ("int8 cache", spec))
    # vmap of the jitted call (its batching rule: the plain call)
    same(jax.vmap(jax.jit(lambda q: fj.attention(q, k, v)))(jnp.stack([q, q])),
         jnp.stack([fj.attention(q, k, v)] * 2), "vmap")
    print("ok")
""")


def test_plain_jit_with_sharded_inputs_runs_each_shard_on_its_device():
    _run(JIT_SHARDED)


# Under Explicit mesh axes, results of a call flashattn does not split (a mesh axis of size
# 1, dropout) are typed as q is split, updated caches as the caches, query rows as q's:
# they came back typed unsplit, and a lax.scan over layers carrying o refused the carry
# ("carry input and carry output must have equal types").
EXPLICIT_UNSPLIT = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax, jax.numpy as jnp, numpy as np
    import flashattn.jax as fj
    from jax.sharding import NamedSharding, PartitionSpec as P, AxisType
    rng = np.random.default_rng(int(sys.argv[1]))
    x = rng.standard_normal((2, 16, 4, 8)).astype(np.float32)
    k_, v_ = (jnp.asarray(rng.standard_normal((2, 16, 4, 8)), jnp.float32) for _ in range(2))

    def scan(att, q):  # layers carrying o: the carry's type must be q's
        return jax.jit(lambda q: jax.lax.scan(lambda c, _: (att(c), None), q, None, length=2)[0])(q)

    def check(mesh, spec, att, what):
        with jax.set_mesh(mesh):
            q = jax.device_put(x, NamedSharding(mesh, spec))
            o = jax.jit(att)(q)
            assert jax.typeof(o) == jax.typeof(q), (what, jax.typeof(o), jax.typeof(q))
            got = scan(att, q)
            assert jax.typeof(got) == jax.typeof(q), (what, "scan", jax.typeof(got))
        want = scan(att, jnp.asarray(x))
        assert np.array_equal(np.asarray(got), np.asarray(want)), what
        return q

    one = jax.make_mesh((1,), ("b",), axis_types=(AxisType.Explicit,), devices=jax.devices()[:1])
    two = jax.make_mesh((2,), ("b",), axis_types=(AxisType.Explicit,))
    att = lambda q: fj.attention(q, k_, v_, causal=True)
    q = check(one, P("b"), att, "one device, batch")
    check(one, P(None, None, "b"), att, "one device, heads")
    check(two, P("b"), lambda q: fj.attention(q, k_, v_, dropout_p=0.1, seed=1), "dropout")
    check(two, P(None, "b"), att, "query rows")
    check(two, P("b"), lambda q: fj.dot_product_attention(q, k_, v_, is_causal=True), "jax.nn drop-in")
    # the gradient through the scan on the one-device mesh: q's type
    with jax.set_mesh(one):
        g = jax.jit(jax.grad(lambda q: (scan(att, q) ** 2).sum()))(q)
        assert jax.typeof(g) == jax.typeof(q), ("grad", jax.typeof(g))
    # a decoding step: o typed as q, the updated caches as the caches (a scan over steps)
    kc, vc = (rng.standard_normal((2, 32, 4, 8)).astype(np.float32) for _ in range(2))
    kn, vn = (jnp.asarray(rng.standard_normal((2, 1, 4, 8)), jnp.float32) for _ in range(2))
    lens = np.array([5, 9], np.int32)
    step = lambda q, kc, vc: fj.kvcache_attention(q, kc, vc, kn, vn, cache_seqlens=lens)
    with jax.set_mesh(one):
        qd, kcs, vcs = (jax.device_put(a, NamedSharding(one, P("b"))) for a in (x[:, :1], kc, vc))
        o, k2, v2 = jax.jit(step)(qd, kcs, vcs)
        assert (jax.typeof(o), jax.typeof(k2), jax.typeof(v2)) == (jax.typeof(qd), jax.typeof(kcs), jax.typeof(vcs)), (
            "kvcache", jax.typeof(o), jax.typeof(k2))
        carry = jax.jit(lambda q, kc, vc: jax.lax.scan(lambda c, _: (step(*c), None), (q, kc, vc), None,
                                                       length=2)[0])(qd, kcs, vcs)
    want = jax.lax.scan(lambda c, _: (step(*c), None), (jnp.asarray(x[:, :1]), jnp.asarray(kc), jnp.asarray(vc)),
                        None, length=2)[0]
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(carry, want)), "kvcache scan"
    print("ok")
""")


def test_explicit_axes_results_typed_as_q_where_the_call_is_not_split():
    _run(EXPLICIT_UNSPLIT)
