"""Attention peers on the CPU, timed on the same shapes as flashattn's benchmark.

    bench/.venv/bin/python bench/peers.py --batch 1 --heads 8 --seq 4096 --head-dim 128 \
        [--dtype f32|bf16|f16] [--causal] [--backward] [--threads 2] [--reps 3] \
        [--peers numpy,jax,torch] [--json]

Peers:
  numpy  naive attention per (b, h): s = scale q k^T, row softmax, p v (f32 only)
  jax    jax.nn.dot_product_attention, jitted, on the CPU (layout [B, S, H, D])
  torch  torch.nn.functional.scaled_dot_product_attention on the CPU ([B, H, S, D])

GFLOP/s counts what flashattn's plan calls flops_useful: 2 (D + Dv) x the visible (i, j)
pairs, i.e. 4 B H S^2 D non-causal and 2 B H S (S + 1) D causal, so every peer and
flashattn divide the same number. --backward times forward + backward (an autograd step)
and counts 3.5x the forward (the backward: 2.5x, the FlashAttention-2 convention: 5 matrix
products against the forward's 2).

One line per peer on stdout (a JSON object with --json), progress and skips on stderr.
"""
import argparse
import json
import os
import sys
import time


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def shape_parser(doc, heads, dtypes, default_dtype):
    """The flags every CPU peer script shares (this one and decode_peer.py)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=heads)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", choices=dtypes, default=default_dtype)
    ap.add_argument("--threads", type=int, default=2)
    return ap


def parse():
    ap = shape_parser(__doc__, 8, ["f32", "bf16", "f16"], "f32")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--backward", action="store_true", help="time forward + backward (jax, torch)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--peers", default="numpy,jax,torch")
    ap.add_argument("--mem-limit-gb", type=float, default=16.0,
                    help="skip a peer whose estimated memory exceeds this")
    ap.add_argument("--json", action="store_true")
    return ap.parse_args()


def timed(fn, reps):
    fn()  # warm-up (and compilation)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts


def report(args, peer, dtype, ts, flops, extra=None):
    best, med = ts[0], ts[len(ts) // 2]
    rec = {"peer": peer, "dtype": dtype, "pass": "forward+backward" if args.backward else "forward",
           "seconds": best, "median_seconds": med, "max_seconds": ts[-1],
           "gflops": flops / best * 1e-9, "batch": args.batch, "heads": args.heads,
           "seq": args.seq, "head_dim": args.head_dim, "causal": args.causal,
           "threads": args.threads}
    if extra:
        rec.update(extra)
    if args.json:
        print(json.dumps(rec), flush=True)
    else:
        print(f"{peer:6s} {dtype:5s} {rec['pass']:8s}: {best:.4f} s (median {med:.4f}), "
              f"{rec['gflops']:.1f} GFLOP/s", flush=True)


def skip(args, peer, why):
    log(f"{peer}: skipped: {why}")
    if args.json:
        print(json.dumps({"peer": peer, "dtype": args.dtype, "skipped": why}), flush=True)


def main():
    args = parse()
    t = str(args.threads)
    # Thread counts must be set before the libraries load.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = t
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={t}")
    import numpy as np

    B, H, S, D = args.batch, args.heads, args.seq, args.head_dim
    pairs = S * (S + 1) // 2 if args.causal else S * S
    flops = 2 * (2 * D) * pairs * B * H
    if args.backward:  # the timed step is forward + backward: 1 + 2.5 forwards
        flops = flops * 7 // 2
    rng = np.random.default_rng(0)
    q32, k32, v32 = (rng.standard_normal((B, H, S, D), dtype=np.float32) for _ in range(3))
    scale = 1.0 / np.sqrt(D)
    elt = 4 if args.dtype == "f32" else 2
    io_gb = 4 * B * H * S * D * elt / 2**30

    for peer in args.peers.split(","):
        try:
            if peer == "numpy":
                if args.dtype != "f32" or args.backward:
                    skip(args, peer, "f32 forward only")
                    continue
                if 3 * S * S * 4 / 2**30 + io_gb > args.mem_limit_gb:
                    skip(args, peer, "score matrix over the memory limit")
                    continue
                o = np.empty_like(q32)
                mask = np.triu(np.ones((S, S), dtype=bool), 1) if args.causal else None

                def run_numpy():
                    for b in range(B):
                        for h in range(H):
                            s = (q32[b, h] @ k32[b, h].T) * np.float32(scale)
                            if mask is not None:
                                s[mask] = -np.inf
                            s -= s.max(axis=1, keepdims=True)
                            np.exp(s, out=s)
                            s /= s.sum(axis=1, keepdims=True)
                            o[b, h] = s @ v32[b, h]

                report(args, peer, "f32", timed(run_numpy, args.reps), flops)

            elif peer == "jax":
                import jax
                import jax.numpy as jnp
                jdt = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}[args.dtype]
                # XLA's CPU path materialises the [B, H, S, S] logits (and more for grads).
                est = B * H * S * S * 4 * (3 if args.backward else 1.5) / 2**30 + io_gb
                if est > args.mem_limit_gb:
                    skip(args, peer, f"would need about {est:.0f} GB")
                    continue
                q, k, v = (jnp.asarray(x.transpose(0, 2, 1, 3), dtype=jdt) for x in (q32, k32, v32))
                attn = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=args.causal)
                if args.backward:
                    g = jax.jit(jax.grad(lambda q, k, v: attn(q, k, v).astype(jnp.float32).sum(),
                                         argnums=(0, 1, 2)))
                    fn = lambda: jax.block_until_ready(g(q, k, v))
                else:
                    f = jax.jit(attn)
                    fn = lambda: f(q, k, v).block_until_ready()
                report(args, peer, args.dtype, timed(fn, args.reps), flops,
                       {"version": jax.__version__})

            elif peer == "torch":
                import torch
                import torch.nn.functional as F
                torch.set_num_threads(args.threads)
                tdt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
                q, k, v = (torch.from_numpy(x).to(tdt) for x in (q32, k32, v32))
                if args.backward:
                    for x in (q, k, v):
                        x.requires_grad_(True)
                    do = torch.ones(B, H, S, D, dtype=tdt)

                    def fn():
                        for x in (q, k, v):
                            x.grad = None
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
                        o.backward(do)
                else:
                    def fn():
                        with torch.no_grad():
                            F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
                report(args, peer, args.dtype, timed(fn, args.reps), flops,
                       {"version": torch.__version__})
            else:
                skip(args, peer, "unknown peer")
        except ImportError as e:
            skip(args, peer, f"not installed ({e})")
        except Exception as e:  # a peer failing must not stop the others
            skip(args, peer, f"failed: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
