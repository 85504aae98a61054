#!/usr/bin/env bash
# A/B of the forward's key tiles: each case below timed at --block-k A and --block-k B
# (default 256 and 512), the two alternating, ROUNDS rounds; prints each case's min and
# median seconds and the ratio of the medians (B / A). bf16, 2 threads, forward only.
# Usage: bash bench/tiles_ab.sh [ROUNDS] [A] [B]   (BUILD: the build directory, default build;
# CASES=short: sequences under 2048 keys and D = 64 instead, about 16 M rows x keys each)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD:-build}"
ROUNDS="${1:-3}" A="${2:-256}" B="${3:-512}"
PYTHON="${PYTHON:-$HOME/.cache/flashattn/venv/bin/python}"
docs=$(mktemp --suffix .npy)
trap 'rm -f "$docs"' EXIT
# 16 documents in 16384, the cut points of bench/masks.sh (numpy's default_rng(0))
"$PYTHON" -c "import numpy as np; r = np.random.default_rng(0); c = np.sort(r.choice(np.arange(1, 16384), 15, replace=False)); np.save('$docs', np.diff(np.concatenate([[0], c, [16384]])).astype(np.int64))"
cases=("causal S=16384|--heads 8 --seq 16384 --head-dim 128 --causal"
       "causal S=4096|--heads 32 --seq 4096 --head-dim 128 --causal"
       "causal S=2048|--heads 64 --seq 2048 --head-dim 128 --causal"
       "unmasked S=4096|--heads 8 --seq 4096 --head-dim 128"
       "causal S=8192 D=256|--heads 8 --seq 8192 --head-dim 256 --causal"
       "chunked 2048|--heads 8 --seq 16384 --head-dim 128 --mask-chunk 2048"
       "16 documents|--heads 8 --seq 16384 --head-dim 128 --documents $docs --causal"
       "window 1024|--heads 8 --seq 16384 --head-dim 128 --window 1024 0")
[ "${CASES:-}" = short ] &&
  cases=("causal S=256|--heads 512 --seq 256 --head-dim 128 --causal"
         "causal S=512|--heads 256 --seq 512 --head-dim 128 --causal"
         "causal S=1024|--heads 128 --seq 1024 --head-dim 128 --causal"
         "unmasked S=1024|--heads 128 --seq 1024 --head-dim 128"
         "causal S=1024 D=64|--heads 128 --seq 1024 --head-dim 64 --causal"
         "causal S=1536 D=256|--heads 40 --seq 1536 --head-dim 256 --causal"
         "causal S=4096 D=64|--heads 32 --seq 4096 --head-dim 64 --causal"
         "window 256 S=1024|--heads 128 --seq 1024 --head-dim 128 --window 256 0")
out=$(mktemp)
trap 'rm -f "$docs" "$out"' EXIT
for r in $(seq 1 "$ROUNDS"); do
  for c in "${cases[@]}"; do
    for bk in "$A" "$B"; do
      s=$("$BUILD/flashattn" bench --batch 1 --dtype bf16 --threads 2 --pass forward --iters 3 --json ${c#*|} \
          --block-k "$bk" | tail -n 1 | "$PYTHON" -c "import json, sys; print(json.load(sys.stdin)['forward']['seconds'])")
      echo "${c%%|*}|$bk|$s" >> "$out"
    done
  done
done
"$PYTHON" - "$out" "$A" "$B" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    c, bk, s = line.strip().split("|")
    d[(c, bk)].append(float(s))
a, b = sys.argv[2], sys.argv[3]
print(f"| case | {a} keys (min / median s) | {b} keys | median {b} / {a} |\n| --- | --- | --- | --- |")
for c in dict.fromkeys(k[0] for k in d):
    x, y = d[(c, a)], d[(c, b)]
    print(f"| {c} | {min(x):.4f} / {statistics.median(x):.4f} | {min(y):.4f} / {statistics.median(y):.4f} | "
          f"{statistics.median(y) / statistics.median(x):.3f} |")
PY
