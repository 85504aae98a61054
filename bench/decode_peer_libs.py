"""flashattn's and PyTorch's decode steps for bench/decode_peers.py, one worker process each
(decode_data.serve):

    python bench/decode_peer_libs.py IMPL [--cache-len N] [--threads T]

IMPL: flashattn-bf16, flashattn-f16, flashattn-int8, flashattn-fp8 (flashattn's numpy API,
kvcache_attention, caches [1, S, Hk, D] on 2 MiB pages, threads from OMP_NUM_THREADS), and
torch-folded-bf16, torch-folded-f16, torch-gqa-bf16 (torch.nn.functional.
scaled_dot_product_attention on [1, H, S, D] tensors over the same kind of buffers: "folded"
puts the Hq / Hk query heads of a kv head on the query axis, [1, Hk, Hq / Hk, D] against
[1, Hk, S, D]; "gqa" passes q [1, Hq, 1, D] with enable_gqa=True). The flashattn workers run
where `import flashattn` finds the build (PYTHONPATH, FLASHATTN_LIBDIR), the torch ones in a
Python with torch.
"""
import inspect
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_data import TOLERANCE, Problem, huge_copy, log, serve, to_bf16_bits  # noqa: E402


class FlashAttn:
    """flashattn.kvcache_attention over full caches (cache_seqlens None: all S positions), no
    new tokens. int8 / fp8: the cache_dtype= argument with flashattn.quantize_cache, where the
    build has them; the bytes are those of the arrays it returns (elements and scales)."""

    def __init__(self, p, dtype):
        import ml_dtypes

        import flashattn as fa

        self.problem, self.fa = p, fa
        Hq, Hk, D, S = p.Hq, p.Hk, p.D, p.S
        self.kwargs = {}
        if dtype in ("bf16", "f16"):
            dt = ml_dtypes.bfloat16 if dtype == "bf16" else np.float16
            self.q = p.q.reshape(1, 1, Hq, D).astype(dt)
            self.kc, self.vc = huge_copy(p.k[None], dt), huge_copy(p.v[None], dt)
            self.bytes, self.tol = p.kv_bytes(2), TOLERANCE["16bit"]
        else:
            sig = inspect.signature(fa.kvcache_attention).parameters
            if "cache_dtype" not in sig or not hasattr(fa, "quantize_cache"):
                raise LookupError("not available in this build (no cache_dtype= / flashattn.quantize_cache)")
            self.q = p.q.reshape(1, 1, Hq, D).astype(ml_dtypes.bfloat16)
            # quantize_cache(k, v, dtype) -> (k codes, k scales, v codes, v scales), a scale per
            # row (token, kv head); the bytes a step reads are counted from these arrays
            try:
                kc, ks, vc, vs = fa.quantize_cache(p.k[None].astype(ml_dtypes.bfloat16),
                                                   p.v[None].astype(ml_dtypes.bfloat16), dtype)
            except (TypeError, ValueError) as e:
                raise LookupError(f"cache_dtype= exists but flashattn.quantize_cache(k, v, dtype) -> (k codes, "
                                  f"k scales, v codes, v scales), which this script calls, failed: {e}") from e
            self.kc, self.vc = huge_copy(np.asarray(kc)), huge_copy(np.asarray(vc))
            self.kwargs = dict(cache_dtype=dtype, k_scale=huge_copy(np.asarray(ks)), v_scale=huge_copy(np.asarray(vs)))
            self.bytes = float(sum(np.asarray(x).nbytes for x in (kc, ks, vc, vs)))
            self.tol = TOLERANCE["int8" if dtype == "int8" else "fp8"]
        self.o = np.empty((1, 1, Hq, D), self.q.dtype)
        self.info = dict(version=getattr(fa, "__version__", "?"), cache=dtype)

    def step(self):
        self.fa.kvcache_attention(self.q, self.kc, self.vc, out=self.o, **self.kwargs)

    def output(self):
        return self.o.astype(np.float32).reshape(self.problem.Hq, self.problem.D)


class Torch:
    def __init__(self, p, threads, layout, dtype):
        import torch

        torch.set_num_threads(threads)
        self.problem, self.torch = p, torch
        Hq, Hk, D, G = p.Hq, p.Hk, p.D, p.G

        def tensor(x):  # x [..] f32 -> a torch tensor of dtype over a buffer on 2 MiB pages
            if dtype == "bf16":
                return torch.from_numpy(huge_copy(to_bf16_bits(x).view(np.int16))).view(torch.bfloat16)
            return torch.from_numpy(huge_copy(x, np.float16))

        self.k = tensor(np.ascontiguousarray(p.k.transpose(1, 0, 2))[None])  # [1, Hk, S, D]
        self.v = tensor(np.ascontiguousarray(p.v.transpose(1, 0, 2))[None])
        qshape = (1, Hk, G, D) if layout == "folded" else (1, Hq, 1, D)
        self.q = tensor(p.q.reshape(qshape))
        self.gqa = layout == "gqa"
        self.o = None
        self.bytes, self.tol = p.kv_bytes(2), TOLERANCE["16bit"]
        self.info = dict(version=torch.__version__, cache=dtype)

    def step(self):
        with self.torch.no_grad():
            self.o = self.torch.nn.functional.scaled_dot_product_attention(self.q, self.k, self.v,
                                                                           enable_gqa=self.gqa)

    def output(self):
        return self.o.float().numpy().reshape(self.problem.Hq, self.problem.D)


def make(a):
    p = Problem(a.cache_len)
    parts = a.impl.split("-")
    try:
        if parts[0] == "flashattn":
            return FlashAttn(p, parts[1])
        if parts[0] == "torch":
            return Torch(p, a.threads, parts[1], parts[2])
    except ImportError as e:
        return f"not installed ({e})"
    except LookupError as e:
        return str(e)
    return f"unknown peer {a.impl}"


if __name__ == "__main__":
    log(f"decode peer {sys.argv[1:]}")
    serve(make)
