#!/usr/bin/env bash
# What combines with what, at the command line: a bias or segment ids with a packed batch
# (--cu-seqlens-*) or a cache (--cache-seqlens), and --cache-seqlens with --cu-seqlens-*,
# exit 2 (bad input) with one line naming both features, and write nothing; the same
# inputs without the extra feature run (exit 0). The refusals are the library's
# (src/backend.c), the last one the flag parser's in the same words.
# Usage: bash tests/test_cli_supports.sh BUILD
set -u
BUILD=${1:-build}
FA=$(cd "$BUILD" && pwd)/flashattn
NPY=$(cd "$BUILD" && pwd)/tool_npy
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W" || exit 1
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
no() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
gen() { "$NPY" rand "$1" "$2" "${@:3}" >/dev/null || { echo "tool_npy failed"; exit 1; }; }
S0=${FA_TEST_SEED:-$(($(date +%s%N) % 1000000000))}
case $S0 in *[!0-9]*|'') echo "FA_TEST_SEED must be a decimal number, got '$S0'"; echo "0 passed, 1 failed"; exit 1 ;; esac
S0=$((10#${S0: -9}))
echo "$(basename "$0" .sh): seed $S0 (FA_TEST_SEED=$S0 reproduces)"
# packed: two sequences of one row each (cu = [0, 1, 2]), Hq=4, Hk=2, D=16
gen cu.npy '<i4' 3
gen q3.npy '<f4' 2 4 16 --seed $((S0 + 1))
gen k3.npy '<f4' 2 2 16 --seed $((S0 + 2))
gen v3.npy '<f4' 2 2 16 --seed $((S0 + 3))
gen segv.npy '<i4' 2 2
gen biasv.npy '<f4' 1 4 2 2 --seed $((S0 + 4))
# cache: B=2, one new query each, capacity 8, Hk=2
gen lens.npy '<i4' 2
gen q4.npy '<f4' 2 1 4 16 --seed $((S0 + 5))
gen k4.npy '<f4' 2 8 2 16 --seed $((S0 + 6))
gen v4.npy '<f4' 2 8 2 16 --seed $((S0 + 7))
gen segq.npy '<i4' 2 1
gen segk.npy '<i4' 2 8
gen biasd.npy '<f4' 1 4 1 8 --seed $((S0 + 8))
V="--q q3.npy --k k3.npy --v v3.npy --cu-seqlens-q cu.npy --cu-seqlens-k cu.npy"
D="--q q4.npy --k k4.npy --v v4.npy --cache-seqlens lens.npy"

runs() { # what, command...
  "$FA" "${@:2}" --out o.npy >so 2>se
  [ $? = 0 ] && [ -e o.npy ] && ok "$1 runs" || no "$1" "exit $?: $(cat se)"
  rm -f o.npy
}
refused() { # what, regex 1, regex 2, command...
  "$FA" "${@:4}" --out o.npy >so 2>se
  local rc=$?
  if [ $rc = 2 ] && [ ! -e o.npy ] && [ "$(wc -l <se)" = 1 ] && grep -q "$2" se && grep -q "$3" se; then
    ok "$1: exit 2, $(cat se)"
  else
    no "$1" "exit $rc, $(cat se)"
  fi
  rm -f o.npy
}
runs "packed batch" run $V
runs "cache" run $D
refused "--bias with --cu-seqlens-*" "bias" "cu_seqlens" run $V --bias biasv.npy
refused "--q-segments with --cu-seqlens-*" "segment" "cu_seqlens" run $V --q-segments segv.npy --kv-segments segv.npy
refused "--bias with --cache-seqlens" "bias" "cache_seqlens" run $D --bias biasd.npy
refused "--q-segments with --cache-seqlens" "segment" "cache_seqlens" run $D --q-segments segq.npy --kv-segments segk.npy
refused "--cache-seqlens with --cu-seqlens-* (run, packed q)" "cu-seqlens" "cache-seqlens" run $V --cache-seqlens lens.npy
refused "--cache-seqlens with --cu-seqlens-* (run, cache q)" "cu-seqlens" "cache-seqlens" run $D --cu-seqlens-q cu.npy --cu-seqlens-k cu.npy
"$FA" plan --heads 4 --kv-heads 2 --head-dim 16 --cu-seqlens-q cu.npy --cu-seqlens-k cu.npy --cache-seqlens lens.npy >so 2>se
rc=$?
[ $rc = 2 ] && grep -q "cu-seqlens.*cache-seqlens" se && ok "plan with both: exit 2" || no "plan with both" "exit $rc, $(cat se)"

echo "$pass passed, $fail failed"
[ $fail = 0 ]
