"""splash_cost_estimate on the seed's shape (B=18, H=32, S=16384, D=256, bf16), beside the dense
reference's pl.estimate_cost (what the open fix for jax-ml/jax #28776 proposes: the Pallas TPU
module's mha_reference, traced, mask ignored) and a mean-sparsity estimate (the dense figures
times the mask's density), for causal, local(1024), chunked(8192) and a four-document mask
(causal within documents of 4096). Prints the README's Markdown table: time of one call on a
mask object not seen before (after a warm-up call on another instance, so imports and
first-call costs are out; flashattn caches a mask's conversion per object), flops,
transcendentals, bytes.

    python bench/splash_cost.py
"""
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas.ops.tpu import flash_attention as tpu
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

import flashattn.jax as fj
from flashattn import masks

B, H, S, D = 18, 32, 16384, 256


def four_documents():
    doc = np.repeat(np.arange(4), S // 4)
    return sm.NumpyMask((doc[:, None] == doc[None, :]) & (np.arange(S)[:, None] >= np.arange(S)[None, :]))


MASKS = [
    ("causal", lambda: sm.CausalMask((S, S))),
    ("local(1024)", lambda: sm.LocalMask((S, S), (1024, 0), offset=0)),
    ("chunked(8192)", lambda: sm.ChunkedCausalMask((S, S), chunk_size=8192)),
    ("4 documents (NumpyMask)", four_documents),
    ("4 documents (flashattn.masks)", lambda: masks.documents([S // 4] * 4) & masks.causal(0)),
]


def timed(fn, make=None):
    """(fn(x), seconds) for a fresh x = make() after a warm-up call fn(make())."""
    make = make or (lambda: None)
    fn(make())
    x = make()
    t = time.perf_counter()
    out = fn(x)
    return out, time.perf_counter() - t


def fmt_time(t):
    return f"{t * 1e6:.0f} us" if t < 0.01 else f"{t * 1e3:.0f} ms"


def main():
    q = jax.ShapeDtypeStruct((B, H, S, D), jnp.bfloat16)
    dense, t_dense = timed(lambda _: pl.estimate_cost(tpu.mha_reference, q, q, q, None, None, causal=False,
                                                    sm_scale=1.0))
    print("| mask | method | time | flops | transcendentals | bytes accessed |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, make in MASKS:
        est, t_est = timed(lambda m: fj.splash_cost_estimate(m, q, q, q), make)

        def density(m):  # the mask's visible pairs over S * S, from flashattn's exact plan
            useful = fj.plan(q, q, q, mask=m, layout="bhsd", backend="cpu").forward["flops_useful"]
            return useful / (4 * B * H * S * S * D)

        dens, t_dens = timed(density, make)
        rows = [("`splash_cost_estimate` (splash's kernel, default blocks)", t_est, est),
                ("`pl.estimate_cost(mha_reference)` (dense)", t_dense, dense),
                (f"mean sparsity (dense x {dens:.4f})", t_dense + t_dens,
                 pl.CostEstimate(flops=int(dense.flops * dens), transcendentals=int(dense.transcendentals * dens),
                                 bytes_accessed=dense.bytes_accessed))]
        for label, t, c in rows:
            print(f"| {name} | {label} | {fmt_time(t)} | {c.flops:.4g} | {c.transcendentals:.4g} | "
                  f"{c.bytes_accessed:.4g} |", flush=True)


if __name__ == "__main__":
    main()
