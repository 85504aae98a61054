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

Every peer is checked before it is timed: its output (and, with --backward, its gradients
dq, dk, dv for the loss sum(o), i.e. do = ones) on the benchmark's inputs against float64
(reference_check: the output on CHECK_ROWS query rows of every (b, h); the gradients in
full for the first and the last (b, h)), error over max |reference| within TOL[dtype]. A
peer that fails is reported as WRONG (with its error) and not timed.

Inputs: numpy default_rng(SEED), standard normal, rounded to --dtype once (so the peers and
the float64 reference see the same values).

One line per peer on stdout (a JSON object with --json), progress and skips on stderr.
"""
import argparse
import json
import os
import sys
import time


SEED = 0
# Largest error over max |reference| a correct peer may show against float64: f32 arithmetic
# shows about 1e-6 here; 16-bit inputs and outputs as bench/decode_data.py's TOLERANCE["16bit"]
# (a wrong layout or mask is off by about max |reference| itself).
TOL = {"f32": 1e-4, "bf16": 4e-2, "f16": 4e-2}
CHECK_ROWS = 32  # query rows of every (b, h) the forward check compares


def rel_error(got, ref):
    """max |got - ref| / max |ref| (inf if got has a NaN or an inf), and max |got - ref|."""
    import numpy as np
    got = np.asarray(got, np.float64).reshape(ref.shape)
    err = float(np.max(np.abs(got - ref))) if np.all(np.isfinite(got)) else float("inf")
    return err / max(float(np.max(np.abs(ref))), 1e-300), err


def round_to(x, dtype):
    """x (f32) rounded to dtype and back (round to nearest even), as the peers' casts do."""
    import numpy as np
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        u = x.view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return x


def check_rows(S):
    """The query rows the forward check compares: spread over the sequence, first and last."""
    import numpy as np
    return np.unique(np.linspace(0, S - 1, min(S, CHECK_ROWS)).astype(np.int64))


def reference_forward(q, k, v, causal, rows):
    """float64 attention of the query rows `rows` of every (b, h); q, k, v [B, H, S, D]."""
    import numpy as np
    S, D = k.shape[2], k.shape[3]
    s = np.einsum("bhrd,bhsd->bhrs", q[:, :, rows].astype(np.float64), k.astype(np.float64)) / np.sqrt(D)
    if causal:
        s[..., np.arange(S)[None, :] > rows[:, None]] = -np.inf
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhrs,bhsd->bhrd", p, v.astype(np.float64))


def reference_grads(q, k, v, causal, chunk=512):
    """float64 dq, dk, dv of sum(o) (do = ones) for one head, q, k, v [S, D], in row chunks."""
    import numpy as np
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    S, D = k.shape
    scale = 1 / np.sqrt(D)
    dp = v.sum(axis=1)  # dp_ij = do_i . v_j = sum_d v_jd
    dq, dk, dv = np.empty_like(q), np.zeros_like(k), np.zeros_like(v)
    for i0 in range(0, S, chunk):
        r = np.arange(i0, min(S, i0 + chunk))
        s = scale * (q[r] @ k.T)
        if causal:
            s[np.arange(S)[None, :] > r[:, None]] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        o_sum = p @ dp  # D_i = do_i . o_i = sum_j p_ij dp_j
        ds = p * (dp[None, :] - o_sum[:, None])
        dq[r] = scale * (ds @ k)
        dk += scale * (ds.T @ q[r])
        dv += p.sum(axis=0)[:, None]
    return dq, dk, dv


def reference_check(args, q, k, v, out, grads=None):
    """Checks a peer's output out [B, H, S, D] (and grads (dq, dk, dv) [B, H, S, D], do = ones)
    against float64 on the same inputs; returns (ok, a record of the errors)."""
    rows = check_rows(q.shape[2])
    rel, err = rel_error(out[:, :, rows], reference_forward(q, k, v, args.causal, rows))
    rec = {"check_rel_err": rel, "check_max_abs_err": err, "check_tol": TOL[args.dtype]}
    worst = rel
    if grads is not None:
        B, H = q.shape[:2]
        for b, h in sorted({(0, 0), (B - 1, H - 1)}):
            ref = reference_grads(q[b, h], k[b, h], v[b, h], args.causal)
            for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
                e = rel_error(g[b, h], r)[0]
                rec[f"check_rel_err_{name}"] = max(rec.get(f"check_rel_err_{name}", 0.0), e)
                worst = max(worst, e)
    return worst <= TOL[args.dtype], rec


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


def wrong(args, peer, rec):
    """A peer whose check failed: said on stdout (and stderr), not timed."""
    errs = ", ".join(f"{k[len('check_rel_err_'):] or 'o'} {v:.2e}" for k, v in rec.items()
                     if k.startswith("check_rel_err"))
    why = f"WRONG vs float64: {errs} (error / max abs ref, tol {rec['check_tol']:g}); not timed"
    log(f"{peer}: {why}")
    if args.json:
        print(json.dumps(dict(rec, peer=peer, dtype=args.dtype, wrong=why)), flush=True)
    else:
        print(f"{peer:6s} {args.dtype:5s}: {why}", flush=True)


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
    # XLA has no thread-count flag: its CPU pools are sized by the CPUs the process may run on
    # (sched_getaffinity), so every peer of this process is confined to `threads` CPUs before
    # jax loads. (XLA_FLAGS' old "intra_op_parallelism_threads=N", without "--", was silently
    # ignored; with "--" XLA aborts on it as an unknown flag.)
    cpus = sorted(os.sched_getaffinity(0))
    if args.threads > len(cpus):
        log(f"peers: {args.threads} threads asked, {len(cpus)} CPUs available: running on {len(cpus)}")
    os.sched_setaffinity(0, set(cpus[:args.threads]))
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=true"
    import numpy as np

    B, H, S, D = args.batch, args.heads, args.seq, args.head_dim
    pairs = S * (S + 1) // 2 if args.causal else S * S
    flops = 2 * (2 * D) * pairs * B * H
    if args.backward:  # the timed step is forward + backward: 1 + 2.5 forwards
        flops = flops * 7 // 2
    log(f"inputs: seed {SEED} (fixed), numpy default_rng, standard normal rounded to {args.dtype}")
    rng = np.random.default_rng(SEED)
    q32, k32, v32 = (round_to(rng.standard_normal((B, H, S, D), dtype=np.float32), args.dtype)
                     for _ in range(3))
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

                run_numpy()
                ok, chk = reference_check(args, q32, k32, v32, o)
                if not ok:
                    wrong(args, peer, chk)
                    continue
                report(args, peer, "f32", timed(run_numpy, args.reps), flops, chk)

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
                f = jax.jit(attn)
                grads = None
                if args.backward:
                    # value_and_grad: the step returns o as torch's does, so that XLA keeps o = P V
                    # (jax.grad alone let it drop that product, one of the six the useful
                    # fwd+bwd flops count: not like with like)
                    g = jax.jit(jax.value_and_grad(lambda q, k, v: attn(q, k, v).astype(jnp.float32).sum(),
                                                   argnums=(0, 1, 2)))
                    fn = lambda: jax.block_until_ready(g(q, k, v))
                    grads = [np.asarray(x, np.float32).transpose(0, 2, 1, 3) for x in g(q, k, v)[1]]
                else:
                    fn = lambda: f(q, k, v).block_until_ready()
                out = np.asarray(f(q, k, v), np.float32).transpose(0, 2, 1, 3)
                ok, chk = reference_check(args, q32, k32, v32, out, grads)
                if not ok:
                    wrong(args, peer, chk)
                    continue
                report(args, peer, args.dtype, timed(fn, args.reps), flops,
                       dict(chk, version=jax.__version__))

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
                        return o
                else:
                    def fn():
                        with torch.no_grad():
                            return F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
                out = fn().detach().float().numpy()
                grads = [x.grad.float().numpy() for x in (q, k, v)] if args.backward else None
                ok, chk = reference_check(args, q32, k32, v32, out, grads)
                if not ok:
                    wrong(args, peer, chk)
                    continue
                report(args, peer, args.dtype, timed(fn, args.reps), flops,
                       dict(chk, version=torch.__version__))
            else:
                skip(args, peer, "unknown peer")
        except ImportError as e:
            skip(args, peer, f"not installed ({e})")
        except Exception as e:  # a peer failing must not stop the others
            skip(args, peer, f"failed: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
