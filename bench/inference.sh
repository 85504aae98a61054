#!/usr/bin/env bash
# The inference shapes' benchmark (`make bench-inference`, or `bash bench/run.sh --inference`):
#   decode: flashattn bench --decode (B=1 Hq=32 Hk=8 D=128, bf16 cache of 32768 tokens,
#           Sq_new=1) as bytes of cache read per second, against this machine's streaming read
#           bandwidth (bench/bandwidth: 1 GiB arrays, far larger than the caches) measured in
#           the same run, interleaved (bandwidth, decode, bandwidth, ...: a shared machine's
#           load moves both alike), and against PyTorch CPU SDPA (enable_gqa=True) on the same
#           shapes (bench/decode_peer.py, in every round after the 4 KiB pages' runs; checked
#           against float64 first: a wrong one shows WRONG and is not timed).
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
# a CLI run's stdout; a refused or failed run stops the script with the CLI's reason (its
# stderr otherwise holds the per-iteration lines, kept out of the table)
ERR=$(mktemp)
trap 'rm -f "$ERR"' EXIT
cli() { "$FA" "$@" 2>"$ERR" || { echo "inference.sh: flashattn $*: $(tail -n 3 "$ERR")" >&2; exit 1; }; }
SHAPE="--batch 1 --heads 32 --kv-heads 8 --head-dim 128 --cache-len 32768 --dtype bf16 --threads $THREADS"
json() { sed -n "s/.*\"$1\": \([0-9.e+-]*\).*/\1/p" | head -1; }

# per round, on 4 KiB pages and then on 2 MiB pages (the caches and the read's array alike):
# bandwidth, decode with THREADS threads, bandwidth and decode with 1 thread; wall rates and
# rates per cpu-second of each thread (what the threads did while they ran: the machine's
# other jobs deschedule them, and wall time then counts the waits)
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {printf "%.2f", (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
ratio() { awk "BEGIN {printf \"%.2f\", $1 / $2}"; }
ratios() { local -n xs=$1 ys=$2; for i in "${!xs[@]}"; do ratio "${xs[$i]}" "${ys[$i]}"; printf ' '; done; }
declare -A R # R[page,what]: the rounds' values, space-separated
R[4k,torch]="" TORCH_V="" TORCH_WRONG=""
for r in $(seq "$ROUNDS"); do
    for page in 4k 2m; do
        hb="" hd=""
        [ $page = 2m ] && hb="huge" hd="--huge-pages"
        b=$("$BUILD/bandwidth" 1024 "$THREADS" 5 $hb)
        d=$(cli bench --decode $SHAPE --iters 20 --json $hd)
        b1=$("$BUILD/bandwidth" 1024 1 5 $hb)
        o=$(cli bench --decode ${SHAPE/--threads $THREADS/--threads 1} --iters 20 --json $hd)
        R[$page,bw]+=" $(echo "$b" | json read_gbytes_per_s)" R[$page,bwc]+=" $(echo "$b" | json read_gbytes_per_cpu_s)"
        R[$page,dec]+=" $(echo "$d" | json gbytes_per_s)" R[$page,decc]+=" $(echo "$d" | json gbytes_per_cpu_s)"
        R[$page,bw1]+=" $(echo "$b1" | json read_gbytes_per_s)" R[$page,bw1c]+=" $(echo "$b1" | json read_gbytes_per_cpu_s)"
        R[$page,one]+=" $(echo "$o" | json gbytes_per_s)" R[$page,onec]+=" $(echo "$o" | json gbytes_per_cpu_s)"
        R[$page,huge]+=" $(echo "$d" | json huge_page_bytes)"
        if [ $page = 4k ]; then # PyTorch in the same round (its own tensors: 4 KiB pages)
            t=$("$PYTHON" bench/decode_peer.py --threads "$THREADS" --iters 10 2>/dev/null || true)
            TORCH_V=$(echo "$t" | sed -n 's/.*"torch": "\([^"]*\)".*/\1/p')
            w=$(echo "$t" | sed -n 's/.*"wrong": "\([^"]*\)".*/\1/p')
            [ -n "$w" ] && TORCH_WRONG=$w
            R[4k,torch]+=" $(echo "$t" | json gbytes_per_s)"
        fi
        echo "bench: round $r, $page pages: bandwidth $(echo "$b" | json read_gbytes_per_s) GB/s," \
             "decode $(echo "$d" | json gbytes_per_s) GB/s (1 thread: $(echo "$b1" | json read_gbytes_per_s)," \
             "$(echo "$o" | json gbytes_per_s))" >&2
    done
done
TORCH=""
[ -n "${R[4k,torch]// /}" ] && TORCH=$(median ${R[4k,torch]}) # the median over the rounds it ran in
# A round's link: "shared" when the THREADS-thread read is under 1.5 x the one-thread read (the
# threads share one memory link), else "own" (each has its own; a VM's placement can change
# between rounds). Per page size: the decode / read ratio of each round (interleaved, so the
# machine's drift cancels), and their medians over all rounds and over each kind of round.
link_of() { awk "BEGIN {print ($1 < 1.5 * $2) ? \"shared\" : \"own\"}"; }
round_ratios() { # page, kind (all, shared, own), threads (n or 1)
    local -a bw=(${R[$1,bw]}) dec=(${R[$1,dec]}) bw1=(${R[$1,bw1]}) one=(${R[$1,one]})
    for i in "${!bw[@]}"; do
        [ "$2" != all ] && [ "$(link_of "${bw[$i]}" "${bw1[$i]}")" != "$2" ] && continue
        if [ "$3" = 1 ]; then ratio "${one[$i]}" "${bw1[$i]}"; else ratio "${dec[$i]}" "${bw[$i]}"; fi
        echo
    done
}
med_or_none() { local xs; xs=$(cat); [ -n "$xs" ] && median $xs && printf ' (%d of %d rounds)' $(echo $xs | wc -w) "$ROUNDS" || printf 'none'; }
decode_rows() {
    local page=$1 label=$2
    local BW BWC DEC DECC BW1 BW1C ONE ONEC
    BW=$(median ${R[$page,bw]}) BWC=$(median ${R[$page,bwc]}) DEC=$(median ${R[$page,dec]}) DECC=$(median ${R[$page,decc]})
    BW1=$(median ${R[$page,bw1]}) BW1C=$(median ${R[$page,bw1c]}) ONE=$(median ${R[$page,one]}) ONEC=$(median ${R[$page,onec]})
    echo "| streaming read, $label ($THREADS threads) | $BW | 1.00 | $BWC | 1.00 |"
    echo "| **flashattn decode, $label, $THREADS threads** | $DEC | **$(round_ratios $page all n | med_or_none)** | $DECC | $(ratio $DECC $BWC) |"
    echo "| streaming read, $label, 1 thread | $BW1 | 1.00 | $BW1C | 1.00 |"
    echo "| flashattn decode, $label, 1 thread | $ONE | $(round_ratios $page all 1 | med_or_none) | $ONEC | $(ratio $ONEC $BW1C) |"
}
decode_rounds() {
    local page=$1 label=$2
    local -a bw=(${R[$page,bw]}) dec=(${R[$page,dec]}) bw1=(${R[$page,bw1]}) one=(${R[$page,one]})
    echo "- $label: bandwidth ${bw[*]}; decode ${dec[*]}; 1 thread: bandwidth ${bw1[*]}; decode ${one[*]}."
    echo "  Decode / read, round by round: $(ratios dec bw)($THREADS threads); $(ratios one bw1)(1 thread)."
    echo "  Links, round by round: $(for i in "${!bw[@]}"; do printf '%s ' "$(link_of "${bw[$i]}" "${bw1[$i]}")"; done | sed 's/ $//')."
    echo "  Median of the $THREADS-thread ratios over rounds with a shared link: $(round_ratios $page shared n | med_or_none);"
    echo "  with a link per thread: $(round_ratios $page own n | med_or_none)."
}
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

Decode's "vs streaming read" is the median of the rounds' ratios (each round measures both,
interleaved); the other columns are medians of the rounds' figures.

| what | GB/s (wall) | vs streaming read | GB/s per thread cpu-second | vs streaming read |
| --- | --- | --- | --- | --- |
$(decode_rows 4k "4 KiB pages")
$(decode_rows 2m "2 MiB pages")
| PyTorch $TORCH_V SDPA enable_gqa, $THREADS threads (its tensors, 4 KiB pages)${TORCH_WRONG:+, $TORCH_WRONG} | $( [ -n "$TORCH" ] && printf '%.3f' "$TORCH" || echo "not timed") | $( [ -n "$TORCH" ] && ratio $TORCH "$(median ${R[4k,bw]})" || echo n/a) | | |

The streaming read (bench/bandwidth) sums a 1 GiB array; "2 MiB pages": the caches and that
array are allocated with madvise(MADV_HUGEPAGE) (\`flashattn bench --decode --huge-pages\`,
\`bandwidth ... huge\`), confirmed from /proc/self/smaps_rollup: $(median ${R[2m,huge]} | awk '{printf "%.0f", $1 / 1048576}') MiB of the decode process on
huge pages (median). flashattn / PyTorch ($THREADS threads, wall): $( [ -n "$TORCH" ] && awk "BEGIN {printf \"%.1fx\", $(median ${R[4k,dec]}) / $TORCH}" || echo n/a) on 4 KiB pages.
Rounds (wall GB/s):
$(decode_rounds 4k "4 KiB pages")
$(decode_rounds 2m "2 MiB pages")
A round's link is "shared" when its $THREADS-thread read is under 1.5x its one-thread read: the
threads share one memory link (a virtual machine's cores on one chiplet); "own" when each has
its own. A VM's placement can change between rounds. With a link per thread, the target (80%
of the same run's read) asks each thread for 80% of a whole link, which the 1-thread rows
measure.

Varlen prefill (8 sequences of 128, 256, 512, 1024, 1536, 2048, 3072, 4096 tokens, Hq=Hk=8, D=64,
f32, causal; both runs do the same useful flops):
packed (cu_seqlens): $vk; padded to 4096 with segment ids: $vd;
packed time per useful flop = $(echo "$vl" | json time_per_useful_flop_ratio) x the padded run's.
MD
)
echo "$section"
if [ $RECORD = 1 ]; then echo "$section" >> bench/RESULTS.md; fi
