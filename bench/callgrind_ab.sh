#!/usr/bin/env bash
# Instruction counts of fa_forward / fa_backward in two builds (callgrind: the same binary and
# input give the same count under any load, where wall time on a shared VM moves by 25%).
# valgrind runs AVX2 and scalar code only (no AVX-512 or AMX), so it covers the drivers, the
# schedule and the ISA-independent code. Prints "isa dtype mask pass which count" lines.
#   bash bench/callgrind_ab.sh BEFORE/bench_fa AFTER/bench_fa
set -u
[ $# -eq 2 ] || { echo "usage: $0 BEFORE_BENCH_FA AFTER_BENCH_FA" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "needs valgrind" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for isa in avx2 scalar; do
for dt in f32 bf16; do
for cz in "" "--causal"; do
for pass in fwd bwd; do
  extra=(); fn=fa_forward; [ $pass = bwd ] && extra=(--backward --no-forward) && fn=fa_backward
  for which in before after; do
    bin=$1; [ $which = after ] && bin=$2
    FA_ISA=$isa OMP_NUM_THREADS=1 valgrind --tool=callgrind --callgrind-out-file="$tmp/cg" "$bin" --batch 1 \
      --heads 2 --seq 512 --head-dim 128 --threads 1 --reps 1 --dtype $dt $cz "${extra[@]}" --json >/dev/null 2>&1
    n=$(callgrind_annotate --inclusive=yes "$tmp/cg" 2>/dev/null | grep -E "[^_a-z]$fn " | head -1 |
        awk '{gsub(",","",$1); print $1}')
    echo "$isa $dt ${cz:-dense} $pass $which $n"
  done
done; done; done; done
