#!/usr/bin/env bash
# The inference shapes' benchmark (`make bench-inference`, or `bash bench/run.sh --inference`):
#   decode: flashattn bench --decode (B=1 Hq=32 Hk=8 D=128, bf16 cache of 32768 tokens,
#           Sq_new=1) as bytes of cache read per second, against this machine's streaming read
#           bandwidth (bench/bandwidth: 1 GiB arrays, far larger than the caches) measured in
#           the same run, interleaved (bandwidth, decode, bandwidth, ...: a shared machine's
#           load moves both alike), and against PyTorch CPU SDPA (enable_gqa=True) on the same
#           shapes (bench/decode_peer.py).
#   varlen: 8 sequences of 128..4096 tokens packed (cu_seqlens) against the same batch padded
#           to 4096 with segment ids, time per useful flop.
# Prints a markdown section; with --record also appends it to bench/RESULTS.md.
# Environment: BUILD (default build), THREADS (default 2), PYTHON (default the project venv),
# ROUNDS (default 5).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD:-build}"
THREADS="${THREADS:-2}"
ROUNDS="${ROUNDS:-5}"
PYTHON="${PYTHON:-$HOME/.cache/flashattn/venv/bin/python}"
RECORD=0
[ "${1:-}" = "--record" ] && RECORD=1

cmake -S . -B "$BUILD" >/dev/null
cmake --build "$BUILD" -j"$THREADS" --target flashattn_cli bandwidth >&2
FA="$BUILD/flashattn"
SHAPE="--batch 1 --heads 32 --kv-heads 8 --head-dim 128 --cache-len 32768 --dtype bf16 --threads $THREADS"
json() { sed -n "s/.*\"$1\": \([0-9.e+-]*\).*/\1/p" | head -1; }

# per round: bandwidth, decode with THREADS threads, bandwidth and decode with 1 thread; wall
# rates and rates per cpu-second of each thread (what the threads did while they ran: the
# machine's other jobs deschedule them, and wall time then counts the waits)
bw=() bwc=() dec=() decc=() bw1=() bw1c=() one=() onec=()
for r in $(seq "$ROUNDS"); do
    b=$("$BUILD/bandwidth" 1024 "$THREADS" 5)
    d=$("$FA" bench --decode $SHAPE --iters 20 --json 2>/dev/null)
    b1=$("$BUILD/bandwidth" 1024 1 5)
    o=$("$FA" bench --decode ${SHAPE/--threads $THREADS/--threads 1} --iters 20 --json 2>/dev/null)
    bw+=("$(echo "$b" | json read_gbytes_per_s)") bwc+=("$(echo "$b" | json read_gbytes_per_cpu_s)")
    dec+=("$(echo "$d" | json gbytes_per_s)") decc+=("$(echo "$d" | json gbytes_per_cpu_s)")
    bw1+=("$(echo "$b1" | json read_gbytes_per_s)") bw1c+=("$(echo "$b1" | json read_gbytes_per_cpu_s)")
    one+=("$(echo "$o" | json gbytes_per_s)") onec+=("$(echo "$o" | json gbytes_per_cpu_s)")
    echo "bench: round $r: bandwidth ${bw[-1]} GB/s, decode ${dec[-1]} GB/s (1 thread: ${bw1[-1]}, ${one[-1]})" >&2
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {printf "%.2f", (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
BW=$(median "${bw[@]}") BWC=$(median "${bwc[@]}")
DEC=$(median "${dec[@]}") DECC=$(median "${decc[@]}") ONE=$(median "${one[@]}") ONEC=$(median "${onec[@]}")
BW1=$(median "${bw1[@]}") BW1C=$(median "${bw1c[@]}")
ratio() { awk "BEGIN {printf \"%.2f\", $1 / $2}"; }
torch_line=$("$PYTHON" bench/decode_peer.py --threads "$THREADS" --iters 10 2>/dev/null || echo '{}')
TORCH=$(echo "$torch_line" | json gbytes_per_s)
TORCH_V=$(echo "$torch_line" | sed -n 's/.*"torch": "\([^"]*\)".*/\1/p')
vl=$("$FA" bench --varlen 128,256,512,1024,1536,2048,3072,4096 --heads 8 --head-dim 64 --causal \
      --threads "$THREADS" --iters 3 --json 2>/dev/null | tail -1)
vk=$(echo "$vl" | sed -n 's/.*"varlen": {\([^}]*\)}.*/\1/p')
vd=$(echo "$vl" | sed -n 's/.*"padded": {\([^}]*\)}.*/\1/p')

section=$(cat <<MD

## Inference shapes, $(date -u '+%Y-%m-%d %H:%M') UTC

Command: \`bash bench/inference.sh\` ($THREADS threads). Machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1),
$(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg) (shared with other jobs: the figures move
run to run; the bandwidth and the decode are measured interleaved, $ROUNDS rounds, medians).
ISA: $("$FA" plan --batch 1 --heads 1 --seq 1 --head-dim 8 --json | sed -n 's/.*"isa": "\([a-z0-9]*\)".*/\1/p').

Decode (B=1, Hq=32, Hk=8, D=128, bf16 cache of 32768 tokens = 128 MiB of K and V, Sq_new=1; useful
flops 4 x 32 x 32768 x 128 = 537 MFLOP per step, the cost is bytes):

| what | GB/s (wall) | vs streaming read | GB/s per thread cpu-second | vs streaming read |
| --- | --- | --- | --- | --- |
| streaming read (bench/bandwidth, 1 GiB, $THREADS threads) | $BW | 1.00 | $BWC | 1.00 |
| flashattn decode, $THREADS threads (bytes of cache read per second) | $DEC | $(ratio $DEC $BW) | $DECC | $(ratio $DECC $BWC) |
| streaming read, 1 thread | $BW1 | 1.00 | $BW1C | 1.00 |
| flashattn decode, 1 thread (vs the 1-thread read) | $ONE | $(ratio $ONE $BW1) | $ONEC | $(ratio $ONEC $BW1C) |
| PyTorch $TORCH_V SDPA enable_gqa, $THREADS threads | $(printf '%.3f' "${TORCH:-0}") | $( [ -n "$TORCH" ] && ratio $TORCH $BW || echo n/a) | | |

flashattn / PyTorch ($THREADS threads, wall): $( [ -n "$TORCH" ] && awk "BEGIN {printf \"%.1fx\", $DEC / $TORCH}" || echo n/a).
Rounds (wall GB/s): bandwidth ${bw[*]}; decode ${dec[*]}; bandwidth 1 thread ${bw1[*]}; decode 1 thread ${one[*]}.

Varlen prefill (8 sequences of 128, 256, 512, 1024, 1536, 2048, 3072, 4096 tokens, Hq=Hk=8, D=64,
f32, causal; both runs do the same useful flops):
packed (cu_seqlens): $vk; padded to 4096 with segment ids: $vd;
packed time per useful flop = $(echo "$vl" | json time_per_useful_flop_ratio) x the padded run's.
MD
)
echo "$section"
if [ $RECORD = 1 ]; then echo "$section" >> bench/RESULTS.md; fi
