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
cmake --build "$BUILD" -j2 --target flashattn_cli bench_masks cascade bandwidth >/dev/null
echo "## $(date -u '+%Y-%m-%d %H:%M UTC'), $(git rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "### masks (bash bench/masks.sh --reps 2)"
BUILD="$BUILD" bash bench/masks.sh --reps 2
echo "### sinks and dropout (bash bench/feature_cost.sh, REPS=${REPS:-16})"
REPS="${REPS:-16}" bash bench/feature_cost.sh "$BUILD" sinks --batch 1 --heads 8 --seq 4096 --head-dim 128 \
  --dtype bf16 --causal --threads 2 --iters 3
REPS="${REPS:-16}" bash bench/feature_cost.sh "$BUILD" dropout
echo "### decode caches (ROUNDS=3 bash bench/decode_caches.sh)"
BUILD="$BUILD" ROUNDS=3 bash bench/decode_caches.sh
echo "### shared prefix ($BUILD/cascade 64 16384 512 2 3; streaming read: $BUILD/bandwidth 1024 2 9 huge)"
read_json=$("$BUILD/bandwidth" 1024 2 9 huge | tail -1)
cas_json=$("$BUILD/cascade" 64 16384 512 2 3 | tail -1)
echo "$cas_json"
# issue 21's roofline: the larger of bytes / streaming read and flops / the vdpbf16ps peak
# (465 GFLOP/s on 2 threads of this machine, bench/peak.c); target >= 0.7 of it
python3 - "$read_json" "$cas_json" "${PEAK_GFLOPS:-465}" <<'PY'
import json, sys
bw, c, peak = json.loads(sys.argv[1])["read_gbytes_per_s"], json.loads(sys.argv[2]), float(sys.argv[3])
roof_ms = max(c["cascade_bytes"] / bw / 1e6, c["cascade_flops"] / peak / 1e6)
print(f"streaming read {bw:.2f} GB/s; roofline {roof_ms:.1f} ms (bytes {c['cascade_bytes'] / bw / 1e6:.1f} ms, "
      f"flops {c['cascade_flops'] / peak / 1e6:.1f} ms at {peak:g} GFLOP/s); cascade {c['cascade_ms']:.1f} ms = "
      f"{roof_ms / c['cascade_ms']:.2f} of the roofline (target >= 0.7); {c['speedup']:.2f}x the unshared batch")
PY
