"""PyTorch's CPU attention on flashattn's decode benchmark shape, timed in the same run.

    python bench/decode_peer.py --batch 1 --heads 32 --kv-heads 8 --head-dim 128 \
        --cache-len 32768 [--seq-q 1] [--dtype bf16] [--threads 2] [--iters 20]

torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True) with q
[B, Hq, Sq_new, D] and k, v [B, Hk, cache_len, D] (the cache holds exactly cache_len tokens,
so no mask is needed for Sq_new = 1; for Sq_new > 1 a bottom-right causal mask is passed).
Prints one JSON line: median seconds and bytes of cache read per second (the cache's bytes,
as flashattn's bench counts them). Before it is timed, the step's output is checked against
float64 on the same inputs (error over max |reference| within peers.TOL: bf16 4e-2 as
bench/decode_peers.py, f32 1e-4); a wrong one prints a JSON line with "wrong" and is not
timed. Inputs: torch.Generator seed 0 (fixed), uniform in [-1, 1) rounded to --dtype.
"""
import json
import sys

import torch

from peers import TOL, shape_parser, timed  # bench/ is on the path: this script's own folder

SEED = 0


def reference(q, k, v, mask):
    """float64 attention, kv head by kv head (query head h reads kv head h // (Hq / Hk))."""
    rep = q.shape[1] // k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for g in range(k.shape[1]):
        qg, kg, vg = q[:, g * rep:(g + 1) * rep].double(), k[:, g:g + 1].double(), v[:, g:g + 1].double()
        s = qg @ kg.transpose(-1, -2) / q.shape[-1] ** 0.5
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        out[:, g * rep:(g + 1) * rep] = torch.softmax(s, dim=-1) @ vg
    return out


def main():
    ap = shape_parser(__doc__, 32, ["bf16", "f32"], "bf16")
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--cache-len", type=int, default=32768)
    ap.add_argument("--seq-q", type=int, default=1)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    print(f"inputs: seed {SEED} (fixed), torch.Generator, uniform [-1, 1) in {a.dtype}", file=sys.stderr)
    g = torch.Generator().manual_seed(SEED)
    q = torch.rand(a.batch, a.heads, a.seq_q, a.head_dim, generator=g).to(dt) * 2 - 1
    k = torch.rand(a.batch, a.kv_heads, a.cache_len, a.head_dim, generator=g).to(dt) * 2 - 1
    v = torch.rand(a.batch, a.kv_heads, a.cache_len, a.head_dim, generator=g).to(dt) * 2 - 1
    mask = None
    if a.seq_q > 1:  # query i sits at cache_len - seq_q + i
        i = torch.arange(a.seq_q)[:, None] + a.cache_len - a.seq_q
        mask = torch.arange(a.cache_len)[None, :] <= i

    def step():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    with torch.no_grad():
        ref = reference(q, k, v, mask)
        out = step().double()
        err = float((out - ref).abs().max()) if bool(torch.isfinite(out).all()) else float("inf")
        rel = err / float(ref.abs().max())
        chk = {"check_max_abs_err": err, "check_rel_err": rel, "check_tol": TOL[a.dtype]}
        if not rel <= TOL[a.dtype]:
            why = f"WRONG vs float64: error / max abs ref {rel:.2e} (tol {TOL[a.dtype]:g}); not timed"
            print(f"decode_peer: {why}", file=sys.stderr)
            print(json.dumps(dict(chk, impl="torch-sdpa-gqa", torch=torch.__version__, wrong=why)))
            sys.exit(1)
        times = timed(step, a.iters)  # sorted, after a warm-up call
    med = times[len(times) // 2]
    cache = a.batch * a.kv_heads * a.cache_len * 2 * a.head_dim * q.element_size()
    print(json.dumps({"impl": "torch-sdpa-gqa", "torch": torch.__version__, "seconds": med,
                      "cache_bytes": cache, "gbytes_per_s": cache / med * 1e-9, "threads": a.threads, **chk}))


if __name__ == "__main__":
    main()
