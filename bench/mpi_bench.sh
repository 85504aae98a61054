#!/usr/bin/env bash
# Sequence-parallel timings on this machine (README, "Past one machine"): the CPU kernel in
# one process, then `flashattn bench --seq-parallel` with P = 1 and 2 ranks for the ring,
# the zigzag ring and Ulysses, each rank on one thread. Prints the load average first: on a
# shared machine, waiting on communication includes waiting for a slower peer.
# Usage: bash bench/mpi_bench.sh [BUILD]   (SHAPE=... to change the problem)
set -euo pipefail
BUILD=${1:-build}
FA=$BUILD/flashattn
SHAPE=${SHAPE:-"--batch 1 --heads 8 --seq 4096 --head-dim 128 --dtype bf16 --causal"}
export OMP_NUM_THREADS=1
echo "== $(getconf _NPROCESSORS_ONLN) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $SHAPE"
echo "== one process, 1 thread"
"$FA" bench $SHAPE --threads 1 --iters 3 2>/dev/null
for np in 1 2; do
  for sp in "ring" "ring --zigzag" "ulysses"; do
    echo "== mpirun -np $np ... --seq-parallel $sp"
    mpirun --oversubscribe --allow-run-as-root -np $np "$FA" bench $SHAPE --iters 3 --seq-parallel $sp 2>/dev/null
  done
done
