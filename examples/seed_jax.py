"""The seed problem end to end in JAX: B=18, H=32, S=16384, D=256, bf16.

1. Builds the problem from jax.ShapeDtypeStructs, jits a function calling
   flashattn.jax.attention, lowers and compiles it, and prints its cost estimate (the
   library's plan) beside what XLA sees: nothing of the problem's size is allocated, and
   lowering plus compiling takes well under 2 s in a process under 300 MiB of RSS.
2. Runs a scaled-down version (B=1, H=4, S=--seq) for real on this machine and spot-checks
   it against a float64 computation.

    python examples/seed_jax.py [--causal] [--seq 1024]

Measured with /usr/bin/time -v: README.md, "JAX".
"""
import argparse
import resource
import time

t_start = time.perf_counter()
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import pallas  # noqa: E402,F401 - cost_estimate's CostEstimate, imported up front

import flashattn  # noqa: E402
import flashattn.jax as fj  # noqa: E402

t_imported = time.perf_counter()


def rss_mib():
    """Peak resident set size of this process so far, MiB: VmHWM, which starts afresh at
    exec (ru_maxrss keeps the parent's peak when started by fork and exec, as under pytest)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--seq", type=int, default=1024, help="sequence length of the scaled-down run")
    ap.add_argument("--seed-only", action="store_true", help="stop after the seed problem's compile")
    args = ap.parse_args()
    causal = args.causal

    def model(q, k, v):
        return fj.attention(q, k, v, causal=causal)  # [B, S, H, D], like jax.nn's attention

    B, S, H, D = 18, 16384, 32, 256
    seed = [jax.ShapeDtypeStruct((B, S, H, D), jnp.bfloat16) for _ in range(3)]
    print(f"imports: {t_imported - t_start:.2f} s, RSS {rss_mib():.0f} MiB")
    print(f"== seed problem: q, k, v [B={B}, S={S}, H={H}, D={D}] bf16, causal={causal} (ShapeDtypeStructs)")

    t0 = time.perf_counter()
    lowered = jax.jit(model).lower(*seed)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    print(f"lower {t1 - t0:.3f} s + compile {t2 - t1:.3f} s = {t2 - t0:.3f} s; peak RSS so far {rss_mib():.0f} MiB; "
          f"live jax arrays: {len(jax.live_arrays())}")

    t0 = time.perf_counter()
    est = fj.cost_estimate(*seed, causal=causal)
    t1 = time.perf_counter()
    plan = fj.plan(*seed, causal=causal)
    f, b = plan.forward, plan.backward
    # the transcendentals follow the kernel set's tiles (the README's figure names the one it ran on)
    kernels = f", {flashattn.cpu_isa()} kernels" if plan.backend == "cpu" else ""
    print(f"cost_estimate ({(t1 - t0) * 1e6:.0f} us, {plan.backend} plan{kernels}): flops={est.flops:,} "
          f"transcendentals={est.transcendentals:,} bytes_accessed={est.bytes_accessed:,}")
    print(f"useful flops {f['flops_useful']:,} forward, {b['flops_useful']:,} backward; "
          f"peak memory {human(f['peak_bytes'])} forward, {human(b['peak_bytes'])} backward; "
          f"the naive reference {human(f['naive_peak_bytes'])}")
    xla = compiled.cost_analysis() or {}
    xla = xla[0] if isinstance(xla, (list, tuple)) else xla
    print(f"XLA's own cost analysis of the compiled function (the custom call is opaque to it): "
          f"flops={xla.get('flops', 0):,.0f}")

    if args.seed_only:
        return
    n = args.seq
    print(f"\n== scaled down, run for real: B=1, S={n}, H=4, D={D} bf16, causal={causal}")
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((1, n, 4, D)), jnp.bfloat16) for _ in range(3))
    run = jax.jit(model)
    o = run(q, k, v).block_until_ready()  # compiles for these shapes
    t0 = time.perf_counter()
    o = run(q, k, v).block_until_ready()
    secs = time.perf_counter() - t0
    useful = 4 * 1 * 4 * n * n * D / (2 if causal else 1)
    # a spot check of head 0's last 8 rows in float64 (the test suite checks everything)
    qf, kf, vf = (np.asarray(x[0, :, 0].astype(jnp.float32), np.float64) for x in (q, k, v))
    s = qf[-8:] @ kf.T / np.sqrt(D)
    if causal:
        s = np.where(np.arange(n)[None, :] <= np.arange(n - 8, n)[:, None], s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    want = (p / p.sum(axis=1, keepdims=True)) @ vf
    err = float(np.max(np.abs(np.asarray(o[0, -8:, 0].astype(jnp.float32)) - want)))
    print(f"forward {secs * 1e3:.1f} ms, {useful / secs / 1e9:.1f} GFLOP/s useful; "
          f"max |o - float64 softmax(q k^T / sqrt(D)) v| over 8 rows = {err:.4f} (bf16 output)")
    print(f"peak RSS {rss_mib():.0f} MiB")


if __name__ == "__main__":
    main()
