#!/usr/bin/env bash
# `make run`: plans the seed problem (B=18, H=32, S=16384, D=256, bf16, 24 GiB budget), then
# measures a scaled-down version of it on this machine's CPU (forward, B=1, H=4, S=2048) and
# sets the measured speed and memory beside what the naive reference would need.
# Usage: bash tools/demo.sh [BUILD_DIR]   (DEMO_SEQ=1024 for a quicker run)
set -euo pipefail
export LC_ALL=C
BUILD=${1:-build}
FA=$BUILD/flashattn
[ -x "$FA" ] || { echo "demo: $FA not found; build first (make)" >&2; exit 1; }
SEQ=${DEMO_SEQ:-2048}

# field JSON SECTION KEY: the number KEY inside "SECTION": {...}.
field() { printf '%s' "$1" | sed -n "s/.*\"$2\": {\([^}]*\)}.*/\1/p" | sed -n "s/.*\"$3\": \([0-9.e+-]*\).*/\1/p"; }
human() { awk -v b="$1" 'BEGIN { split("B KiB MiB GiB TiB PiB", u, " "); i = 1;
  while (b >= 1024 && i < 6) { b /= 1024; i++ } printf (i > 1 ? "%.2f %s" : "%d %s"), b, u[i] }'; }

SEED="--batch 18 --heads 32 --seq 16384 --head-dim 256 --dtype bf16"
echo "== flashattn plan $SEED --memory-budget 24G"
"$FA" plan $SEED --memory-budget 24G
seed_json=$("$FA" plan $SEED --memory-budget 24G --json)

SMALL="--batch 1 --heads 4 --seq $SEQ --head-dim 256 --dtype bf16"
small_json=$("$FA" plan $SMALL --backend cpu --json)
echo
echo "== flashattn bench $SMALL --backend cpu --pass forward (this CPU)"
bench=$("$FA" bench $SMALL --backend cpu --pass forward --iters 3 --json | tail -n 1)
secs=$(field "$bench" forward seconds)
gflops=$(field "$bench" forward gflops)
rss=$(printf '%s' "$bench" | sed -n 's/.*"peak_rss_bytes": \([0-9]*\).*/\1/p')

echo
printf '%-34s %.4f s per call, %.2f GFLOP/s (%s flops)\n' "measured forward, S=$SEQ:" "$secs" "$gflops" \
  "$(field "$small_json" forward flops)"
printf '%-34s %-14s %s\n' "" "flash" "naive reference"
printf '%-34s %-14s %s\n' "B=1 H=4 S=$SEQ D=256 bf16" "$(human "$rss") RSS" \
  "$(human "$(field "$small_json" forward naive_peak_bytes)")"
printf '%-34s %-14s %s\n' "  (the plan's figures)" "$(human "$(field "$small_json" forward peak_bytes)")" \
  "$(human "$(field "$small_json" forward naive_peak_bytes)")"
printf '%-34s %-14s %s\n' "seed B=18 H=32 S=16384 D=256 bf16" \
  "$(human "$(field "$seed_json" forward peak_bytes)")" "$(human "$(field "$seed_json" forward naive_peak_bytes)")"
fits=$(printf '%s' "$seed_json" | sed -n 's/.*"fits": \([a-z]*\).*/\1/p')
naive=$(printf '%s' "$seed_json" | sed -n 's/.*"naive_fits": \([a-z]*\).*/\1/p')
echo "within 24 GiB: flash forward fits: $fits; naive reference fits: $naive"

# Where a CUDA device is present (the auto backend picks it), one head group of the seed
# problem on it: B=1 of 18, all 32 heads, full length.
if printf '%s' "$("$FA" plan $SEED --json)" | grep -q '"backend": "cuda"'; then
  GPU="--batch 1 --heads 32 --seq 16384 --head-dim 256 --dtype bf16 --backend cuda"
  echo
  echo "== flashattn bench $GPU (this GPU)"
  "$FA" bench $GPU --iters 3
fi
