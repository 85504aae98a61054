#!/usr/bin/env bash
# ctest entry: mpi_check under mpirun with P ranks, within a time limit (a hang fails).
# Exits 77 (skipped) where this build has no MPI component or mpirun is missing.
# Usage: bash tests/mpi/run_mpi.sh BUILD_DIR P
BUILD=${1:-build}
NP=${2:-2}
CHECK=$BUILD/mpi_check
if [ ! -x "$CHECK" ] || ! command -v mpirun >/dev/null; then
  echo "skipped: no MPI in this build (install libopenmpi-dev and reconfigure)"
  exit 77
fi
# one OpenMP thread per rank: ranks share this machine's cores
export OMP_NUM_THREADS=1
# sanitized builds: Open MPI's own leaks are suppressed; the slow unwinder reaches the MPI
# library frames even under its unloaded plugins, so that the suppressions match
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$(cd "$(dirname "$0")" && pwd)/lsan.supp:print_suppressions=0"
exec timeout 240 mpirun --oversubscribe --allow-run-as-root -np "$NP" "$CHECK"
