"""What every decode peer shares (bench/decode_peers.py): the problem, its data, arrays on
2 MiB pages, the float64 reference and the worker's loop.

The problem: B = 1 sequence, Hq query heads over Hk kv heads (query head h reads kv head
h // (Hq / Hk)), head dim D, one new query token attending to all `cache_len` positions of
the cache (the new token's own k and v are the cache's last row; peers whose op appends the
new row itself get the first cache_len - 1 rows as their past). Scale 1 / sqrt(D).

The data: standard normal values rounded to bfloat16 (so that bf16, f16 and f32 caches hold
the same numbers, up to f16's subnormals), q scaled by 2 so that the softmax is peaked
enough for an error to show. Every peer's output is compared with one float64 reference
computed from those values; a quantized cache's error is its quantization's.
"""
import json
import mmap
import sys
import time

import numpy as np

HUGE = 2 << 20


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def huge_empty(shape, dtype):
    """An uninitialised array on 2 MiB pages where the kernel grants them: a private
    anonymous mapping, 2 MiB-aligned, madvise(MADV_HUGEPAGE) before the first touch (transparent huge
    pages in 'madvise' mode; in 'always' mode it changes nothing, in 'never' it is refused)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    # private: mmap's default anonymous mapping is shared (shmem), which THP's madvise mode
    # leaves on 4 KiB pages
    m = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = np.frombuffer(m, np.uint8)
    off = (-base.ctypes.data) % HUGE
    try:
        m.madvise(mmap.MADV_HUGEPAGE, off, (nbytes + HUGE - 1) // HUGE * HUGE)
    except (AttributeError, OSError, ValueError) as e:
        log(f"decode_data: madvise(MADV_HUGEPAGE) refused ({e}); 4 KiB pages")
    return base[off:off + nbytes].view(dtype).reshape(shape)


def huge_copy(a, dtype=None):
    out = huge_empty(a.shape, dtype or a.dtype)
    out[...] = a
    return out


def huge_page_bytes():
    """Bytes of this process on transparent huge pages, -1 where /proc cannot tell."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return -1


def to_bf16_bits(x):
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


class Problem:
    def __init__(self, cache_len, heads=32, kv_heads=8, head_dim=128, seed=0):
        self.S, self.Hq, self.Hk, self.D = cache_len, heads, kv_heads, head_dim
        self.G = heads // kv_heads
        self.scale = 1.0 / np.sqrt(head_dim)
        rng = np.random.default_rng(seed)
        bf = lambda a: from_bf16_bits(to_bf16_bits(a))  # noqa: E731
        # [Hq, D] and [S, Hk, D]: the token-major layout; each peer lays them out its way
        self.q = bf(2 * rng.standard_normal((heads, head_dim), dtype=np.float32))
        self.k = bf(rng.standard_normal((cache_len, kv_heads, head_dim), dtype=np.float32))
        self.v = bf(rng.standard_normal((cache_len, kv_heads, head_dim), dtype=np.float32))
        self._ref = None

    def reference(self):
        """float64 o [Hq, D] of the new token over all S positions."""
        if self._ref is None:
            o = np.empty((self.Hq, self.D))
            for h in range(self.Hk):
                k = self.k[:, h, :].astype(np.float64)
                v = self.v[:, h, :].astype(np.float64)
                qs = self.q[h * self.G:(h + 1) * self.G].astype(np.float64)
                s = qs @ k.T * self.scale
                p = np.exp(s - s.max(axis=1, keepdims=True))
                o[h * self.G:(h + 1) * self.G] = (p @ v) / p.sum(axis=1, keepdims=True)
            self._ref = o
        return self._ref

    def kv_bytes(self, elem_bytes, scale_bytes_per_row=0.0):
        """Bytes of K and V a step reads: S tokens x Hk heads x 2 x (D elements + scales)."""
        return self.S * self.Hk * 2 * (self.D * elem_bytes + scale_bytes_per_row)


# Largest error (against float64, over max |reference|) a correct peer may show: a 16-bit
# cache with 16-bit or f32 arithmetic (ggml's f16 path, which converts q to f16 and sums
# p v in f16, shows 0.017 at 32K tokens, the others 0.003 or less); an 8-bit cache adds its
# quantization's error, which
# this data measures at 0.017 for int8 with a scale per row (at 2K and 32K tokens) and 0.056
# (2K) to 0.11 (32K) for fp8 e4m3 (3 mantissa bits). A wrong layout or head mapping is off by
# about max |reference| itself.
TOLERANCE = {"16bit": 4e-2, "int8": 8e-2, "fp8": 0.25}


def serve(make, argv=None):
    """The worker's loop: make(args) -> impl (with .step(), .output() [Hq, D], .bytes, .tol,
    .info dict) or a string (why it is unavailable). Prints one JSON line when ready (its
    check against float64), then answers `time N` with the median of N timed steps after one
    warm-up, until `quit`."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("impl")
    ap.add_argument("--cache-len", type=int, default=32768)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    try:
        impl = make(a)
    except Exception as e:  # a peer that cannot run says why; the others go on
        impl = f"{type(e).__name__}: {e}"
    if not isinstance(impl, str):
        try:
            impl.step()
        except Exception as e:  # an API this script does not call right: said, not timed
            impl = f"its first step failed: {type(e).__name__}: {e}"
    if isinstance(impl, str):
        print(json.dumps({"impl": a.impl, "unavailable": impl}), flush=True)
        return
    ref = impl.problem.reference()
    out = np.asarray(impl.output(), np.float64).reshape(ref.shape)
    err = float(np.max(np.abs(out - ref))) if np.all(np.isfinite(out)) else float("inf")
    rel = err / float(np.max(np.abs(ref)))
    ok = rel <= impl.tol
    impl.problem.k = impl.problem.v = None  # the peer holds its own cache now: memory back for the others
    print(json.dumps(dict(impl=a.impl, ok=bool(ok), max_abs_err=err, max_abs_ref=float(np.max(np.abs(ref))),
                          rel_err=rel, tol=impl.tol, cache_bytes=impl.bytes, huge_page_bytes=huge_page_bytes(),
                          **impl.info)), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        n = int(cmd[1])
        if hasattr(impl, "reset"):
            impl.reset()  # untimed: a peer whose step appends goes back to S - 1 past rows
        impl.step()  # warm-up: the cache back in whatever state the round's others left it
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            impl.step()
            ts.append(time.perf_counter() - t0)
        ts.sort()
        print(json.dumps({"seconds": ts[n // 2], "min": ts[0], "max": ts[-1]}), flush=True)
