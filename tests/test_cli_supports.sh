#!/usr/bin/env bash
# What combines with what, at the command line: a bias or segment ids with a packed batch
# (--cu-seqlens-*) or a cache (--cache-seqlens), and --cache-seqlens with --cu-seqlens-*,
# exit 2 (bad input) with one line naming both features, and write nothing; the same
# inputs without the extra feature run (exit 0). The refusals are the library's
# (src/backend.c), the last one the flag parser's in the same words.
# Usage: bash tests/test_cli_supports.sh BUILD
set -u
BUILD=$(cd "${1:-build}" && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W" || exit 1
pass=0 fail=0
# check NAME CONDITION-STATUS DETAIL: one line per case, counted
check() { if [ "$2" = 0 ]; then echo "ok   $1"; pass=$((pass + 1)); else echo "FAIL $1: $3"; fail=$((fail + 1)); fi; }
# the data never matters (every refusal comes before it is read; the runs only must succeed)
gen() { "$BUILD/tool_npy" rand "$@" >/dev/null || { echo "tool_npy failed"; exit 1; }; }
# packed: two sequences of one row each (cu = [0, 1, 2]), Hq=4, Hk=2, D=16
gen cu.npy '<i4' 3
gen q3.npy '<f4' 2 4 16
gen k3.npy '<f4' 2 2 16
gen v3.npy '<f4' 2 2 16
gen segv.npy '<i4' 2 2
gen biasv.npy '<f4' 1 4 2 2
# cache: B=2, one new query each, capacity 8, Hk=2
gen lens.npy '<i4' 2
gen q4.npy '<f4' 2 1 4 16
gen k4.npy '<f4' 2 8 2 16
gen v4.npy '<f4' 2 8 2 16
gen segq.npy '<i4' 2 1
gen segk.npy '<i4' 2 8
gen biasd.npy '<f4' 1 4 1 8
V="--q q3.npy --k k3.npy --v v3.npy --cu-seqlens-q cu.npy --cu-seqlens-k cu.npy"
D="--q q4.npy --k k4.npy --v v4.npy --cache-seqlens lens.npy"

runs() { # what, command...
  "$BUILD/flashattn" "${@:2}" --out o.npy >so 2>se
  local rc=$?
  [ $rc = 0 ] && [ -e o.npy ]
  check "$1 runs" $? "exit $rc: $(cat se)"
  rm -f o.npy
}
refused() { # what, regex 1, regex 2, command...
  "$BUILD/flashattn" "${@:4}" --out o.npy >so 2>se
  local rc=$?
  [ $rc = 2 ] && [ ! -e o.npy ] && [ "$(wc -l <se)" = 1 ] && grep -q "$2" se && grep -q "$3" se
  check "$1: exit 2, one line naming both" $? "exit $rc, $(cat se)"
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
"$BUILD/flashattn" plan --heads 4 --kv-heads 2 --head-dim 16 --cu-seqlens-q cu.npy --cu-seqlens-k cu.npy \
  --cache-seqlens lens.npy >so 2>se
rc=$?
[ $rc = 2 ] && grep -q "cu-seqlens.*cache-seqlens" se
check "plan with --cache-seqlens and --cu-seqlens-*: exit 2" $? "exit $rc, $(cat se)"

# AUTO on a GPU machine (tests/fake_gpu.c stands in for one; built with the CUDA backend):
# the GPU by default; block sizes the GPU lacks go to the CPU, which runs them, where naming
# cuda is its refusal (FA_ERR_UNSUPPORTED: exit 1, naming the block sizes)
if [ -e "$BUILD/libfa_fake_gpu.so" ]; then
  gpu() { LD_PRELOAD="$BUILD/libfa_fake_gpu.so" "$BUILD/flashattn" plan --batch 1 --heads 2 --seq 64 --head-dim 64 \
    --dtype f16 "$@" >so 2>se; }
  gpu && grep -q "^backend   cuda" so
  check "AUTO on a GPU machine plans on cuda" $? "$(cat so se)"
  gpu --block-q 64 --block-k 64 && grep -q "^backend   cpu" so && grep -q "forward 64 x 64" so
  check "AUTO with block sizes cuda lacks plans on the cpu" $? "$(cat so se)"
  gpu --block-q 64 --backend cuda
  rc=$?
  [ $rc = 1 ] && grep -q "block sizes 64x0 (block_q, block_k; 0: the backend's) cannot set them" se
  check "--backend cuda with block sizes it lacks: exit 1 (unsupported)" $? "exit $rc, $(cat se)"
  # the forward's own tiles: taken for the forward alone, the backward ran its 64 x 128
  # regardless; block sizes set both passes (as on the cpu), so cuda refuses them, naming both
  gpu --block-q 128 --block-k 64 --backend cuda
  rc=$?
  [ $rc = 1 ] && grep -q "128x64 forward and 64x128 backward; block sizes 128x64" se
  check "--backend cuda with its forward's tiles (not its backward's): exit 1, both named" $? "exit $rc, $(cat se)"
  gpu --block-q 128 --block-k 64 && grep -q "^backend   cpu" so && grep -q "forward 128 x 64, backward 128 x 64" so
  check "AUTO with the cuda forward's tiles plans on the cpu, which runs them in both passes" $? "$(cat so se)"
else
  echo "skip AUTO on a GPU machine: no CUDA backend in this build (tests/fake_gpu.c not built)"
fi

echo "$pass passed, $fail failed"
[ $fail = 0 ]
