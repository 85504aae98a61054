"""Decode against its peers, side by side: one new token over a kv cache (B = 1, Hq = 32,
Hk = 8, D = 128, --cache-len tokens, --threads threads), each implementation first checked
against float64, then timed in interleaved rounds with the streaming read in the same rounds.

    python3 bench/decode_peers.py [--cache-len 32768] [--rounds 3] [--iters 10] [--threads 2]
        [--only flashattn,ggml,...] [--record]

(bench/decode_peers.sh builds, installs the peers and runs this.) Implementations:
  flashattn CLI    `flashattn bench --decode --huge-pages` for bf16 and f16, and
                   `--cache-dtype int8|fp8` where the build has it (else "not available")
  flashattn python kvcache_attention (numpy), bf16, f16, and cache_dtype= int8 / fp8 where
                   the build has it: the checked path (decode_peer_libs.py)
  torch            F.scaled_dot_product_attention, heads folded (bf16, f16) and enable_gqa
  OpenVINO         fused SDPA in the stateful pattern, bf16 and u8 caches
  ggml             flash_attn_ext (ggml-python), f16 and q8_0 caches
  ONNX Runtime     com.microsoft GroupQueryAttention, f32 and f16
  (decode_peer_runtimes.py). Each Python implementation is a worker process that sets up
its cache once, checks its output against float64 (a wrong one is reported, not timed), and
times --iters steps (median, after one warm-up) each time the round comes to it. A round:
the streaming read (bench/bandwidth, 1 GiB on 2 MiB pages), then every implementation once,
in an order rotated by one each round. A figure is the median over rounds; "vs read" is the
median of the rounds' own ratios.

Prints a markdown section; --record appends it to bench/RESULTS.md.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
HOME = os.path.expanduser("~")

WORKERS = [  # (name, script, which python, label)
    ("flashattn-bf16", "libs", "bench", "flashattn python kvcache_attention, bf16 cache"),
    ("flashattn-f16", "libs", "bench", "flashattn python kvcache_attention, f16 cache"),
    ("flashattn-int8", "libs", "bench", "flashattn python kvcache_attention, int8 cache"),
    ("flashattn-fp8", "libs", "bench", "flashattn python kvcache_attention, fp8 e4m3 cache"),
    ("openvino-bf16", "runtimes", "bench", "OpenVINO stateful SDPA, bf16 cache"),
    ("openvino-u8", "runtimes", "bench", "OpenVINO stateful SDPA, u8 cache"),
    ("ggml-f16", "runtimes", "bench", "ggml flash_attn_ext, f16 cache"),
    ("ggml-q8_0", "runtimes", "bench", "ggml flash_attn_ext, q8_0 cache"),
    ("ort-f32", "runtimes", "bench", "ONNX Runtime GroupQueryAttention, f32 cache"),
    ("ort-f16", "runtimes", "bench", "ONNX Runtime GroupQueryAttention, f16 cache"),
    ("torch-folded-bf16", "libs", "test", "torch SDPA, heads folded, bf16"),
    ("torch-folded-f16", "libs", "test", "torch SDPA, heads folded, f16"),
    ("torch-gqa-bf16", "libs", "test", "torch SDPA, enable_gqa, bf16"),
]
CLI = [("bf16", 2, 0), ("f16", 2, 0), ("int8", 1, 4), ("fp8", 1, 4)]  # cache, element bytes, scale bytes per row


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache-len", type=int, default=32768)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated prefixes of the implementations to run")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--bench-python", default=os.path.join(HOME, ".cache/flashattn/bench-venv/bin/python"))
    ap.add_argument("--test-python", default=os.path.join(HOME, ".cache/flashattn/venv/bin/python"))
    ap.add_argument("--record", action="store_true")
    return ap.parse_args()


def wanted(a, name):
    return not a.only or any(name.startswith(p) for p in a.only.split(","))


class Worker:
    def __init__(self, a, name, script, py, label):
        self.name, self.label, self.ready, self.times = name, label, None, []
        exe = a.bench_python if py == "bench" else a.test_python
        env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), FLASHATTN_LIBDIR=a.build,
                   PYTHONPATH=os.path.join(ROOT, "python"))
        if name.startswith("openvino"):  # malloc's mmapped chunks on huge pages: the plugin allocates the cache
            env["GLIBC_TUNABLES"] = "glibc.malloc.hugetlb=1"
        cmd = [exe, os.path.join(HERE, f"decode_peer_{script}.py"), name, "--cache-len", str(a.cache_len),
               "--threads", str(a.threads)]
        if not os.path.exists(exe):
            self.ready = {"unavailable": f"no {exe} (run bench/setup.sh)"}
            return
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()
        try:
            self.ready = json.loads(line)
        except ValueError:
            self.ready = {"unavailable": f"the worker stopped ({self.proc.wait()})"}
        if not self.timed():
            self.close()

    def timed(self):
        return self.ready.get("ok") is True

    def time(self, iters):
        self.proc.stdin.write(f"time {iters}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["seconds"]

    def close(self):
        if getattr(self, "proc", None) and self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait()


class CliRow:
    """flashattn's own benchmark command, one process per round."""

    def __init__(self, a, cache, elem, scales):
        self.name, self.label = f"cli-{cache}", f"flashattn CLI bench --decode, {cache} cache"
        self.times, self.a = [], a
        dtype = ["--dtype", cache] if cache in ("bf16", "f16") else ["--dtype", "bf16", "--cache-dtype", cache]
        def cmd(n, iters, threads):
            return [os.path.join(a.build, "flashattn"), "bench", "--decode", "--batch", "1", "--heads", "32",
                    "--kv-heads", "8", "--head-dim", "128", "--cache-len", str(n), "--threads", str(threads),
                    "--iters", str(iters), "--json", "--huge-pages"] + dtype

        self.cmd = cmd(a.cache_len, a.iters, a.threads)
        self.bytes = a.cache_len * 8 * 2 * (128 * elem + scales)
        probe = subprocess.run(cmd(64, 1, 1), capture_output=True, text=True)  # does this build have it?
        self.ready = {"ok": True} if probe.returncode == 0 else {
            "unavailable": "not available in this build" if "unknown option" in probe.stderr else probe.stderr.strip()}
        self.huge = None

    def timed(self):
        return self.ready.get("ok") is True

    def time(self, iters):
        r = subprocess.run(self.cmd, capture_output=True, text=True, check=True)
        d = json.loads(r.stdout.strip().splitlines()[-1])["decode"]
        self.huge = d.get("huge_page_bytes")
        return d["seconds"]

    def close(self):
        pass


def bandwidth(a):
    exe = os.path.join(a.build, "bandwidth")
    r = subprocess.run([exe, "1024", str(a.threads), "5", "huge"], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["read_gbytes_per_s"]


def lscpu(field):
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    return next((ln.split(":", 1)[1].strip() for ln in out if ln.startswith(field + ":")), platform.processor() or "?")


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def table(a, rows, bw, ref):
    """rows: timed or not; ref: the row the ratios are against (flashattn CLI bf16)."""
    out = ["| implementation | check vs float64: max abs err (/ max abs ref) | seconds / step | GB/s of cache read "
           "| vs streaming read | time / flashattn bf16 | cache MiB (on huge pages: process MiB) |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    out.append(f"| streaming read (bench/bandwidth, 1 GiB, 2 MiB pages) | | | {med(bw):.2f} | 1.00 | | |")
    for r in rows:
        rd = r.ready
        if "unavailable" in rd:
            out.append(f"| {r.label} | {rd['unavailable']} | | | | | |")
            continue
        chk = "(CLI: random data, unchecked; see the python row)" if r.name.startswith("cli") else (
            f"{rd['max_abs_err']:.2e} ({rd['rel_err']:.1e}, tol {rd['tol']:g}) " + ("ok" if rd["ok"] else "**WRONG**"))
        if not r.timed():
            out.append(f"| {r.label} | {chk} | not timed | | | | |")
            continue
        nbytes = r.bytes if r.name.startswith("cli") else rd["cache_bytes"]
        s = med(r.times)
        frac = med([nbytes / t * 1e-9 / b for t, b in zip(r.times, bw)])
        rel = med([t / t0 for t, t0 in zip(r.times, ref.times)]) if ref and ref.timed() else float("nan")
        huge = r.huge if r.name.startswith("cli") else rd.get("huge_page_bytes")
        hp = f"{nbytes / 2**20:.0f} ({huge / 2**20:.0f})" if huge is not None and huge >= 0 else f"{nbytes / 2**20:.0f}"
        if "cache_huge_page_bytes" in rd:  # what the plugin's own allocations of its cache got
            hp = f"{nbytes / 2**20:.0f} (plugin's: {rd['cache_huge_page_bytes'] / 2**20:.0f})"
        out.append(f"| {r.label} | {chk} | {s:.5f} | {nbytes / s * 1e-9:.2f} | {frac:.2f} | {rel:.2f} | {hp} |")
    return "\n".join(out)


def main():
    a = parse()
    a.build = os.path.abspath(a.build)  # the workers' FLASHATTN_LIBDIR
    rows = []
    ref = None
    for cache, elem, scales in CLI:
        if wanted(a, f"cli-{cache}"):
            rows.append(CliRow(a, cache, elem, scales))
            if cache == "bf16":
                ref = rows[-1]
    for name, script, py, label in WORKERS:
        if wanted(a, name):
            log(f"decode_peers: setting up {name}")
            w = Worker(a, name, script, py, label)
            log(f"decode_peers: {name}: {json.dumps(w.ready)}")
            rows.append(w)
    timed = [r for r in rows if r.timed()]
    bw = []
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    for k in range(a.rounds):
        bw.append(bandwidth(a))
        log(f"decode_peers: round {k + 1}: streaming read {bw[-1]:.2f} GB/s")
        turn = k % len(timed) if timed else 0  # the order rotates by one each round
        for r in timed[turn:] + timed[:turn]:
            if not r.timed():
                continue
            try:
                r.times.append(r.time(a.iters))
            except (ValueError, KeyError, OSError, subprocess.CalledProcessError) as e:  # said, the others go on
                r.ready = {"unavailable": f"failed in round {k + 1}: {type(e).__name__}: {e}"}
                continue
            log(f"decode_peers: round {k + 1}: {r.name} {r.times[-1]:.5f} s")
    for r in rows:
        r.close()
    model, l3 = lscpu("Model name"), lscpu("L3 cache")
    tree = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or "not a git checkout"
    rounds = "; ".join(f"{r.name} " + " ".join(f"{t:.5f}" for t in r.times) for r in timed if r.timed())
    section = f"""
## Decode against its peers, {started} UTC

Command: `{' '.join(['python3', 'bench/decode_peers.py'] + sys.argv[1:])}` (run by `bash bench/decode_peers.sh`).
Machine: {model}, {os.cpu_count()} CPUs, load average {' '.join(open('/proc/loadavg').read().split()[:3])} at the end.
Tree: {tree}. B = 1, Hq = 32, Hk = 8, D = 128, one new token over {a.cache_len} cached tokens, {a.threads} threads,
{a.rounds} interleaved rounds of {a.iters} steps (median step after one warm-up) per implementation.

{table(a, rows, bw, ref)}

GB/s of cache read = (K and V bytes a step reads) / (seconds per step), with the bytes
S x Hk x 2 x (D x element bytes + scale bytes per row): bf16 / f16 2 bytes per element, f32 4;
int8 / fp8 1 byte plus one f32 scale per (token, kv head) row; OpenVINO u8 1 byte plus an f32
scale and an f32 zero point per row; ggml q8_0 34 bytes per 32 elements (an f16 scale per
32). "vs streaming read": the median over rounds of (that round's GB/s) / (that round's
streaming read); "time / flashattn bf16": the median over rounds of the step's seconds over
the flashattn CLI bf16 step's seconds in the same round (above 1: slower than our bf16). The
check runs each implementation's own first step on the benchmark's data (standard normal
values rounded to bf16, q x 2) against float64 on the same values; 8-bit caches are checked
against the unquantized values. OpenVINO's and ONNX Runtime's steps also append the new
token's k and v row (their ops take it as an input: OpenVINO's cache grows by a row a step
and is set back to S - 1 rows before each round's steps); the others read a cache that holds
it already.
Caches on 2 MiB pages: flashattn's CLI allocates its own (`--huge-pages`: aligned_alloc +
madvise(MADV_HUGEPAGE)); every Python worker's cache is a buffer this script maps and
madvises before the first touch (flashattn python, torch, ONNX Runtime through I/O binding,
ggml as its context's memory). OpenVINO's plugin allocates its cache itself: its worker runs
with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (malloc's mmapped chunks madvised), which is all
that can be controlled from outside; the last column shows what each process got (its
AnonHugePages, all its allocations; for OpenVINO the growth from setting the state and the
first step, i.e. the plugin's cache, which it allocates with room to grow).
L3: {l3}; a cache smaller than that can stay partly in it between steps, the streaming
read's 1 GiB cannot.
Rounds (seconds per step): {rounds}; streaming read {' '.join(f'{b:.2f}' for b in bw)} GB/s.
"""
    print(section)
    if a.record:
        with open(os.path.join(HERE, "RESULTS.md"), "a") as f:
            f.write(section)


if __name__ == "__main__":
    main()
