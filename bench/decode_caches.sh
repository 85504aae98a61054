#!/usr/bin/env bash
# Decode over every cache type (`make bench-inference` runs it after bench/inference.sh):
# B=1 Hq=32 Hk=8 D=128, 32768 cached tokens, Sq_new=1, caches on 2 MiB pages, bf16 compute;
# caches of bf16, f16 (f16 compute), int8 and fp8 e4m3 (one f32 scale per token and kv head,
# docs/caches.md). Per round, interleaved: the streaming read (bench/bandwidth, 1 GiB), then
# each cache type; medians over the rounds of each type's bytes per second (codes and scales
# it reads), its ratio to the same round's read, and its time over bf16's in the same round
# (wall seconds, and the threads' cpu seconds: on a shared machine the wall time of a step is
# bound by the CPU share the run gets, the cpu time less so). Each call reads the next of
# LAYERS sets of caches (`bench --decode --layers`, as a model's step reads each layer's own):
# one 134 MB bf16 set would sit in a 300 MiB last-level cache after the first call and be read
# from there, not from the memory the streaming read measures.
# Targets (docs/caches.md): every type >= 0.8 of the read; int8 and fp8 time <= 0.6 of bf16's.
# Prints a markdown section; with --record also appends it to bench/RESULTS.md.
# Environment: BUILD (default build), THREADS (default 2), ROUNDS (default 3), LAYERS (default 8:
# 1.07 GB of bf16 caches, 0.55 GB of int8 or fp8 ones).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD:-build}"
THREADS="${THREADS:-2}"
ROUNDS="${ROUNDS:-3}"
LAYERS="${LAYERS:-8}"
RECORD=0
[ "${1:-}" = "--record" ] && RECORD=1

cmake -S . -B "$BUILD" >/dev/null
cmake --build "$BUILD" -j"$THREADS" --target flashattn_cli bandwidth >&2
FA="$BUILD/flashattn"
# a CLI run's stdout; a refused or failed run stops the script with the CLI's reason (its
# stderr otherwise holds the per-iteration lines, kept out of the table)
ERR=$(mktemp)
trap 'rm -f "$ERR"' EXIT
cli() { "$FA" "$@" 2>"$ERR" || { echo "decode_caches.sh: flashattn $*: $(tail -n 3 "$ERR")" >&2; exit 1; }; }
SHAPE="--batch 1 --heads 32 --kv-heads 8 --head-dim 128 --cache-len 32768 --threads $THREADS --iters 24 --json --huge-pages --layers $LAYERS"
json() { sed -n "s/.*\"$1\": \([0-9.e+-]*\).*/\1/p" | head -1; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {printf "%.3f", (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
median_ms() { median $(for x in "$@"; do awk "BEGIN {print $x * 1000}"; done); } # seconds in, milliseconds out
ratio() { awk "BEGIN {printf \"%.3f\", $1 / $2}"; }
KINDS=(bf16 f16 int8 fp8)
declare -A FLAGS=([bf16]="--dtype bf16" [f16]="--dtype f16" [int8]="--dtype bf16 --cache-dtype int8"
                  [fp8]="--dtype bf16 --cache-dtype fp8")
declare -A GBS VSREAD VSBF16 CPUVSBF16 SEC
BWS=""
for r in $(seq "$ROUNDS"); do
    bw=$("$BUILD/bandwidth" 1024 "$THREADS" 5 huge | json read_gbytes_per_s)
    BWS+=" $bw"
    declare -A t=() c=()
    for kind in "${KINDS[@]}"; do
        out=$(cli bench --decode $SHAPE ${FLAGS[$kind]})
        g=$(echo "$out" | json gbytes_per_s) s=$(echo "$out" | json seconds)
        t[$kind]=$s c[$kind]=$(echo "$out" | json cpu_seconds)
        GBS[$kind]+=" $g" VSREAD[$kind]+=" $(ratio "$g" "$bw")" SEC[$kind]+=" $s"
    done
    for kind in "${KINDS[@]}"; do
        VSBF16[$kind]+=" $(ratio "${t[$kind]}" "${t[bf16]}")" CPUVSBF16[$kind]+=" $(ratio "${c[$kind]}" "${c[bf16]}")"
    done
    echo "bench: round $r: read $bw GB/s; $(for k in "${KINDS[@]}"; do printf '%s %s s ' "$k" "${t[$k]}"; done)" >&2
done
rows() {
    for kind in "${KINDS[@]}"; do
        echo "| $kind | $(median_ms ${SEC[$kind]}) | $(median ${GBS[$kind]}) | $(median ${VSREAD[$kind]}) | $(median ${VSBF16[$kind]}) | $(median ${CPUVSBF16[$kind]}) |"
    done
}
section=$(cat <<MD

## Decode over each cache type, $(date -u '+%Y-%m-%d %H:%M') UTC

Command: \`bash bench/decode_caches.sh\` ($THREADS threads, $ROUNDS rounds, medians; load average
$(cut -d' ' -f1-3 /proc/loadavg)). B=1, Hq=32, Hk=8, D=128, 32768 cached tokens, Sq_new=1, caches on
2 MiB pages, $LAYERS sets of them read in turn (one per call, as a model's layers); GB/s counts the bytes each cache type reads (int8 and fp8: codes and scales).
Streaming read (same rounds): $(median $BWS) GB/s.

| cache | ms a call | GB/s | vs streaming read | time vs bf16 | cpu time vs bf16 |
| --- | --- | --- | --- | --- | --- |
$(rows)
MD
)
echo "$section"
if [ $RECORD = 1 ]; then echo "$section" >> bench/RESULTS.md; fi
