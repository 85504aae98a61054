#!/usr/bin/env bash
# The Hopper forward (FA_CUDA_KERNEL=hopper, src/cuda/cuda_hopper_fwd.cuh) on an H100/H200,
# in one go (about 3-5 minutes with prebuilt binaries):
#   1. build test_cuda and cuda_bench with FA_CUDA=ON, sm_90a only - skipped when
#      FA_PREBUILT names a folder that already holds both, built for this machine;
#   2. tests/test_cuda: every case with the mma.sync kernels, then (on sm_90) every case
#      again with the Hopper forward opted in; the log shows how many launches reached it;
#      then the Hopper cases alone once more with ping-pong (FA_CUDA_HOPPER_PINGPONG=1);
#   3. the forward of the three (mma.sync, hopper, hopper + ping-pong), bf16, B=2 H=16
#      S=4096 D=64/128/256, causal and not, and the seed problem's forward (B=18 H=32
#      S=16384 D=256) unless SKIP_SEED=1; a Hopper variant is timed only when its test
#      pass finished (a hang would eat the device budget);
#   4. torch SDPA (flash and cuDNN) on the same shapes, unless SKIP_PEERS=1;
#   5. the table, printed last: median of ITERS (default 20) timed calls after warm-up
#      (CUDA events), useful flops (4 B H S^2 D, half of it causal) for every row.
# Logs go to $OUT (when set) or build-dev/. Usage: bash bench/hopper_device_check.sh
# ---- 1. build (bench/cuda_build.sh) ------------------------------------------------
. "$(dirname "$0")/cuda_build.sh"
cuda_build name,driver_version,compute_cap,clocks.sm,clocks.max.sm

# ---- 2. correctness (both kernels) --------------------------------------------------------
test_rc=1
hopper_ok=0
pingpong_ok=0
if [ -x "$bld/test_cuda" ]; then
  log "test_cuda (mma.sync pass, then the hopper pass)"
  FA_TEST_CUDA_RANDOM=${FA_TEST_CUDA_RANDOM:-12} timeout 420 "$bld/test_cuda" >"$out/test_cuda.log" 2>&1
  test_rc=$?
  grep -E "FAIL|SKIP|cases|hopper pass|seed" "$out/test_cuda.log" | head -40
  echo "PASS lines: $(grep -c '^PASS [^h]' "$out/test_cuda.log") mma.sync, $(grep -c '^PASS hopper' "$out/test_cuda.log") hopper"
  grep -q "^hopper pass:" "$out/test_cuda.log" && hopper_ok=1
  if [ $hopper_ok = 1 ]; then
    log "test_cuda, Hopper cases only, ping-pong"
    FA_CUDA_HOPPER_PINGPONG=1 FA_TEST_CUDA_ONLY_HOPPER=1 FA_TEST_CUDA_RANDOM=6 timeout 200 "$bld/test_cuda" \
      >"$out/test_cuda_pingpong.log" 2>&1
    echo "ping-pong: rc $?, $(grep -c '^PASS hopper-pingpong' "$out/test_cuda_pingpong.log") PASS," \
      "$(grep -c '^FAIL' "$out/test_cuda_pingpong.log") FAIL lines"
    grep -E "^FAIL" "$out/test_cuda_pingpong.log" | head -10
    grep -q "^hopper pass:" "$out/test_cuda_pingpong.log" && pingpong_ok=1
  fi
  if [ $test_rc != 0 ] && [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
    log "compute-sanitizer memcheck, fixed cases only"
    FA_TEST_CUDA_RANDOM=0 timeout 200 compute-sanitizer --tool memcheck --print-limit 5 \
      "$bld/test_cuda" >"$out/sanitizer.log" 2>&1
    grep -vE "^(PASS|test_cuda)" "$out/sanitizer.log" | head -40
  fi
fi

# ---- 3. timings of both kernels ----------------------------------------------------------
ours="$out/ours.jsonl"   # mma.sync rows (the peers time these shapes)
hop="$out/hopper.jsonl"  # FA_CUDA_KERNEL=hopper rows, with and without ping-pong
: >"$ours"
: >"$hop"
bench() { # $1: output file, $2: variant ("", hopper or hopper-pingpong), rest: cuda_bench arguments
  local f=$1 k=$2 pp=0
  shift 2
  [ "$k" = hopper-pingpong ] && pp=1
  FA_CUDA_KERNEL=${k%-pingpong} FA_CUDA_HOPPER_PINGPONG=$pp timeout 120 "$bld/cuda_bench" --no-backward \
    --iters "$ITERS" "$@" >>"$f.tmp" 2>>"$out/bench.err" || log "cuda_bench ${k:-mma} $* failed: $(tail -1 "$out/bench.err")"
  if [ -n "$k" ]; then sed "s/\"impl\": \"flashattn\"/\"impl\": \"flashattn-$k\"/" "$f.tmp" >>"$f"; else cat "$f.tmp" >>"$f"; fi
  rm -f "$f.tmp"
}
if [ -x "$bld/cuda_bench" ]; then
  shapes=()
  for D in 64 128 256; do
    for c in "" "--causal"; do shapes+=("--batch 2 --heads 16 --seq 4096 --head-dim $D $c"); done
  done
  [ "${SKIP_SEED:-0}" != 1 ] && shapes+=("--batch 18 --heads 32 --seq 16384 --head-dim 256 --warmup 2")
  for s in "${shapes[@]}"; do
    # shellcheck disable=SC2086
    bench "$ours" "" $s
    # shellcheck disable=SC2086
    if [ $hopper_ok = 1 ]; then bench "$hop" hopper $s; fi
    # shellcheck disable=SC2086
    if [ $pingpong_ok = 1 ]; then bench "$hop" hopper-pingpong $s; fi
  done
  [ $hopper_ok = 1 ] || log "no hopper timings: its test pass did not finish"
fi

# ---- 4. peers ------------------------------------------------------------------------------
cuda_peers "$ours" 300 # bench/cuda_build.sh: torch SDPA on the same shapes, into $peers

# ---- 5. the table ----------------------------------------------------------------------------
echo
echo "Hopper check on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%Y-%m-%d)," \
  "test_cuda rc=$test_rc ($(grep -c '^FAIL hopper' "$out/test_cuda.log" 2>/dev/null) hopper failures," \
  "$(grep -c '^FAIL' "$out/test_cuda_pingpong.log" 2>/dev/null) ping-pong failures)"
python3 bench/cuda_peers.py hopper-table "$ours" "$hop" "$peers"
