#!/usr/bin/env bash
# Issues 20 and 21's speed targets, one after the other (`make bench-targets`): block-sparse
# masks (bench/masks.sh), the cost of sinks and of dropout (bench/feature_cost.sh), decode
# over every cache type (bench/decode_caches.sh) and the shared prefix (bench/cascade.c).
# Each prints its own figures against its targets; run it on an idle machine (each part
# compares within its own run, but a load that shifts between runs still shows). Useful
# flops as everywhere in bench/RESULTS.md: forward 4·B·H·Sq·Sk·D, half when causal, under a
# mask the visible pairs (the plan's flops_useful).
# Environment: BUILD (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD:-build}"
cmake -S . -B "$BUILD" >/dev/null
cmake --build "$BUILD" -j2 --target flashattn_cli bench_masks cascade bandwidth peak >/dev/null
echo "## $(date -u '+%Y-%m-%d %H:%M UTC'), $(git rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs; flashattn ISA $("$BUILD/flashattn" plan --batch 1 --heads 1 --seq 8 --head-dim 8 | sed -n 's/.*(\([a-z0-9_]*\) kernels.*/\1/p')"
echo "### masks (bash bench/masks.sh --reps 2)"
BUILD="$BUILD" bash bench/masks.sh --reps 2
echo "### sinks and dropout (bash bench/feature_cost.sh, REPS=${REPS:-16})"
REPS="${REPS:-16}" bash bench/feature_cost.sh "$BUILD" sinks --batch 1 --heads 8 --seq 4096 --head-dim 128 \
  --dtype bf16 --causal --threads 2 --iters 3
REPS="${REPS:-16}" bash bench/feature_cost.sh "$BUILD" dropout
echo "### decode caches (ROUNDS=3 bash bench/decode_caches.sh)"
BUILD="$BUILD" ROUNDS=3 bash bench/decode_caches.sh
echo "### shared prefix ($BUILD/cascade 64 16384 512 2 3; streaming read: $BUILD/bandwidth 1024 2 9 huge; peaks: $BUILD/peak 2)"
read_json=$("$BUILD/bandwidth" 1024 2 9 huge | tail -1)
peak_json=$("$BUILD/peak" 2 2>/dev/null | tail -1)
cas_json=$("$BUILD/cascade" 64 16384 512 2 3 | tail -1)
echo "$cas_json"
# issue 21's roofline: the larger of bytes / streaming read and flops / the vdpbf16ps peak,
# both measured here (bench/peak.c, 2 threads); target >= 0.7 of it. Where the library runs
# on AMX its products are not bound by vdpbf16ps: the ratio against the AMX peak's roofline
# is printed beside it (and the f32 FMA peak's where that is the higher, as on Intel's CPUs
# without AMX: the avx512 table), so that a figure above 1 is not read as one against the
# machine's real limit.
python3 - "$read_json" "$cas_json" "$peak_json" <<'PY'
import json, sys
bw, c, peaks = json.loads(sys.argv[1])["read_gbytes_per_s"], json.loads(sys.argv[2]), json.loads(sys.argv[3])
def roof(peak):
    return max(c["cascade_bytes"] / bw / 1e6, c["cascade_flops"] / peak / 1e6)
dp = (peaks.get("dpbf16") or {}).get("2")
amx = (peaks.get("amx_bf16") or {}).get("2")
line = f"streaming read {bw:.2f} GB/s (bytes {c['cascade_bytes'] / bw / 1e6:.1f} ms); cascade {c['cascade_ms']:.1f} ms, " \
       f"{c['speedup']:.2f}x the unshared batch"
if dp:
    line += f"; vdpbf16ps peak {dp:g} GFLOP/s: roofline {roof(dp):.1f} ms, {roof(dp) / c['cascade_ms']:.2f} of it (target >= 0.7)"
if amx:
    line += f"; AMX peak {amx:g} GFLOP/s: roofline {roof(amx):.1f} ms, {roof(amx) / c['cascade_ms']:.2f} of it"
fma = (peaks.get("fma_f32") or {}).get("2")
if fma and dp and fma > dp:  # where f32 FMAs outrun vdpbf16ps the library takes them (the avx512 table)
    line += f"; FMA peak {fma:g} GFLOP/s: roofline {roof(fma):.1f} ms, {roof(fma) / c['cascade_ms']:.2f} of it"
print(line)
PY
