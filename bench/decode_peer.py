"""PyTorch's CPU attention on flashattn's decode benchmark shape, timed in the same run.

    python bench/decode_peer.py --batch 1 --heads 32 --kv-heads 8 --head-dim 128 \
        --cache-len 32768 [--seq-q 1] [--dtype bf16] [--threads 2] [--iters 20]

torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True) with q
[B, Hq, Sq_new, D] and k, v [B, Hk, cache_len, D] (the cache holds exactly cache_len tokens,
so no mask is needed for Sq_new = 1; for Sq_new > 1 a bottom-right causal mask is passed).
Prints one JSON line: median seconds and bytes of cache read per second (the cache's bytes,
as flashattn's bench counts them).
"""
import json

import torch

from peers import shape_parser, timed  # bench/ is on the path: this script's own folder


def main():
    ap = shape_parser(__doc__, 32, ["bf16", "f32"], "bf16")
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--cache-len", type=int, default=32768)
    ap.add_argument("--seq-q", type=int, default=1)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)
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
        times = timed(step, a.iters)  # sorted, after a warm-up call
    med = times[len(times) // 2]
    cache = a.batch * a.kv_heads * a.cache_len * 2 * a.head_dim * q.element_size()
    print(json.dumps({"impl": "torch-sdpa-gqa", "torch": torch.__version__, "seconds": med,
                      "cache_bytes": cache, "gbytes_per_s": cache / med * 1e-9, "threads": a.threads}))


if __name__ == "__main__":
    main()
