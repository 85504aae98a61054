#!/usr/bin/env bash
# What a feature costs: flashattn bench with and without the feature's flags, run back to
# back REPS times (default 10), the feature first in every other pair (the second run of two
# back to back measured 2.7% slower on this VM with nothing changed: an order bias that
# alternating cancels); prints the median (and range) of the ratios of the seconds per
# pass, so that a machine whose load shifts between runs compares like with like.
# Issue 20's bounds: dropout p = 0.1 at most 25% slower fwd+bwd, sinks at most 3% slower.
# Usage:
#   bash bench/feature_cost.sh BUILD_DIR dropout|sinks [bench flags]
#   (default: B=1 H=8 S=2048 D=128 bf16, 1 thread)
set -eu
FA=$(cd "${1:-build}" && pwd)/flashattn
FEATURE=${2:-dropout}
shift 2 || shift $#
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(--batch 1 --heads 8 --seq 2048 --head-dim 128 --dtype bf16 --threads 1 --iters 2)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
case "$FEATURE" in
  dropout) FLAGS=(--dropout 0.1) ;;
  sinks)
    # one sink logit per query head, near the scores' scale (the flag's .npy: float32 [Hq])
    heads=8
    for ((i = 0; i < ${#ARGS[@]} - 1; i++)); do
      case "${ARGS[$i]}" in --heads | --heads-q) heads=${ARGS[$((i + 1))]} ;; esac
    done
    python3 - "$TMP/sinks.npy" "$heads" <<'PY'
import struct, sys
n = int(sys.argv[2])
head = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d,), }" % n
head += " " * (63 - (10 + len(head)) % 64) + "\n"
with open(sys.argv[1], "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode())
    f.write(struct.pack("<%df" % n, *[0.25 * (i % 5) for i in range(n)]))
PY
    FLAGS=(--sinks "$TMP/sinks.npy") ;;
  *) echo "feature_cost.sh: feature must be dropout or sinks, got '$FEATURE'" >&2; exit 2 ;;
esac
# one bench run's JSON line; a refused or failed run stops the script with the CLI's reason
# (its stderr otherwise holds the per-iteration lines, kept out of the output)
run() {
  "$FA" bench "$@" --json >"$TMP/out" 2>"$TMP/err" ||
    { echo "feature_cost.sh: flashattn bench $*: $(tail -n 3 "$TMP/err")" >&2; exit 1; }
  tail -1 "$TMP/out"
}
for i in $(seq 1 "${REPS:-10}"); do
  if ((i % 2)); then
    a=$(run "${ARGS[@]}")
    b=$(run "${ARGS[@]}" "${FLAGS[@]}")
  else
    b=$(run "${ARGS[@]}" "${FLAGS[@]}")
    a=$(run "${ARGS[@]}")
  fi
  echo "$a|$b" >>"$TMP/pairs"
done
python3 - "$TMP/pairs" "${FLAGS[*]}" "${ARGS[*]}" <<'PY'
import json, statistics, sys
rows = [[json.loads(t) for t in line.strip().split("|")] for line in open(sys.argv[1])]
passes = [p for p in ("forward", "backward") if rows[0][0].get(p)]  # a pass not run is null (--pass)
sec = lambda r, *ps: sum(r[p]["seconds"] for p in ps)
cases = [(p, (p,)) for p in passes] + ([("fwd+bwd", tuple(passes))] if len(passes) == 2 else [])
feature = sys.argv[2].split()[0].lstrip("-")
for name, ps in cases:
    ratios = sorted(sec(y, *ps) / sec(x, *ps) for x, y in rows)
    print(f"{name:9s} {feature} / none: median {statistics.median(ratios):.3f} "
          f"(min {ratios[0]:.3f}, max {ratios[-1]:.3f}; {len(ratios)} pairs; {sys.argv[3]})")
PY
