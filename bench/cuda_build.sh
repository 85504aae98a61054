# Sourced by bench/cuda_device_check.sh and bench/hopper_device_check.sh: what both do first.
# Sets root, bld (FA_PREBUILT or build-dev/), out (OUT or bld), ITERS (default 20) and log;
# cuda_build FIELDS prints nvidia-smi's FIELDS, then builds test_cuda and cuda_bench with
# FA_CUDA=ON for sm_90a only - skipped when bld already holds both, built for this machine;
# cuda_peers OURS SECONDS times torch SDPA on OURS's shapes into $peers (bench/cuda_peers.py)
# unless SKIP_PEERS=1.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
bld=${FA_PREBUILT:-$root/build-dev}
out=${OUT:-$bld}
mkdir -p "$out" "$bld"
ITERS=${ITERS:-20}
log() { echo "== $*" >&2; }

cuda_build() {
  nvidia-smi --query-gpu="$1" --format=csv,noheader 2>&1 | head -2
  "$bld/cuda_bench" --probe >/dev/null 2>&1 </dev/null
  local probe=$? t0 # 2: it loaded and refused the argument; 127 and friends: it cannot run here
  if [ -x "$bld/test_cuda" ] && [ $probe = 2 ]; then
    log "using the prebuilt binaries in $bld"
    return
  fi
  log "building in $bld"
  t0=$(date +%s)
  timeout 420 cmake -S . -B "$bld" -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=ON -DFA_CUDA_ARCHS=90a >"$out/build.log" 2>&1 &&
    timeout 420 cmake --build "$bld" -j "$(nproc)" --target test_cuda cuda_bench >>"$out/build.log" 2>&1 ||
    { log "BUILD FAILED"; tail -30 "$out/build.log"; }
  log "build took $(($(date +%s) - t0)) s"
}

cuda_peers() {
  peers="$out/peers.jsonl"
  : >"$peers"
  [ -s "$1" ] && [ "${SKIP_PEERS:-0}" != 1 ] || return 0
  log "torch SDPA peers"
  PYTHONUNBUFFERED=1 timeout "$2" python3 bench/cuda_peers.py time "$1" "$peers" "$ITERS" 2>"$out/peers.err" ||
    log "peers failed: $(tail -3 "$out/peers.err")"
}
