#!/usr/bin/env bash
# Allocation failures in the command line (a build with FA_ALLOC_FAILURE_INJECTION, under
# ASan with leak detection): flashattn run and grad, with every optional input and output,
# are run with FA_ALLOC_FAIL_AT=n for n = 1, 2, ... until a run makes fewer than n
# allocations and succeeds. Every earlier run must exit 1 with exactly one stderr line
# ("flashattn: ..."), leak nothing (a leak report exits 86) and leave the output folder
# empty: no output file, no temporary.
# The same for packed varlen run and grad (--cu-seqlens-q/-k).
# Usage: bash tests/alloc/test_cli_alloc_failure.sh BUILD_DIR (needs flashattn, tool_npy, tool_inference).
set -u
BUILD=${1:-build}
FA=$(cd "$BUILD" && pwd)/flashattn
NPY=$(cd "$BUILD" && pwd)/tool_npy
for x in "$FA" "$NPY"; do [ -x "$x" ] || { echo "missing $x"; exit 1; }; done
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=1:exitcode=86" LSAN_OPTIONS="exitcode=86"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
I=$W/in OUT=$W/out
mkdir -p "$I" "$OUT"
gen() { "$NPY" rand "$I/$1" "$2" "${@:3}" >/dev/null || { echo "tool_npy failed on $1"; exit 1; }; }
gen q.npy '<f4' 2 4 17 8 --seed 1
gen k.npy '<f4' 2 2 21 8 --seed 2
gen v.npy '<f4' 2 2 21 8 --seed 3
gen do.npy '<f4' 2 4 17 8 --seed 4
gen bias.npy '<f4' 2 4 17 21 --seed 5
gen slopes.npy '<f4' 4 --seed 6
gen qseg.npy '<i4' 2 17
gen kvseg.npy '<i4' 2 21
IN="--q $I/q.npy --k $I/k.npy --v $I/v.npy --bias $I/bias.npy --alibi $I/slopes.npy"
IN="$IN --q-segments $I/qseg.npy --kv-segments $I/kvseg.npy --causal --threads 2"
fail=0

# every_n NAME OUTPUTS ARGS...: the loop above for one command line.
every_n() {
  local name=$1 outputs=$2 n rc lines
  shift 2
  for ((n = 1; n <= 500; n++)); do
    rm -rf "${OUT:?}"/* "$OUT"/.[!.]* 2>/dev/null
    FA_ALLOC_FAIL_AT=$n "$FA" "$@" >"$W/so" 2>"$W/se"
    rc=$?
    if [ $rc = 0 ]; then
      for f in $outputs; do
        [ -s "$OUT/$f" ] || { echo "FAIL $name: the complete run (n=$n) did not write $f"; fail=1; }
      done
      if [ $n = 1 ]; then echo "FAIL $name: no allocation was ever made (is this an injection build?)"; fail=1; fi
      echo "PASS $name: allocations 1..$((n - 1)) each failed in turn: exit 1, one line, no output left"
      return
    fi
    lines=$(wc -l <"$W/se")
    if [ $rc != 1 ] || [ "$lines" != 1 ] || ! grep -q '^flashattn: ' "$W/se" || [ -n "$(ls -A "$OUT")" ]; then
      echo "FAIL $name with allocation $n failing: exit $rc, $lines stderr line(s), left: $(ls -A "$OUT" | tr '\n' ' ')"
      head -5 "$W/se"
      fail=1
      return
    fi
  done
  echo "FAIL $name: still failing at n=$n"
  fail=1
}

every_n run "o.npy lse.npy" run $IN --out "$OUT/o.npy" --lse "$OUT/lse.npy" --count
every_n grad "dq.npy dk.npy dv.npy" grad $IN --do "$I/do.npy" --dq "$OUT/dq.npy" --dk "$OUT/dk.npy" --dv "$OUT/dv.npy"
# packed varlen (cu_seqlens): sequences (Sq, Sk) = (6, 9), (0, 4), (11, 11); TI writes the int32 files
TI=$(cd "$BUILD" && pwd)/tool_inference
[ -x "$TI" ] || { echo "missing $TI"; exit 1; }
gen pq.npy '<f4' 17 4 8 --seed 7
gen pk.npy '<f4' 24 2 8 --seed 8
gen pv.npy '<f4' 24 2 8 --seed 9
gen pdo.npy '<f4' 17 4 8 --seed 10
"$TI" ints "$I/cq.npy" 4 -- 0 6 6 17 && "$TI" ints "$I/ck.npy" 4 -- 0 9 13 24 || { echo "tool_inference failed"; exit 1; }
VL="--q $I/pq.npy --k $I/pk.npy --v $I/pv.npy --cu-seqlens-q $I/cq.npy --cu-seqlens-k $I/ck.npy --causal --threads 2"
every_n "varlen run" "o.npy lse.npy" run $VL --out "$OUT/o.npy" --lse "$OUT/lse.npy" --count
every_n "varlen grad" "dq.npy dk.npy dv.npy o.npy" grad $VL --do "$I/pdo.npy" --dq "$OUT/dq.npy" --dk "$OUT/dk.npy" \
  --dv "$OUT/dv.npy" --out "$OUT/o.npy" --count
[ $fail = 0 ] && echo "ok" || echo "FAILED"
exit $fail
