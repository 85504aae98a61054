"""Sequence-length sweep behind the plots of `make bench` (bench/run.sh calls it after the
suite): times flashattn and its peers on B=1 H=8 D=128 f32 at several sequence lengths,
records peak memory, and draws PNGs into bench/plots/:

  gflops_forward.png   forward GFLOP/s vs S: flashattn, naive OpenBLAS, numpy, torch SDPA, jax
  gflops_fwd_bwd.png   forward+backward GFLOP/s vs S: flashattn, torch SDPA, jax
  peak_memory.png      peak memory vs S: flashattn vs the naive attention (measured peak RSS
                       of bench_fa and naive_openblas, and the plan's analytic figures)

    python bench/plots.py --build build [--threads 2] [--seqs 512,1024,2048,4096]

Needs matplotlib (run it with the benchmark venv's python). GFLOP/s counts useful flops
for every implementation alike: forward 4*B*H*S^2*D, forward+backward 3.5x that (the
backward 2.5x, FlashAttention-2's convention). Each point is the median of its reps; the
figures go to bench/plots/sweep.json too.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run_json(cmd, env, timeout=900):
    log("$ " + " ".join(cmd))
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=timeout)
    except (subprocess.TimeoutExpired, OSError) as e:
        log(f"  failed: {e}")
        return []
    out = []
    for line in p.stdout.splitlines():
        if line.strip().startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def useful(S, fwd_bwd, B=1, H=8, D=128):
    f = 4 * B * H * S * S * D
    return f * 7 / 2 if fwd_bwd else f


def sweep(args, env):
    build = args.build
    res = {"threads": args.threads, "shape": "B=1 H=8 D=128 f32", "forward": {}, "fwd_bwd": {},
           "memory": {}, "plan_memory": {}}
    have_blas = os.path.exists(os.path.join(build, "naive_openblas"))
    for S in args.seqs:
        shape = ["--batch", "1", "--heads", "8", "--seq", str(S), "--head-dim", "128"]
        reps = "3" if S <= 4096 else "2"
        fw = res["forward"].setdefault(str(S), {})
        fb = res["fwd_bwd"].setdefault(str(S), {})
        mem = res["memory"].setdefault(str(S), {})
        # flashattn forward alone (its peak RSS is the forward's), then forward + backward
        r = run_json([os.path.join(build, "bench_fa")] + shape + ["--threads", str(args.threads), "--reps", reps,
                                                                  "--json"], env)
        if r and "forward" in r[-1]:
            fw["flashattn"] = useful(S, False) / r[-1]["forward"]["median_seconds"] * 1e-9
            mem["flashattn"] = r[-1]["peak_rss_gb"] * 2**30
            res["plan_memory"][str(S)] = [r[-1]["plan_peak_bytes"], r[-1]["plan_naive_peak_bytes"]]
        r = run_json([os.path.join(build, "bench_fa")] + shape + ["--threads", str(args.threads), "--reps", reps,
                                                                  "--backward", "--json"], env)
        if r and "backward" in r[-1]:
            t = r[-1]["forward"]["median_seconds"] + r[-1]["backward"]["median_seconds"]
            fb["flashattn"] = useful(S, True) / t * 1e-9
        if have_blas:
            r = run_json([os.path.join(build, "naive_openblas"), "1", "8", str(S), "128", "--reps", reps, "--json"],
                         env)
            if r and "median_seconds" in r[-1]:
                fw["naive OpenBLAS"] = useful(S, False) / r[-1]["median_seconds"] * 1e-9
                mem["naive OpenBLAS"] = r[-1]["peak_rss_mb"] * 2**20
        for backward, into in ((False, fw), (True, fb)):
            peers = "jax,torch" if backward else "numpy,jax,torch"
            cmd = [sys.executable, os.path.join(HERE, "peers.py")] + shape + [
                "--threads", str(args.threads), "--reps", reps, "--peers", peers, "--json"]
            if backward:
                cmd.append("--backward")
            for rr in run_json(cmd, env):
                if "median_seconds" in rr:
                    name = {"numpy": "numpy naive", "jax": "jax dot_product_attention",
                            "torch": "torch SDPA"}[rr["peer"]]
                    into[name] = useful(S, backward) / rr["median_seconds"] * 1e-9
    # the plan's analytic peaks reach far past what this machine can run naively
    for S in [1024 * 2**i for i in range(0, 8)]:
        r = run_json([os.path.join(build, "flashattn"), "plan", "--batch", "1", "--heads", "8", "--seq", str(S),
                      "--head-dim", "128", "--backend", "cpu", "--json"], env, 60)
        if r:
            res["plan_memory"][str(S)] = [r[-1]["forward"]["peak_bytes"], r[-1]["forward"]["naive_peak_bytes"]]
    return res


def draw(res, outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    note = (f"{res['shape']}, {res['threads']} threads; useful flops: forward 4*B*H*S^2*D, "
            "fwd+bwd 3.5x; median of reps")
    for key, fname, title in (("forward", "gflops_forward.png", "Forward"),
                              ("fwd_bwd", "gflops_fwd_bwd.png", "Forward + backward")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        names = sorted({n for v in res[key].values() for n in v}, key=lambda n: (n != "flashattn", n))
        for n in names:
            xs = [int(s) for s in res[key] if n in res[key][s]]
            ys = [res[key][str(s)][n] for s in xs]
            ax.plot(xs, ys, marker="o", linewidth=2.5 if n == "flashattn" else 1.5, label=n)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length S")
        ax.set_ylabel("useful GFLOP/s")
        ax.set_title(f"{title}: {note}", fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, fname), dpi=110)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    pm = sorted((int(s), v) for s, v in res["plan_memory"].items())
    ax.plot([s for s, _ in pm], [v[0] / 2**30 for _, v in pm], "--", color="C0", label="flashattn (plan)")
    ax.plot([s for s, _ in pm], [v[1] / 2**30 for _, v in pm], "--", color="C3", label="naive (plan: the whole [B, H, S, S] f32 score matrix)")
    for n, color in (("flashattn", "C0"), ("naive OpenBLAS", "C3")):
        xs = [int(s) for s in res["memory"] if n in res["memory"][s]]
        ax.plot(xs, [res["memory"][str(s)][n] / 2**30 for s in xs], "o", color=color,
                label=f"{n} (measured peak RSS)" + (", one S x S score block" if n != "flashattn" else ""))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length S")
    ax.set_ylabel("peak memory, GiB")
    ax.set_title("Peak memory of the forward, B=1 H=8 D=128 f32: flash vs naive attention", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "peak_memory.png"), dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seqs", default="512,1024,2048,4096")
    ap.add_argument("--out", default=os.path.join(HERE, "plots"))
    ap.add_argument("--from-json", help="redraw from a saved sweep.json, measuring nothing")
    args = ap.parse_args()
    args.build = args.build if os.path.isabs(args.build) else os.path.join(ROOT, args.build)
    args.seqs = [int(s) for s in args.seqs.split(",")]
    os.makedirs(args.out, exist_ok=True)
    if args.from_json:
        with open(args.from_json) as f:
            res = json.load(f)
    else:
        T = str(args.threads)
        env = dict(os.environ, OMP_NUM_THREADS=T, OPENBLAS_NUM_THREADS=T, OPENBLAS_CORETYPE="SKYLAKEX")
        env.pop("FA_ISA", None)
        t0 = time.time()
        res = sweep(args, env)
        res["minutes"] = round((time.time() - t0) / 60, 1)
        res["load_average_end"] = round(os.getloadavg()[0], 2)
        with open(os.path.join(args.out, "sweep.json"), "w") as f:
            json.dump(res, f, indent=1)
    draw(res, args.out)
    log(f"plots in {args.out}")


if __name__ == "__main__":
    main()
