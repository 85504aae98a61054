"""flashattn.jax inside shard_map (two host devices, in a subprocess: the device count is
fixed when JAX starts). The FFI calls' results vary along the manual axes their operands
vary along: gradients inside shard_map equal the unsharded ones (they once failed on the
cotangents' types), and out_specs=P() without a psum is refused as jax.nn's is (it once
returned one shard's value). Seeded by the run's seed (conftest.py)."""
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


def test_shard_map_gradients_and_varying_results():
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(SEED)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), f"seed {SEED}:\n{r.stdout}\n{r.stderr[-3000:]}"
