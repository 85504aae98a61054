#!/usr/bin/env bash
# Dropout's cost (issue 20: at most 25% slower fwd+bwd at p = 0.1): flashattn bench with and
# without --dropout 0.1, run back to back REPS times (default 10); prints the median ratio
# of the seconds per pass, so that a machine shared with other work (whose load shifts
# between runs) compares like with like. Usage:
#   bash bench/dropout.sh BUILD_DIR [bench flags]   (default: B=1 H=8 S=2048 D=128 bf16, 1 thread)
set -eu
FA=$(cd "${1:-build}" && pwd)/flashattn
shift || true
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(--batch 1 --heads 8 --seq 2048 --head-dim 128 --dtype bf16 --threads 1 --iters 2)
PAIRS=$(mktemp)
trap 'rm -f "$PAIRS"' EXIT
for _ in $(seq 1 "${REPS:-10}"); do
  a=$("$FA" bench "${ARGS[@]}" --json 2>/dev/null | tail -1)
  b=$("$FA" bench "${ARGS[@]}" --dropout 0.1 --json 2>/dev/null | tail -1)
  echo "$a|$b" >>"$PAIRS"
done
python3 - "$PAIRS" "${ARGS[*]}" <<'PY'
import json, statistics, sys
rows = [[json.loads(t) for t in line.strip().split("|")] for line in open(sys.argv[1])]
sec = lambda r, *passes: sum(r[p]["seconds"] for p in passes)
for name, passes in (("forward", ("forward",)), ("backward", ("backward",)), ("fwd+bwd", ("forward", "backward"))):
    ratios = sorted(sec(y, *passes) / sec(x, *passes) for x, y in rows)
    print(f"{name:9s} dropout 0.1 / none: median {statistics.median(ratios):.3f} "
          f"(min {ratios[0]:.3f}, max {ratios[-1]:.3f}; {len(ratios)} pairs; {sys.argv[2]})")
PY
