"""The CPU benchmark suite behind bench/run.sh: runs flashattn (bench_fa, and the CLI's
`flashattn bench` for the headline case) and its peers on the same shapes, prints a table
and appends it to bench/RESULTS.md.

    python3 bench/suite.py --build build [--seed] [--quick] [--threads 2] [--no-append]

Plain Python (no packages); the Python peers run under bench/.venv/bin/python.

GFLOP/s everywhere counts flops_useful: 2 (D + Dv) x the visible (i, j) pairs, so
4 B H S^2 D non-causal and 2 B H S (S+1) D causal, for flashattn and every peer alike
(backward: 2.5x that, FlashAttention-2's convention). Like is compared with like: forward
rows time the forward alone, "fwd+bwd" rows time a forward and a backward (the peers'
autograd step; flashattn's forward plus its backward) and count 3.5x the forward's useful
flops. flashattn's executed count (the plan's `flops`, tile granularity, recomputation in
the backward) is shown beside it.

"pred s" is `flashattn plan`'s predicted seconds (rates.h's model with the rates that
`flashattn calibrate`, run at the start of the suite, measured), beside flashattn's median
seconds; "meas/pred" their ratio.
"% peak" divides by this machine's measured peak on the same thread count, for the ISA
flashattn ran (bench_fa's "isa"): the AVX-512 FMA peak for f32 and f16 (flashattn multiplies
f16 in f32), for bf16 the AMX peak under "amx", the vdpbf16ps peak under "avx512bf16".
fwd+bwd rows: flashattn's seconds are per rep the forward's plus the backward's (rep i with
rep i), then the best (and median) of those sums, as each peer's best combined step.

Every peer checks its output against float64 before it is timed (peers.py, naive_openblas.c);
one that fails shows WRONG in the table and is not timed. In each round a case runs
flashattn and each peer as a process of its own, in an order rotated by one each round (the
VM slows the second of two back-to-back runs by about 3%).
"""
import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run_json(cmd, env, timeout, stderr_lines=None):
    """Runs cmd; returns the JSON objects it printed on stdout (one per line); its stderr's
    lines are added to stderr_lines when given."""
    log("$ " + " ".join(shlex.quote(c) for c in cmd))
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        log(f"  timed out after {timeout} s")
        return [{"error": f"timed out after {timeout} s"}]
    except OSError as e:
        return [{"error": str(e)}]
    if stderr_lines is not None:
        stderr_lines += p.stderr.splitlines()
    out = []
    for line in p.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    if p.returncode != 0 and not out:
        tail = (p.stderr.strip().splitlines() or ["?"])[-1]
        out = [{"error": f"exit {p.returncode}: {tail}"}]
    log(f"  ({time.time() - t0:.1f} s)")
    return out


def append_cpu_section(path, text):
    """Adds text at the end of the '## CPU' section of RESULTS.md (made if missing), so the
    sections other benchmarks keep there (CUDA) stay whole."""
    try:
        with open(path) as f:
            doc = f.read()
    except FileNotFoundError:
        doc = "# Benchmark results\n"
    head = "\n## CPU\n"
    if head not in doc:
        doc = doc.rstrip("\n") + "\n" + head + "\nRuns of `bash bench/run.sh` (see bench/suite.py for what is measured).\n"
    start = doc.index(head) + len(head)
    nxt = doc.find("\n## ", start)
    if nxt < 0:
        doc = doc.rstrip("\n") + "\n" + text
    else:
        doc = doc[:nxt].rstrip("\n") + "\n" + text + doc[nxt:]
    with open(path, "w") as f:
        f.write(doc)


def useful_flops(c, backward=False):
    """Forward 4 B H S^2 D (causal: the visible pairs); with backward, forward + backward:
    3.5x (the backward's 2.5x, FlashAttention-2's convention, plus the forward)."""
    B, H, S, D = c["batch"], c["heads"], c["seq"], c["head_dim"]
    pairs = S * (S + 1) // 2 if c.get("causal") else S * S
    f = 2 * (2 * D) * pairs * B * H
    return f * 7 // 2 if backward else f


# The CPU training targets (issue 12), each checked on the median over rounds; the range shows
# how far single rounds strayed. (case, what, kind, goal): kind "peer" compares with torch SDPA
# or OpenBLAS (speed-up), "peak" with the machine's peak, "bwd" the backward's useful rate
# against the forward's.
TARGETS = [
    ("fwd+bwd f32 S4096 D128", "torch SDPA (f32)", "peer", 1.15),
    ("fwd+bwd f32 causal S4096 D128", "torch SDPA (f32)", "peer", 1.15),
    ("fwd+bwd bf16 S4096 D128", "torch SDPA (bf16)", "peer", 1.4),
    ("fwd+bwd bf16 causal S4096 D128", "torch SDPA (bf16)", "peer", 1.4),
    ("fwd f32 B1 H8 S4096 D128", "torch SDPA (f32)", "peer", 1.15),
    ("fwd bf16 S4096 D128", "torch SDPA (bf16)", "peer", 1.7),
    ("fwd f32 B1 H8 S4096 D128", "naive OpenBLAS (f32)", "peer", 1.3),
    ("fwd bf16 S4096 D128", "bf16 peak", "peak", 80),  # the peak of flashattn's ISA (peak_of)
    ("fwd f32 B1 H8 S4096 D128", "FMA peak", "peak", 85),
    ("fwd+bwd f32 S4096 D128", "", "bwd", 0.75),
    ("fwd+bwd bf16 S4096 D128", "", "bwd", 0.75),
]


def target_lines(summary, med, span):
    """The targets table (markdown lines), from the rounds' figures; [] if none of its cases ran."""
    out = ["Targets (B=1 H=8 S=4096 D=128, 2 threads; median over rounds, range in parentheses; "
           "useful flops for every implementation):", "",
           "| target | measured | goal | met |", "| --- | ---: | ---: | --- |"]
    n = 0
    for name, what, kind, goal in TARGETS:
        sm = summary.get(name)
        if not sm or not sm["ours"]:
            continue
        if kind == "peer":
            xs = sm["ratio"].get(what, [])
            label, fmt, unit = f"{name}: speed-up vs {what}", "{:.2f}x", "x"
        elif kind == "peak":
            xs = sm.get("pct", [])
            label, fmt, unit = f"{name}: % of the {sm.get('peak_name', what)} (executed flops)", "{:.0f}%", "%"
        else:  # the backward's useful rate / the forward's, (2.5 F / t_bwd) / (F / t_fwd), one process
            xs = sm.get("bwd_rate", [])
            label, fmt, unit = f"{name}: backward useful rate / forward's", "{:.2f}", ""
        if not xs:
            continue
        n += 1
        out.append(f"| {label} | {span(xs, fmt)} | >= {goal}{unit} | {'yes' if med(xs) >= goal else 'NO'} |")
    preds = [x for sm in summary.values() for x in sm.get("pred", [])]
    if preds:
        n += 1
        worst = max(abs(x - 1) for x in preds)
        out.append(f"| predicted vs measured seconds, every row and round | {min(preds):.2f}-{max(preds):.2f} | "
                   f"within 20% | {'yes' if worst <= 0.2 else 'NO'} |")
    return out if n else []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", action="store_true", help="run only the seed problem (long)")
    ap.add_argument("--quick", action="store_true", help="headline case only")
    ap.add_argument("--no-append", action="store_true")
    ap.add_argument("--runs", type=int, default=int(os.environ.get("BENCH_RUNS", "3")),
                    help="rounds of the suite (each case once per round, rounds interleaved: a "
                         "load that comes and goes moves every case alike); the table gives the "
                         "median over rounds and the range (default 3, env BENCH_RUNS)")
    ap.add_argument("--blocks", default="",
                    help="BQxBK: flashattn's tile instead of the plan's default (e.g. 256x128)")
    ap.add_argument("--seed-heads", type=int, default=0,
                    help="heads of the seed problem actually run (of 576; 0: all)")
    args = ap.parse_args()

    build = os.path.join(ROOT, args.build) if not os.path.isabs(args.build) else args.build
    venv_py = os.path.join(HERE, ".venv", "bin", "python")
    if not os.path.exists(venv_py):  # the project's shared venv, where bench/setup.sh made none
        venv_py = os.path.expanduser("~/.cache/flashattn/venv/bin/python")
    have_venv = os.path.exists(venv_py)
    T = str(args.threads)
    log("inputs: fixed seeds: bench_fa fills q, k, v, do from seeds 1-4; peers.py numpy default_rng(0); "
        "naive_openblas a fixed LCG (0x9e3779b97f4a7c15)")
    env = dict(os.environ, OMP_NUM_THREADS=T, OPENBLAS_NUM_THREADS=T, OPENBLAS_CORETYPE="SKYLAKEX")
    env.pop("FA_ISA", None)

    # ---- the machine's peak ---------------------------------------------------------
    # Measured at the start and again at the end; the best of the two counts, since a busy
    # machine (other jobs on the 2 cores) can only lower it.
    peak = {}

    def measure_peak():
        r = run_json([os.path.join(build, "peak"), T], env, 120)
        if not r or "error" in r[0]:
            return
        for k, v in r[0].items():
            if not v:
                peak.setdefault(k, v)
                continue
            cur = peak.setdefault(k, {})
            for t, g in v.items():
                cur[t] = max(cur.get(t, 0), g)

    measure_peak()
    # The rates `plan` predicts from (cached for these threads; rates.h)
    run_json([os.path.join(build, "flashattn"), "calibrate", "--threads", T, "--json"], env, 300)

    def predicted(c):
        """flashattn plan's predicted seconds for the case (fwd+bwd: the sum), or None."""
        cmd = [os.path.join(build, "flashattn"), "plan", "--batch", str(c["batch"]), "--heads", str(c["heads"]),
               "--seq", str(c["seq"]), "--head-dim", str(c["head_dim"]), "--dtype", c["dtype"], "--threads", T,
               "--backend", "cpu", "--json"] + block_args
        if c["causal"]:
            cmd.append("--causal")
        r = run_json(cmd, env, 60)
        ps = r[-1].get("predicted_seconds") if r else None
        if not ps:
            return None
        return ps["forward"] + ps["backward"] if c["backward"] else ps["forward"]

    def peak_of(dtype, isa):
        """(the peak of the ISA flashattn ran for dtype, its name): bf16 multiplies in the AMX
        tiles under "amx", with vdpbf16ps under "avx512bf16"; everything else in f32 FMAs."""
        key, name = "fma_f32", "FMA peak"
        if dtype == "bf16" and isa == "amx":
            key, name = "amx_bf16", "AMX bf16 peak"
        elif dtype == "bf16" and isa == "avx512bf16":
            key, name = "dpbf16", "vdpbf16ps peak"
        v = peak.get(key) or {}
        return v.get(T), name

    rows = []  # (case, ours record, [peer records])
    block_args = []
    if args.blocks:
        bq, bk = args.blocks.lower().split("x")
        block_args = ["--block-q", bq, "--block-k", bk]

    specs = []  # (case, a function that runs one round of it: (ours, [peer records]))

    def case(name, **kw):
        specs.append(make_case(name, **kw))

    def make_case(name, B=1, H=8, S=4096, D=128, dtype="f32", causal=False, backward=False, reps=3,
                peers=("openblas", "numpy", "jax", "torch"), cli=False, isa=None, timeout=900):
        c = {"name": name, "batch": B, "heads": H, "seq": S, "head_dim": D, "dtype": dtype,
             "causal": causal, "backward": backward}
        return c, lambda r: one_round(c, B, H, S, D, dtype, causal, backward, reps, peers, cli, isa, timeout, r)

    said = set()  # the skips already said once

    def openblas_missing():
        """Why build/naive_openblas is not there."""
        try:
            with open(os.path.join(build, "CMakeCache.txt")) as f:
                if "FA_OPENBLAS_LIB-NOTFOUND" in f.read():
                    return "skipped: CMake found no libopenblas (install libopenblas-dev)"
        except OSError:
            pass
        return "skipped: not built (cmake --build BUILD --target naive_openblas)"

    def one_round(c, B, H, S, D, dtype, causal, backward, reps, peers, cli, isa, timeout, r):
        """Round r of the case: flashattn and each peer, a process each, in an order rotated by
        one each round; returns (ours, [peer records]), the peers in a fixed order."""
        def ours_run():
            cmd = [os.path.join(build, "bench_fa"), "--batch", str(B), "--heads", str(H), "--seq", str(S),
                   "--head-dim", str(D), "--dtype", dtype, "--threads", T, "--reps", str(reps), "--json"]
            if causal:
                cmd.append("--causal")
            if backward:
                cmd += ["--backward"]  # the forward is timed too: the row is forward + backward
            cmd += block_args
            e = dict(env)
            if isa:
                e["FA_ISA"] = isa
            err = []
            ours = run_json(cmd, e, timeout, err)[-1]
            if backward:  # rep i's forward + rep i's backward (bench_fa's progress lines)
                t = {"forward": [], "backward": []}
                for line in err:
                    m = re.match(r"\s*(forward|backward) rep \d+: ([0-9.]+) s", line)
                    if m:
                        t[m.group(1)].append(float(m.group(2)))
                ours["step_seconds"] = sorted(f + b for f, b in zip(t["forward"], t["backward"]))
            return ours

        def cli_run():
            cc = [os.path.join(build, "flashattn"), "bench", "--batch", str(B), "--heads", str(H), "--seq",
                  str(S), "--head-dim", str(D), "--dtype", dtype, "--threads", T, "--backend", "cpu", "--json"]
            if causal:
                cc.append("--causal")
            cc += block_args  # the same tiles as bench_fa's row
            rr = run_json(cc, env, timeout)[-1]
            if "error" in rr:
                rec = rr
            elif backward:
                f, b = rr.get("forward", {}), rr.get("backward", {})
                rec = {"seconds": f["seconds"] + b["seconds"]} if "seconds" in f and "seconds" in b else {}
            else:
                rec = rr.get("forward", {})
            return [dict(rec, peer="flashattn CLI")]

        def openblas_run():
            exe = os.path.join(build, "naive_openblas")
            if not os.path.exists(exe):
                why = openblas_missing()
                if why not in said:
                    said.add(why)
                    log(f"naive OpenBLAS (f32): {why}")
                return [{"peer": "naive OpenBLAS (f32)", "skipped": why}]
            cmd = [exe, str(B), str(H), str(S), str(D), "--reps",
                   str(min(reps, 2) if S >= 16384 else reps), "--json"]
            if causal:
                cmd.append("--causal")
            return [dict(run_json(cmd, env, timeout)[-1], peer="naive OpenBLAS (f32)")]

        def py_run(peer):
            cmd = [venv_py, os.path.join(HERE, "peers.py"), "--batch", str(B), "--heads", str(H), "--seq", str(S),
                   "--head-dim", str(D), "--dtype", dtype, "--threads", T, "--reps",
                   str(1 if S >= 16384 else reps), "--peers", peer, "--json"]
            if causal:
                cmd.append("--causal")
            if backward:
                cmd.append("--backward")
            out = []
            label = {"numpy": "numpy naive", "jax": "jax.nn.dot_product_attention", "torch": "torch SDPA"}
            for rr in run_json(cmd, env, timeout):
                if "peer" in rr:
                    out.append(dict(rr, peer=f"{label.get(rr['peer'], rr['peer'])} ({rr.get('dtype', dtype)})"))
            if not out:  # the process failed before it reported (an import, a crash): a row saying so
                why = next((rr["error"] for rr in run_json(cmd, env, timeout) if "error" in rr), "no output")
                out.append({"peer": f"{label.get(peer, peer)} ({dtype})", "error": f"error: {why}"})
            return out

        runs = [ours_run]
        if cli and os.path.exists(os.path.join(build, "flashattn")):
            runs.append(cli_run)
        if "openblas" in peers and dtype == "f32" and not backward:
            runs.append(openblas_run)
        if have_venv:
            runs += [lambda p=p: py_run(p) for p in peers if p in ("numpy", "jax", "torch")]
        turn = r % len(runs)
        done = {}
        for fn in runs[turn:] + runs[:turn]:
            done[fn] = fn()
        return done[ours_run], [rec for fn in runs[1:] for rec in done[fn]]

    started = time.time()
    load_start = f"{os.getloadavg()[0]:.2f}"
    if args.seed:
        # The seed problem: B=18 H=32 S=16384 D=256 bf16 forward, 1.6e14 flops: about 10 min
        # on 2 cores, timed once (--reps 0: no warm-up run). bench_fa allocates and fills the
        # full tensors, so its peak RSS is the problem's real memory need.
        # --seed-heads N runs only N of the 576 heads (through views) and scales the time.
        B, H, S, D = 18, 32, 16384, 256
        cmd = [os.path.join(build, "bench_fa"), "--batch", str(B), "--heads", str(H), "--seq", str(S),
               "--head-dim", str(D), "--dtype", "bf16", "--threads", T, "--reps", "0", "--json"] + block_args
        if args.seed_heads:
            cmd += ["--run-heads", str(args.seed_heads)]
        ours = run_json(cmd, env, 4 * 3600)[-1]
        part = f", {args.seed_heads} of 576 heads run" if args.seed_heads else ""
        c = {"name": f"seed problem B=18 H=32 S=16384 D=256 bf16 fwd{part}",
             "batch": B, "heads": H, "seq": S, "head_dim": D, "dtype": "bf16", "causal": False,
             "backward": False}
        rows.append((c, [ours], {}))
    else:
        case("fwd f32 B1 H8 S4096 D128", cli=True)
        if not args.quick:
            case("fwd f32 causal S4096 D128", causal=True)
            case("fwd bf16 S4096 D128", dtype="bf16", peers=("jax", "torch"))
            case("fwd f16 S4096 D128", dtype="f16", peers=("torch",), reps=2)
            case("fwd f32 S4096 D64", D=64, peers=("openblas", "torch"))
            case("fwd f32 S4096 D256", D=256, peers=("openblas", "torch"))
            case("fwd f32 S1024 D128", S=1024, peers=("openblas", "numpy", "jax", "torch"))
            case("fwd f32 S16384 D128", S=16384, reps=1, peers=("openblas", "torch"))
            case("fwd+bwd f32 S4096 D128", backward=True, peers=("jax", "torch"))
            case("fwd+bwd f32 causal S4096 D128", causal=True, backward=True, peers=("torch",))
            case("fwd+bwd bf16 S4096 D128", dtype="bf16", backward=True, peers=("torch",))
            case("fwd+bwd bf16 causal S4096 D128", dtype="bf16", causal=True, backward=True, peers=("torch",))
            case("fwd bf16 causal S4096 D128", dtype="bf16", causal=True, peers=("torch",))
        # Rounds: every case once per round, so a load that comes and goes touches all alike.
        runs = max(1, args.runs)
        results = [([], {}) for _ in specs]  # per case: ours per round, peer label -> records
        for r in range(runs):
            log(f"[bench] round {r + 1} of {runs}")
            for (c, go), (ours_l, peer_d) in zip(specs, results):
                ours, peer_recs = go(r)
                ours_l.append(ours)
                for pr in peer_recs:
                    peer_d.setdefault(pr["peer"], []).append(pr)
        for (c, _), (ours_l, peer_d) in zip(specs, results):
            c["predicted"] = predicted(c)
            rows.append((c, ours_l, peer_d))
    elapsed = time.time() - started
    measure_peak()

    # ---- the table --------------------------------------------------------------------
    def med(xs):
        xs = sorted(xs)
        n = len(xs)
        return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2

    def span(xs, fmt):
        """median, and the range over rounds where there was more than one"""
        if not xs:
            return ""
        m = fmt.format(med(xs))
        return m if len(xs) == 1 else f"{m} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"

    def ours_round(c, ours):
        """One round of flashattn: (seconds, executed flops, median seconds) or None."""
        pas = "backward" if c["backward"] else "forward"
        rec = ours.get(pas) if isinstance(ours, dict) else None
        if not rec:
            return None
        if c["backward"]:  # forward + backward: per rep the two passes' sum, best and median of those
            f = ours.get("forward") or {}
            if f.get("seconds"):  # the backward's useful rate over the forward's, same process
                bwd_rate.setdefault(c["name"], []).append(2.5 * f["seconds"] / rec["seconds"])
            step = ours.get("step_seconds") or [rec["seconds"] + f.get("seconds", 0)]
            rec = dict(rec, seconds=step[0], median_seconds=step[len(step) // 2],
                       flops=rec["flops"] + f.get("flops", 0))
        subset = ours.get("run_heads", 0) and ours["run_heads"] < c["batch"] * c["heads"]
        # a subset of the heads timed: the full problem's seconds (estimated) with its flops,
        # the subset's scaled by the heads (each head executes the same count)
        secs = rec.get("estimated_full_seconds", rec["seconds"]) if subset else rec["seconds"]
        flops = rec["flops"] * c["batch"] * c["heads"] / ours["run_heads"] if subset else rec["flops"]
        return secs, flops, rec.get("median_seconds", rec["seconds"])

    bwd_rate = {}  # case name -> per round: (2.5 F / backward s) / (F / forward s)
    summary = {}  # case name -> {"ours": [s per round], "pct": [...], "ratio": {peer: [...]}, ...}
    lines = []
    lines.append("| case | flashattn s | GFLOP/s useful (executed) | % peak | isa, blocks | pred s | meas/pred | peer | "
                 "peer s | peer GFLOP/s | flashattn speed-up |")
    lines.append("| --- | ---: | ---: | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: |")
    for c, ours_l, peer_d in rows:
        pas = "backward" if c["backward"] else "forward"
        uf = useful_flops(c, c["backward"])
        per = [ours_round(c, o) for o in ours_l]
        ok = [x for x in per if x]
        secs_l = [x[0] for x in ok]
        sm = {"ours": secs_l, "ratio": {}, "case": c, "bwd_rate": bwd_rate.get(c["name"], [])}
        summary[c["name"]] = sm
        first = next((o for o in ours_l if isinstance(o, dict) and o.get(pas)), {})
        pk, sm["peak_name"] = peak_of(c["dtype"], first.get("isa"))
        if ok:
            g_l = [uf / x[0] * 1e-9 for x in ok]
            ge_l = [x[1] / x[0] * 1e-9 for x in ok]
            sm["pct"] = [100 * g / pk for g in ge_l] if pk else []
            blocks = first.get("blocks", {}).get(pas, ["?", "?"])
            ours_s = span(secs_l, "{:.3f}")
            ours_g = f"{med(g_l):.1f} ({med(ge_l):.1f})"
            frac = f"{span(sm['pct'], '{:.0f}%')} ({sm['peak_name'].split(' peak')[0]})" if pk else "?"
            ours_isa = f"{first.get('isa')}, {blocks[0]}x{blocks[1]}"
        else:
            bad = next((o for o in ours_l if isinstance(o, dict)), {})
            ours_s, ours_g, frac, ours_isa = "error", bad.get("error", "?"), "", ""
        pred_s, pred_r = "", ""
        if ok and c.get("predicted"):
            pred_s = f"{c['predicted']:.3f}"
            sm["pred"] = [x[2] / c["predicted"] for x in ok]
            pred_r = span(sm["pred"], "{:.2f}")
        peers = list(peer_d.items()) or [("-", [])]
        for i, (label, recs) in enumerate(peers):
            timed_l = [(k, p["seconds"]) for k, p in enumerate(recs) if "seconds" in p]
            if timed_l:
                ps_l = [t for _, t in timed_l]
                # the ratio round by round (a peer and flashattn measured side by side)
                ratios = [t / per[k][0] for k, t in timed_l if k < len(per) and per[k]]
                sm["ratio"][label] = ratios
                pcells = (f"{span(ps_l, '{:.3f}')} | {med([uf / t * 1e-9 for t in ps_l]):.1f} | "
                          f"{span(ratios, '{:.2f}x')}" if ratios else f"{span(ps_l, '{:.3f}')} | | ")
            else:
                why = next((p.get("wrong") or p.get("skipped") or p.get("error") for p in recs
                            if p.get("wrong") or p.get("skipped") or p.get("error")), "")
                why = f"**{why}**" if why.startswith("WRONG") else why
                pcells = f"{why} | | " if why else " | | "
            f0 = i == 0
            lines.append(f"| {c['name'] if f0 else ''} | {ours_s if f0 else ''} | {ours_g if f0 else ''} | "
                         f"{frac if f0 else ''} | {ours_isa if f0 else ''} | {pred_s if f0 else ''} | "
                         f"{pred_r if f0 else ''} | {label} | {pcells} |")
        if c.get("name", "").startswith("seed") and ok:
            ours = ours_l[0]
            secs = secs_l[0]
            lines.append("")
            lines.append(f"Seed problem: peak RSS {ours.get('peak_rss_gb', 0):.1f} GiB with the full q, k, v, o "
                         f"tensors allocated and filled; the plan's peak {ours.get('plan_peak_bytes', 0) / 2**30:.1f} GiB; "
                         f"the naive reference would need {ours.get('plan_naive_peak_bytes', 0) / 1e9:.0f} GB "
                         f"(inputs, outputs and the {c['batch'] * c['heads'] * c['seq'] ** 2 * 4 / 1e9:.0f} GB f32 "
                         f"score matrix). Time for all 576 heads: {secs:.0f} s "
                         f"({secs / 60:.1f} min)" + ("" if ours.get("run_heads") == 576 else
                         f", estimated from {ours.get('run_heads')} heads") + ".")
    targets = target_lines(summary, med, span)
    if targets:
        lines += [""] + targets
    peak_line = "peak (GFLOP/s, measured by bench/peak): " + ", ".join(
        f"{k} {v}" for k, v in peak.items()) if peak else "peak: not measured"
    table = "\n".join(lines)
    print(table)
    print(peak_line)

    if not args.no_append:
        try:
            model = [l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True).stdout.splitlines()
                     if l.startswith("Model name")][0]
        except Exception:
            model = "?"
        nproc = os.cpu_count()
        text = (f"\n### CPU run {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}\n\n"
                f"Command: `bash bench/run.sh{' --seed' if args.seed else ''}{' --quick' if args.quick else ''}"
                f"{' --blocks ' + args.blocks if args.blocks else ''}`, {max(1, args.runs)} rounds "
                f"({args.threads} threads, {elapsed / 60:.1f} min). Machine: {model}, {nproc} CPUs "
                f"(`lscpu`). {peak_line}.\n\n"
                "Useful flops (the same count for every implementation): forward 4*B*H*Sq*Sk*D "
                "(causal: the visible pairs, about half); fwd+bwd rows time forward + backward "
                "for flashattn and every peer alike and count 3.5x (backward 2.5x the forward); "
                "flashattn's step is rep i's forward + rep i's backward. "
                "GFLOP/s: useful, then in parentheses flashattn's executed flops (the plan's count); "
                "% peak uses the executed figure, over the peak of the ISA flashattn ran (named in the cell). "
                "Every peer is checked against float64 before it is timed (WRONG: failed, not timed); "
                "flashattn and the peers run in an order rotated each round. Seconds: the best of the reps within a round, then the median "
                f"over {max(1, args.runs)} rounds of the suite (range in parentheses); speed-up = peer seconds / "
                "flashattn seconds, taken round by round (median, range). pred s: `flashattn plan`'s predicted "
                "seconds from `flashattn "
                "calibrate`'s rates (run at the start); meas/pred = flashattn's median / predicted. "
                f"Load average at the start {load_start}, at the end {os.getloadavg()[0]:.2f} "
                "(2 cores: above ~0.5 means other work shared them).\n\n"
                + table + "\n")
        append_cpu_section(os.path.join(HERE, "RESULTS.md"), text)
        log(f"appended to {os.path.join(HERE, 'RESULTS.md')}")


if __name__ == "__main__":
    main()
