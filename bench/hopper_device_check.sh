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
set -u
cd "$(dirname "$0")/.."
root=$(pwd)
bld=${FA_PREBUILT:-$root/build-dev}
out=${OUT:-$bld}
mkdir -p "$out" "$bld"
ITERS=${ITERS:-20}
log() { echo "== $*" >&2; }

nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | head -2

# ---- 1. build -------------------------------------------------------------------------
"$bld/cuda_bench" --probe >/dev/null 2>&1 </dev/null
probe=$? # 2: it loaded and refused the argument; 127 and friends: it cannot run here
if [ -x "$bld/test_cuda" ] && [ $probe = 2 ]; then
  log "using the prebuilt binaries in $bld"
else
  log "building in $bld"
  t0=$(date +%s)
  timeout 420 cmake -S . -B "$bld" -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=ON -DFA_CUDA_ARCHS=90a >"$out/build.log" 2>&1 &&
    timeout 420 cmake --build "$bld" -j "$(nproc)" --target test_cuda cuda_bench >>"$out/build.log" 2>&1 ||
    { log "BUILD FAILED"; tail -30 "$out/build.log"; }
  log "build took $(($(date +%s) - t0)) s"
fi

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
peers="$out/peers.jsonl"
: >"$peers"
if [ -s "$ours" ] && [ "${SKIP_PEERS:-0}" != 1 ]; then
  log "torch SDPA peers"
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/cuda_peers.py time "$ours" "$peers" "$ITERS" 2>"$out/peers.err" ||
    log "peers failed: $(tail -3 "$out/peers.err")"
fi

# ---- 5. the table ----------------------------------------------------------------------------
echo
echo "Hopper check on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%Y-%m-%d)," \
  "test_cuda rc=$test_rc ($(grep -c '^FAIL hopper' "$out/test_cuda.log" 2>/dev/null) hopper failures," \
  "$(grep -c '^FAIL' "$out/test_cuda_pingpong.log" 2>/dev/null) ping-pong failures)"
python3 - "$ours" "$hop" "$peers" <<'PY'
import json, sys
rows = []
for path in sys.argv[1:]:
    try:
        rows += [json.loads(l) for l in open(path) if l.strip().startswith("{")]
    except OSError:
        pass
key = lambda r: (r["B"], r["H"], r["S"], r["D"], r["causal"])
shapes = []
for r in rows:
    if key(r) not in shapes:
        shapes.append(key(r))
print("forward, bf16, median ms; TFLOP/s of useful flops 4*B*H*S^2*D (causal: half)")
print("| shape | impl | fwd ms | TFLOP/s | speed vs torch-cudnn |")
print("| --- | --- | --- | --- | --- |")
for s in shapes:
    B, H, S, D, c = s
    useful = 4.0 * B * H * S * S * D * (0.5 if c else 1.0)
    ref = [r["fwd_ms"] for r in rows if key(r) == s and r["impl"] == "torch-cudnn" and r.get("fwd_ms")]
    for impl in ("flashattn", "flashattn-hopper", "flashattn-hopper-pingpong", "torch-flash", "torch-cudnn"):
        for r in rows:
            if key(r) != s or r["impl"] != impl:
                continue
            ms = r.get("fwd_ms")
            if not ms:
                print("| B=%d H=%d S=%d D=%d %s | %s | n/a (%s) | | |" % (B, H, S, D, "causal" if c else "full", impl,
                                                                      r.get("error", "no time")))
                continue
            ratio = "%.2fx" % (ref[0] / ms) if ref else "n/a"
            print("| B=%d H=%d S=%d D=%d %s | %s | %.3f | %.1f | %s |" % (B, H, S, D, "causal" if c else "full", impl,
                                                                        ms, useful / (ms * 1e-3) / 1e12, ratio))
PY
