#!/usr/bin/env bash
# Installs what the CPU benchmark's peers need, idempotently:
#   - Debian's OpenBLAS (libopenblas-dev) for the naive attention peer (bench/naive_openblas.c)
#   - a venv at bench/.venv with numpy, jax[cpu] and torch (for bench/peers.py)
#   - the decode peers' venv at ~/.cache/flashattn/bench-venv (bench/decode_peers.py): numpy,
#     ml_dtypes, OpenVINO, ONNX Runtime (+ onnx), ggml-python (built from its source
#     distribution: cmake and a C compiler, for this CPU). Never the test venv.
#     `bash bench/setup.sh --decode-peers` does this one alone.
# Safe to run again: every step checks first. A step that fails is reported and the
# benchmark skips that peer (it never stops the rest).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
log() { echo "[setup] $*" >&2; }

# ---- decode peers (bench/decode_peers.py) ----------------------------------------------------
decode_peers() {
    local py="${PYTHON:-python3}"
    # Versions pinned: the figures in bench/RESULTS.md name them. PEERS_UNPINNED=1 takes the newest.
    bvenv="$HOME/.cache/flashattn/bench-venv"
    if [ ! -x "$bvenv/bin/python" ]; then
        log "creating $bvenv"
        "$py" -m venv "$bvenv" || { log "could not create $bvenv: decode peers skipped"; return 0; }
    fi
    bpy="$bvenv/bin/python"
    bhave() { "$bpy" -c "import $1" >/dev/null 2>&1; }
    bpip() { "$bpy" -m pip install -q --disable-pip-version-check "$@" >&2; }
    pin() { if [ "${PEERS_UNPINNED:-0}" = 1 ]; then echo "${1%%==*}"; else echo "$1"; fi; }
    bhave numpy || bpip numpy || log "numpy install failed (bench venv)"
    bhave ml_dtypes || bpip ml_dtypes || log "ml_dtypes install failed: flashattn's bf16 rows skipped"
    bhave openvino || { log "installing openvino"; bpip "$(pin openvino==2026.4.1)" || log "openvino install failed: skipped"; }
    bhave onnxruntime || { log "installing onnxruntime"; bpip "$(pin onnxruntime==1.32.0)" "$(pin onnx==1.23.2)" ||
        log "onnxruntime install failed: skipped"; }
    # ggml-python has no wheel: pip builds ggml for this CPU (GGML_NATIVE), a few minutes on 2 cores
    bhave ggml || { log "building ggml-python"; CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" bpip "$(pin ggml-python==0.0.45)" ||
        log "ggml-python install failed: ggml skipped"; }
    for m in numpy ml_dtypes openvino onnxruntime ggml; do
        if bhave $m; then log "bench venv $m: $("$bpy" -c "import $m; print($m.__version__)")"; else log "bench venv $m: missing"; fi
    done
}

# --decode-peers: only the decode peers' venv (what bench/decode_peers.sh needs)
if [ "${1:-}" = "--decode-peers" ]; then decode_peers; exit 0; fi

# ---- OpenBLAS ------------------------------------------------------------------------
if ! dpkg -s libopenblas-dev >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        log "installing libopenblas-dev"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenblas-dev) >&2 ||
            log "could not install libopenblas-dev: the OpenBLAS peer will be skipped"
    else
        log "libopenblas-dev missing and not root: the OpenBLAS peer will be skipped"
    fi
else
    log "libopenblas-dev present"
fi

# ---- Python peers ----------------------------------------------------------------------
py="${PYTHON:-python3}"
shared="$HOME/.cache/flashattn/venv"   # the project's shared venv, where one exists: reuse it
if [ ! -e "$venv" ] && [ -x "$shared/bin/python" ]; then
    log "using $shared"
    ln -s "$shared" "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
    log "creating $venv"
    "$py" -m venv "$venv" || { log "could not create the venv: Python peers skipped"; exit 0; }
fi
vpy="$venv/bin/python"
have() { "$vpy" -c "import $1" >/dev/null 2>&1; }
pipi() { "$vpy" -m pip install -q --disable-pip-version-check "$@" >&2; }

have numpy || { log "installing numpy"; pipi numpy || log "numpy install failed"; }
have jax || { log "installing jax[cpu]"; pipi "jax[cpu]" || log "jax install failed: jax peer skipped"; }
# PyPI's Linux torch wheel depends on the CUDA runtime packages (several GB); they are
# only downloaded once, into the venv, and the CPU benchmark never loads them.
have matplotlib || { log "installing matplotlib (the plots)"; pipi matplotlib || log "matplotlib install failed: plots skipped"; }
have torch || { log "installing torch (large download, first time only)"; pipi torch ||
    log "torch install failed: torch peer skipped"; }

for m in numpy jax torch; do
    if have $m; then log "$m: $("$vpy" -c "import $m; print($m.__version__)")"; else log "$m: missing"; fi
done

decode_peers
exit 0
