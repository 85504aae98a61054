#!/usr/bin/env bash
# The CUDA backend on a GPU machine, in one go (about 4-6 minutes on an H200):
#   1. build with FA_CUDA=ON (sm_90a only, to keep it short) - skipped when FA_PREBUILT
#      names a folder that already holds test_cuda and cuda_bench built for this machine;
#   2. tests/test_cuda (correctness against the float64 reference, counts == plan); on a
#      failure, once more under compute-sanitizer memcheck with the fixed cases only;
#   3. bench/cuda_bench on B=2 H=16 S=4096 D=64/128/256, causal and not, bf16, forward and
#      forward+backward, then the seed problem (B=18 H=32 S=16384 D=256 bf16, forward,
#      with its peak device memory);
#   4. torch SDPA (flash and cuDNN backends) on the same shapes, same flop counts;
#   5. the table, printed last whatever failed before.
# Logs go to $OUT (when set) or build-dev/. Usage: bash bench/cuda_device_check.sh
# Knobs (environment): ITERS (timed calls, default 20), SKIP_SEED=1, SKIP_PEERS=1, NCU=1
# (Nsight Compute on the D=128 forward and backward kernels, summary in the log).
# ---- 1. build (bench/cuda_build.sh) ------------------------------------------------
. "$(dirname "$0")/cuda_build.sh"
cuda_build name,driver_version,memory.total,clocks.sm,clocks.max.sm

# ---- 2. correctness ---------------------------------------------------------------------
test_rc=1
if [ -x "$bld/test_cuda" ]; then
  log "test_cuda"
  timeout 420 "$bld/test_cuda" >"$out/test_cuda.log" 2>&1 # on sm_90: a second, Hopper pass
  test_rc=$?
  grep -E "FAIL|SKIP|cases" "$out/test_cuda.log" | head -40
  if [ $test_rc != 0 ] && command -v compute-sanitizer >/dev/null; then
    log "test_cuda failed (rc $test_rc): compute-sanitizer memcheck, fixed cases only"
    FA_TEST_CUDA_RANDOM=0 timeout 150 compute-sanitizer --tool memcheck --print-limit 5 \
      "$bld/test_cuda" >"$out/sanitizer.log" 2>&1
    grep -vE "^(PASS|test_cuda)" "$out/sanitizer.log" | head -40
  fi
fi

# ---- 3. our timings ---------------------------------------------------------------------
ours="$out/ours.jsonl"
: >"$ours"
if [ -x "$bld/cuda_bench" ]; then
  for D in 64 128 256; do
    for c in "" "--causal"; do
      timeout 90 "$bld/cuda_bench" --batch 2 --heads 16 --seq 4096 --head-dim $D $c --iters "$ITERS" >>"$ours" 2>>"$out/bench.err" ||
        log "cuda_bench D=$D $c failed: $(tail -1 "$out/bench.err")"
    done
  done
  if [ "${SKIP_SEED:-0}" != 1 ]; then
  log "seed problem: B=18 H=32 S=16384 D=256 bf16 forward"
  timeout 150 "$bld/cuda_bench" --batch 18 --heads 32 --seq 16384 --head-dim 256 --no-backward --iters "$ITERS" \
    --warmup 2 >>"$ours" 2>>"$out/bench.err" || log "seed problem failed: $(tail -1 "$out/bench.err")"
  fi
  if [ "${NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
    log "ncu: D=128 non-causal forward and backward kernels"
    timeout 180 ncu --clock-control none -k 'regex:fwd_kernel|dkdv_kernel|dq_kernel|delta_kernel' -c 6 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis_Tables \
      "$bld/cuda_bench" --batch 2 --heads 16 --seq 4096 --head-dim 128 --iters 1 --warmup 0 >"$out/ncu.txt" 2>&1
    grep -E "fwd_kernel|dkdv_kernel|dq_kernel|delta_kernel|^ +Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Stall|Bank|Shared Load|Shared Store|Issue Slot|Warp Cycles Per Issued" "$out/ncu.txt" | cut -c1-150 | head -90
  fi
fi
cat "$ours" >&2

# ---- 4. peers ---------------------------------------------------------------------------
cuda_peers "$ours" 240 # bench/cuda_build.sh: torch SDPA on the same shapes, into $peers

# ---- 5. the table -----------------------------------------------------------------------
echo
echo "CUDA check on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%Y-%m-%d), test_cuda rc=$test_rc"
python3 bench/cuda_peers.py table "$ours" "$peers" || cat "$ours" "$peers"
