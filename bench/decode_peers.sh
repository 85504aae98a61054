#!/usr/bin/env bash
# Decode against its peers (bench/decode_peers.py): builds flashattn's library, CLI and the
# streaming read (bench/bandwidth), installs the peers into their own venv (bench/setup.sh:
# ~/.cache/flashattn/bench-venv; torch comes from the project venv), then prints the table.
#   bash bench/decode_peers.sh [--record] [decode_peers.py flags: --cache-len 32768 --rounds 3
#                                           --iters 10 --threads 2 --only ggml,openvino,...]
# --record appends the section to bench/RESULTS.md. Environment: BUILD (default build).
# Run it on a quiet machine: every figure is a share of the memory link the others use too.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD:-build}"
cmake -S . -B "$BUILD" >/dev/null  # Release unless the folder says otherwise (CMakeLists.txt)
cmake --build "$BUILD" -j"$(nproc)" --target flashattn flashattn_cli bandwidth >&2
bash bench/setup.sh --decode-peers
exec python3 bench/decode_peers.py --build "$BUILD" "$@"
