#!/usr/bin/env bash
# The block-sparse masks' speed targets (bench/bench_masks.c): 16 documents packed into
# S = 16384 with cut points drawn by numpy's default_rng(0) (15 distinct points, uniform in
# [1, S), sorted), causal within each document; chunked causal with C = 2048; both against
# dense causal, B = 1, H = 8, D = 128, bf16. Extra arguments go to bench_masks (e.g.
# --heads 1 --reps 1 for a brief run, --backward for the backward too).
# Environment: BUILD (default build), PYTHON (default ~/.cache/flashattn/venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD:-build}"
PYTHON="${PYTHON:-$HOME/.cache/flashattn/venv/bin/python}"
S=16384 # or the --seq given: the cut points are drawn for the sequence that runs
args=("$@")
for ((i = 0; i + 1 < ${#args[@]}; i++)); do [ "${args[i]}" = "--seq" ] && S="${args[i + 1]}"; done
cmake -S . -B "$BUILD" >/dev/null
cmake --build "$BUILD" --target bench_masks -j2 >/dev/null
cuts=$("$PYTHON" -c "import numpy as np; r = np.random.default_rng(0); print(','.join(str(int(c)) for c in np.sort(r.choice(np.arange(1, $S), 15, replace=False))))")
echo "cut points: $cuts"
"$BUILD/bench_masks" --cuts "$cuts" "$@" --seq "$S"
