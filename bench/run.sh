#!/usr/bin/env bash
# The CPU benchmark (`make bench`): installs the peers (bench/setup.sh), builds flashattn
# and the benchmark programs, measures this machine's peak, then times flashattn against
# its peers on the same shapes and appends a table to bench/RESULTS.md (bench/suite.py
# says what each column means).
#
#   bash bench/run.sh            the suite, 3 interleaved rounds (BENCH_RUNS): medians, ranges and
#                                the CPU targets checked (about 30-40 minutes on 2 cores)
#   bash bench/run.sh --quick    the headline case only (B=1 H=8 S=4096 D=128 f32)
#   bash bench/run.sh --blocks 256x128   flashattn with that tile instead of the default
#   bash bench/run.sh --inference  decode and varlen (bench/inference.sh; appends to RESULTS.md)
#   bash bench/run.sh --seed     the seed problem (B=18 H=32 S=16384 D=256 bf16, forward,
#                                18 GiB of tensors, about 10-20 min; --seed-heads N: N heads)
# Environment: BUILD (default build), THREADS (default 2), SKIP_SETUP=1.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD:-build}"
THREADS="${THREADS:-2}"

if [ "${1:-}" = "--inference" ]; then exec bash bench/inference.sh --record; fi # decode and varlen
if [ "${SKIP_SETUP:-0}" != 1 ]; then bash bench/setup.sh; fi

cmake -S . -B "$BUILD" >/dev/null
targets="flashattn_cli bench_fa peak"
# the OpenBLAS peer exists as a target only where libopenblas was found
# (read the whole list first: grep -q quitting early would fail the pipe under pipefail)
target_list=$(cmake --build "$BUILD" --target help 2>/dev/null || true)
if grep -q naive_openblas <<<"$target_list"; then
    targets="$targets naive_openblas"
fi
cmake --build "$BUILD" -j"$THREADS" --target $targets >&2

python3 bench/suite.py --build "$BUILD" --threads "$THREADS" "$@"

# The plots (bench/plots/*.png, linked from the README): a sequence-length sweep, run with
# the peers' Python (it has matplotlib); not for --quick or --seed runs.
case " $* " in *" --quick "*|*" --seed "*) exit 0 ;; esac
py=bench/.venv/bin/python
[ -x "$py" ] || py="$HOME/.cache/flashattn/venv/bin/python"
if [ -x "$py" ] && "$py" -c "import matplotlib" 2>/dev/null; then
    "$py" bench/plots.py --build "$BUILD" --threads "$THREADS"
else
    echo "[bench] no Python with matplotlib: plots skipped" >&2
fi
