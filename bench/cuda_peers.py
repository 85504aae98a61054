"""GPU peers for bench/cuda_device_check.sh, and the table it prints last.

    python3 bench/cuda_peers.py time OURS_JSONL OUT_JSONL [ITERS]  time torch SDPA (flash, cuDNN)
    python3 bench/cuda_peers.py table OURS_JSONL PEERS_JSONL       print the combined table
    python3 bench/cuda_peers.py hopper-table JSONL...              bench/hopper_device_check.sh's

OURS_JSONL: bench/cuda_bench's lines; the peers run the same shapes (bf16, B H S D,
causal; the backward where ours timed one) and divide the same flop counts, flashattn's
plan figures (non-causal forward: 4 B H S^2 D). Timing: CUDA
events around each call, warm-up first, the median of `iters`. A peer that cannot run a
shape (backend refuses it, out of memory) is reported as n/a with the reason. Before it is
timed, each backend's forward output on the benchmark's inputs is checked against the math
backend in float32 on the first and the last (b, h) (CHECK_ROWS query rows: a causal mask is
top-left, so the first rows are the full problem's); error over max |reference| above
CHECK_TOL (bf16, as bench/decode_peers.py) is reported as WRONG and not timed. The
gradients are not checked. Inputs: torch.Generator seed 0 (fixed).
"""
import json
import sys

SEED = 0
CHECK_TOL = 4e-2  # bf16 against a float32 reference
CHECK_ROWS = 1024


def time_peers(ours_path, out_path, iters):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cases = []
    for line in open(ours_path):
        if line.strip().startswith("{"):
            r = json.loads(line)
            cases.append(dict(r, iters=iters, warmup=2 if r["S"] * r["B"] > 65536 else 3,
                              backward=1 if r.get("fwdbwd_ms") else 0))
    backends = [("torch-flash", SDPBackend.FLASH_ATTENTION), ("torch-cudnn", SDPBackend.CUDNN_ATTENTION)]
    out = open(out_path, "w")
    print(f"inputs: seed {SEED} (fixed), torch.Generator on cuda", file=sys.stderr, flush=True)

    def check(be, q, k, v, causal):
        """max error / max |reference| of backend be's output against the math backend in f32."""
        with sdpa_kernel([be]):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        worst = 0.0
        for b, h in ((0, 0), (q.shape[0] - 1, q.shape[1] - 1)):
            sl = lambda t: t[b:b + 1, h:h + 1].float()
            with sdpa_kernel([SDPBackend.MATH]):
                ref = F.scaled_dot_product_attention(sl(q)[:, :, :CHECK_ROWS], sl(k), sl(v), is_causal=causal)
            rel = (sl(o)[:, :, :CHECK_ROWS] - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)
            worst = max(worst, rel) if rel == rel else float("inf")  # NaN: wrong
        return worst

    def median_ms(fn, warmup, iters):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for a, b in evs:
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        t = sorted(a.elapsed_time(b) for a, b in evs)
        return t[len(t) // 2]

    for c in cases:
        B, H, S, D, causal = c["B"], c["H"], c["S"], c["D"], bool(c["causal"])
        iters, warmup = c.get("iters", 20), c.get("warmup", 3)
        for name, be in backends:
            rec = {"impl": name, "B": B, "H": H, "S": S, "D": D, "causal": int(causal)}
            try:
                g = torch.Generator(device="cuda").manual_seed(SEED)
                mk = lambda amp: ((torch.rand((B, H, S, D), device="cuda", generator=g) * 2 - 1) * amp).to(torch.bfloat16)
                q, k, v = mk(2.0), mk(2.0), mk(1.0)
                rel = check(be, q, k, v, causal)
                rec["check_rel_err"] = rel
                if not rel <= CHECK_TOL:
                    raise ValueError("WRONG vs the math backend: error / max abs ref %.2e (tol %g); not timed"
                                     % (rel, CHECK_TOL))
                with sdpa_kernel([be]):
                    fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    ms = median_ms(fwd, warmup, iters)
                    rec["fwd_ms"] = ms
                    rec["fwd_tflops"] = c["flops_fwd"] / (ms * 1e-3) / 1e12
                    if c.get("backward", 1):
                        qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
                        do = mk(1.0)

                        def fb():
                            o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                            o.backward(do)

                        ms2 = median_ms(fb, warmup, iters)
                        rec["fwdbwd_ms"] = ms2
                        rec["fwdbwd_tflops"] = (c["flops_fwd"] + c["flops_bwd"]) / (ms2 * 1e-3) / 1e12
                        del qg, kg, vg, do
                del q, k, v
            except Exception as e:  # a peer that cannot run this shape
                rec["error"] = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
            torch.cuda.empty_cache()
            print(json.dumps(rec), file=out, flush=True)
            print(json.dumps(rec), file=sys.stderr, flush=True)


def key(r):
    return (r["B"], r["H"], r["S"], r["D"], r["causal"])


def rows_and_shapes(paths):
    """Every JSON line of the files (a missing file is skipped), and their shapes in order."""
    rows = []
    for path in paths:
        try:
            rows += [json.loads(line) for line in open(path) if line.strip().startswith("{")]
        except OSError:
            pass
    shapes = []
    for r in rows:
        if key(r) not in shapes:
            shapes.append(key(r))
    return rows, shapes


def table(ours_path, peers_path):
    rows, shapes = rows_and_shapes((ours_path, peers_path))
    impls = ["flashattn", "torch-flash", "torch-cudnn"]
    f = lambda r, k: ("%.1f" % r[k]) if k in r and r[k] else "n/a"
    fm = lambda r, k: ("%.3f" % r[k]) if k in r and r[k] else "n/a"
    print("| shape (bf16) | impl | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | peak mem (measured / plan) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for s in shapes:
        for impl in impls:
            for r in rows:
                if key(r) == s and r["impl"] == impl:
                    mem = ""
                    if "peak_bytes_measured" in r:
                        mem = "%.2f / %.2f GiB" % (r["peak_bytes_measured"] / 2**30, r["peak_bytes_plan"] / 2**30)
                    note = (" (" + r["error"] + ")") if "error" in r else ""
                    print("| B=%d H=%d S=%d D=%d %s | %s%s | %s | %s | %s | %s | %s |"
                          % (s[0], s[1], s[2], s[3], "causal" if s[4] else "non-causal", impl, note,
                             fm(r, "fwd_ms"), f(r, "fwd_tflops"), fm(r, "fwdbwd_ms"), f(r, "fwdbwd_tflops"), mem))


def hopper_table(paths):
    """bench/hopper_device_check.sh's table: the forward of each kernel and the peers."""
    rows, shapes = rows_and_shapes(paths)
    print("forward, bf16, median ms; TFLOP/s of useful flops 4*B*H*S^2*D (causal: half)")
    print("| shape | impl | fwd ms | TFLOP/s | speed vs torch-cudnn |")
    print("| --- | --- | --- | --- | --- |")
    for s in shapes:
        B, H, S, D, c = s
        useful = 4.0 * B * H * S * S * D * (0.5 if c else 1.0)
        ref = [r["fwd_ms"] for r in rows if key(r) == s and r["impl"] == "torch-cudnn" and r.get("fwd_ms")]
        for impl in ("flashattn", "flashattn-hopper", "flashattn-hopper-pingpong", "torch-flash", "torch-cudnn"):
            for r in rows:
                if key(r) != s or r["impl"] != impl:
                    continue
                name = "B=%d H=%d S=%d D=%d %s" % (B, H, S, D, "causal" if c else "full")
                ms = r.get("fwd_ms")
                if not ms:
                    print("| %s | %s | n/a (%s) | | |" % (name, impl, r.get("error", "no time")))
                    continue
                ratio = "%.2fx" % (ref[0] / ms) if ref else "n/a"
                print("| %s | %s | %.3f | %.1f | %s |" % (name, impl, ms, useful / (ms * 1e-3) / 1e12, ratio))


if __name__ == "__main__":
    if len(sys.argv) in (4, 5) and sys.argv[1] == "time":
        time_peers(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) == 5 else 20)
    elif len(sys.argv) == 4 and sys.argv[1] == "table":
        table(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 3 and sys.argv[1] == "hopper-table":
        hopper_table(sys.argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
