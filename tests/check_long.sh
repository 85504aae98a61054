#!/usr/bin/env bash
# The long differential run (make check-long): FA_CHECK_CASES random configurations of the
# forward and as many of the backward (default 10000 each) against the float64 reference,
# drawn by the generators of test_forward.c and test_backward.c (every option on or off
# independently: masks, windows, softcap, scale, bias, ALiBi, segment ids, diagonal offset,
# GQA/MQA, Sq != Sk, odd sizes, strided layouts, f32/f16/bf16, block sizes, threads), then a
# tenth as many block-sparse mask cases (test_mask_attention.c: both passes and their counts).
# One seed drives both programs; it is printed, and FA_TEST_SEED=<seed> reproduces the run;
# FA_CHECK_ONLY=<n> with the same seed and count replays case #n alone (the others only draw).
# make test runs two slices of 60: a fixed seed and a fresh one (CMakeLists.txt).
# Usage: bash tests/check_long.sh BUILD_DIR   (FA_ISA picks the kernels, as everywhere)
set -u
BUILD=${1:-build}
N=${FA_CHECK_CASES:-10000}
case $N in *[!0-9]*|''|0) echo "check-long: FA_CHECK_CASES must be a positive count, got '$N'"; exit 2 ;; esac
for t in test_forward test_backward; do
  [ -x "$BUILD/$t" ] || { echo "check-long: missing $BUILD/$t (build first)"; exit 2; }
done
# a fresh seed unless one is given; below 2^63 so that every tool reads it alike
SEED=${FA_TEST_SEED:-$((($(date +%s%N) ^ ($$ << 40)) & 0x7fffffffffffffff))}
echo "check-long: seed $SEED, $N forward + $N backward configurations, isa ${FA_ISA:-auto}"
echo "check-long: FA_TEST_SEED=$SEED FA_CHECK_CASES=$N make check-long reproduces this run"
start=$(date +%s)
rc=0
for t in test_forward test_backward; do
  t0=$(date +%s)
  FA_TEST_SEED=$SEED FA_CHECK_CASES=$N "$BUILD/$t" || rc=1
  echo "check-long: $t took $(($(date +%s) - t0)) s"
done
# block-sparse masks (docs/masks.md): a tenth as many, each runs both passes and their counts
if [ -x "$BUILD/test_mask_attention" ]; then
  t0=$(date +%s)
  FA_TEST_SEED=$SEED FA_CHECK_CASES=$(((N + 9) / 10)) "$BUILD/test_mask_attention" | grep -v '^PASS'
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  echo "check-long: test_mask_attention took $(($(date +%s) - t0)) s"
fi
if [ $rc -eq 0 ]; then
  echo "check-long: PASSED $((2 * N)) configurations in $(($(date +%s) - start)) s (seed $SEED)"
else
  echo "check-long: FAILED (seed $SEED; FA_TEST_SEED=$SEED FA_CHECK_CASES=$N reproduces)"
fi
exit $rc
