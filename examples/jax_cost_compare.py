"""The seed problem's cost estimate four ways, each in its own process under an 8 GiB
address-space limit: flashattn.jax.cost_estimate (the library's plan) against what JAX
offers for the naive reference (the Pallas TPU module's mha_reference): pl.estimate_cost,
and XLA's cost analysis of the lowered and of the compiled reference. Prints the README's
Markdown table: time (imports excluded), peak RSS, flops, transcendentals, bytes.

    python examples/jax_cost_compare.py
"""
import json
import resource
import subprocess
import sys

LIMIT = 8 << 30

CHILD = r'''
import json, sys, time
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas.ops.tpu import flash_attention as tpu
import flashattn.jax as fj
method, causal = sys.argv[1], sys.argv[2] == "1"
B, H, S, D = 18, 32, 16384, 256
sd = jax.ShapeDtypeStruct((B, H, S, D), jnp.bfloat16)
t = time.perf_counter()
if method.startswith("flashattn"):
    c = fj.cost_estimate(sd, sd, sd, causal=causal, layout="bhsd", backend=method.split(":")[1])
    out = dict(flops=c.flops, transcendentals=c.transcendentals, bytes=c.bytes_accessed)
elif method == "pl.estimate_cost":
    c = pl.estimate_cost(tpu.mha_reference, sd, sd, sd, None, None, causal=causal, sm_scale=1.0)
    out = dict(flops=c.flops, transcendentals=c.transcendentals, bytes=c.bytes_accessed)
else:
    f = jax.jit(tpu.mha_reference, static_argnames=["causal", "sm_scale"])
    lowered = f.lower(sd, sd, sd, None, None, causal=causal, sm_scale=1.0)
    a = lowered.cost_analysis() if method == "lowered" else lowered.compile().cost_analysis()
    a = a[0] if isinstance(a, (list, tuple)) else a
    out = dict(flops=int(a["flops"]), transcendentals=int(a["transcendentals"]), bytes=int(a["bytes accessed"]))
out["seconds"] = time.perf_counter() - t
out["rss_mib"] = int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024
print(json.dumps(out))
'''

METHODS = [
    ("flashattn:cpu", "`flashattn.jax.cost_estimate` (CPU plan)"),
    ("flashattn:cuda", "`flashattn.jax.cost_estimate(backend=\"cuda\")`"),
    ("pl.estimate_cost", "`pl.estimate_cost(mha_reference, ...)`"),
    ("lowered", "`jit(mha_reference).lower(...).cost_analysis()`"),
    ("compiled", "`jit(mha_reference).lower(...).compile().cost_analysis()`"),
]


def limit():
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def main():
    print("| causal | method | time | peak RSS | flops | transcendentals | bytes accessed |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for causal in (0, 1):
        for method, label in METHODS:
            r = subprocess.run([sys.executable, "-c", CHILD, method, str(causal)], capture_output=True, text=True,
                               preexec_fn=limit, timeout=900)
            if r.returncode != 0:
                last = (r.stderr.strip().splitlines() or ["?"])[-1][:120]
                print(f"| {bool(causal)} | {label} | failed (exit {r.returncode}): {last} | | | | |")
                continue
            d = json.loads(r.stdout.strip().splitlines()[-1])
            t = d["seconds"]
            t = f"{t * 1e6:.0f} us" if t < 0.01 else f"{t * 1e3:.0f} ms"
            print(f"| {bool(causal)} | {label} | {t} | {d['rss_mib']:.0f} MiB | {d['flops']:.4g} | "
                  f"{d['transcendentals']:.4g} | {d['bytes']:.4g} |", flush=True)


if __name__ == "__main__":
    main()
