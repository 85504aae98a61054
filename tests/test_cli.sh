#!/usr/bin/env bash
# The command line (docs/cli.md): the seed problem's plan (figures, speed, memory), run and
# grad on small random .npy files (shapes, counts equal to the plan's, values against the
# reference), and bad inputs (exit 2, one stderr line naming the problem, no output left).
# Usage: bash tests/test_cli.sh BUILD_DIR. Needs BUILD_DIR/flashattn and BUILD_DIR/tool_npy.
set -u
source "$(dirname "$0")/cli_harness.sh" test_cli "${1:-build}"
OUT=$W/out # every output goes here; it must be empty after each failing case
mkdir -p "$OUT"
crashes=0 calls=0

# fa ARGS...: runs the CLI, stdout in $W/so, stderr in $W/se, status in $rc.
fa() {
  "$FA" "$@" >"$W/so" 2>"$W/se"
  rc=$?
  calls=$((calls + 1))
  if [ $rc -ge 128 ]; then crashes=$((crashes + 1)); echo "CRASH (exit $rc): flashattn $*"; fi
}
# json_field TEXT SECTION KEY: the integer KEY inside "SECTION": {...} ("" for top level).
json_field() {
  local t=$1
  [ -n "$2" ] && t=$(printf '%s' "$t" | sed -n "s/.*\"$2\": {\([^}]*\)}.*/\1/p")
  printf '%s' "$t" | sed -n "s/.*\"$3\": \([0-9a-z]*\).*/\1/p"
}

# ---- inputs -----------------------------------------------------------------------------
# Random data from a fresh seed per run (printed); FA_TEST_SEED=<seed> reproduces a run.
# (S0, the run's seed, from cli_harness.sh: the file seeds below are S0 + 1 ... S0 + 9)
I=$W/in
mkdir -p "$I"
gen() { "$NPY" rand "$I/$1" "$2" "${@:3}" >/dev/null || { echo "tool_npy failed on $1"; exit 1; }; }
# B=2 Hq=4 Hk=2 Sq=33 Sk=40 D=16 Dv=8
gen q.npy '<f4' 2 4 33 16 --seed $((S0 + 1))
gen k.npy '<f4' 2 2 40 16 --seed $((S0 + 2))
gen v.npy '<f4' 2 2 40 8 --seed $((S0 + 3))
gen do.npy '<f4' 2 4 33 8 --seed $((S0 + 4))
gen q16.npy '<f2' 2 4 33 16 --seed $((S0 + 1))
gen k16.npy '<f2' 2 2 40 16 --seed $((S0 + 2))
gen v16.npy '<f2' 2 2 40 8 --seed $((S0 + 3))
gen bias.npy '<f4' 2 4 33 40 --seed $((S0 + 5))
gen bias1.npy '<f4' 1 4 33 40 --seed $((S0 + 6))
gen biash.npy '<f4' 2 1 33 40 --seed $((S0 + 7))
gen biasr.npy '<f4' 2 4 1 40 --seed $((S0 + 9))
gen slopes.npy '<f4' 4 --seed $((S0 + 8))
gen qseg.npy '<i4' 2 33
gen kvseg.npy '<i4' 2 40
SHAPE="--batch 2 --heads 4 --kv-heads 2 --seq-q 33 --seq-k 40 --head-dim 16 --v-head-dim 8"
QKV="--q $I/q.npy --k $I/k.npy --v $I/v.npy"
G="--dq $OUT/dq.npy --dk $OUT/dk.npy --dv $OUT/dv.npy"

# ---- (1) the seed problem's plan ---------------------------------------------------------
SEED="--batch 18 --heads 32 --seq 16384 --head-dim 256 --dtype bf16 --memory-budget 24G"
fa plan $SEED --json
j=$(cat "$W/so")
f=$(json_field "$j" forward flops) n=$(json_field "$j" forward naive_peak_bytes)
fits=$(json_field "$j" "" fits) nf=$(json_field "$j" "" naive_fits)
if [ $rc -ne 0 ]; then no "seed plan --json" "exit $rc: $(cat "$W/se")"
elif [ "$f" != 158329674399744 ]; then no "seed plan --json" "forward flops '$f'"
elif [ -z "$n" ] || [ "$n" -le 600000000000 ]; then no "seed plan --json" "naive_peak_bytes '$n'"
elif [ "$fits" != true ] || [ "$nf" != false ]; then no "seed plan --json" "fits '$fits' naive_fits '$nf'"
else ok "seed plan --json: flops $f, naive_peak_bytes $n, fits true, naive_fits false"; fi
for k in flops_useful transcendentals bytes_accessed min_bytes workspace_bytes peak_bytes block_q block_k; do
  for s in forward backward; do
    [ -n "$(json_field "$j" $s $k)" ] || no "seed plan --json" "$s.$k missing"
  done
done
# Planning allocates nothing of the problem's size: the seed's plan peaks within 2 MiB of a
# tiny problem's plan (the process's own: the binary, libc, OpenMP), and below 16 MiB outside
# AddressSanitizer (whose runtime alone is about that much: the bound is the baseline's there).
"$NPY" measure "$W/m" "$FA" plan --batch 1 --heads 1 --seq 16 --head-dim 16 --json >/dev/null 2>&1
read -r ms0 kb0 <"$W/m"
"$NPY" measure "$W/m" "$FA" plan $SEED --json >/dev/null 2>&1
read -r ms kb <"$W/m"
cap=16384
ldd "$FA" 2>/dev/null | grep -q libasan && cap=$(( ${kb0:-99999} + 2048 ))
if [ "${kb:-99999}" -lt $cap ] && [ "${kb:-99999}" -lt $(( ${kb0:-99999} + 2048 )) ] && awk "BEGIN{exit !($ms < 200)}"; then
  ok "seed plan answers in $ms ms with $kb KiB peak RSS (a tiny problem's plan: $kb0 KiB)"
else no "seed plan cost" "$ms ms, $kb KiB peak RSS (want < 200 ms, < $cap KiB and within 2048 KiB of a tiny plan's $kb0 KiB)"; fi
fa plan $SEED
if [ $rc -eq 0 ] && grep -q "158329674399744" "$W/so" && grep -qi "naive.*not fit" "$W/so"; then
  ok "seed plan (human-readable)"
else no "seed plan (human-readable)" "exit $rc"; fi
fa --help; [ $rc -eq 0 ] && grep -q plan "$W/so" && ok "--help" || no "--help" "exit $rc"
# docs/cli.md agrees with the tool: as many subcommands as --help lists (it said four, with
# calibrate the fifth), each in its synopsis; and it states what the tool does with a missing
# output directory (exit 2, bad input; it filed write errors under 1) and with empty problems
# (refused, exit 2, while the library takes them)
DOC=$(dirname "$0")/../docs/cli.md
cmds=$(sed -n 's/^  \([a-z][a-z]*\)  .*/\1/p' "$W/so")
n=$(printf '%s\n' $cmds | wc -l)
words=(zero one two three four five six seven eight nine)
said=$(sed -n '3s/.*\. \([A-Za-z]*\) subcommands;.*/\1/p' "$DOC" | tr 'A-Z' 'a-z')
missing=""
for c in $cmds; do grep -q "^    flashattn $c\b" "$DOC" || missing="$missing $c"; done
[ "$said" = "${words[$n]}" ] && [ -z "$missing" ] && ok "docs/cli.md: ${said} subcommands, as --help lists ($(echo $cmds))" ||
  no "docs/cli.md subcommands" "says '$said', --help lists $n ($(echo $cmds)); not in the synopsis:${missing:- none}"
grep -q "directory is missing or not writable is bad input (exit 2)" "$DOC" && ok "docs/cli.md: a missing output directory is exit 2" ||
  no "docs/cli.md exit codes" "says nothing of a missing output directory (the tool exits 2)"
grep -q "refuses empty problems" "$DOC" && ok "docs/cli.md: empty problems are refused (exit 2)" ||
  no "docs/cli.md empty problems" "does not say the command line refuses them"
for c in plan run grad bench; do
  fa $c --help; [ $rc -eq 0 ] && grep -q "usage: flashattn $c" "$W/so" && ok "$c --help" || no "$c --help" "exit $rc"
  fa help $c; [ $rc -eq 0 ] && grep -q "usage: flashattn $c" "$W/so" && ok "help $c" || no "help $c" "exit $rc"
done
# help that cannot be written fails as any other stdout (exit 1, said); help of no command is refused
for args in "--help" "run --help"; do
  "$FA" $args >/dev/full 2>"$W/se"; rc=$?
  [ $rc -eq 1 ] && grep -q "cannot write to stdout" "$W/se" && ok "$args > /dev/full: exit 1" ||
    no "$args > /dev/full" "exit $rc: $(cat "$W/se")"
done
fa --help bogus
[ $rc -eq 2 ] && grep -q "at most a command's name.*bogus" "$W/se" && ok "help of no command: exit 2 ($(cat "$W/se"))" ||
  no "help of no command" "exit $rc: $(cat "$W/se")"

# ---- (2) run and grad on small files -------------------------------------------------------
# On the CPU: the counts, block sizes and float32 inputs below are the CPU backend's (the
# auto backend would pick CUDA where a device is present); CUDA is checked after.
CPU="--backend cpu"
# run_case NAME "OPTIONS" EXACT: run --count vs plan --json with the same options.
run_case() {
  local name=$1 opts=$2 exact=$3
  rm -f "$OUT"/*
  fa run $QKV $CPU $opts --out "$OUT/o.npy" --lse "$OUT/lse.npy" --count
  local counted=$(cat "$W/so") err=$(cat "$W/se")
  if [ $rc -ne 0 ]; then no "run $name" "exit $rc: $err"; return; fi
  local oi=$("$NPY" info "$OUT/o.npy") li=$("$NPY" info "$OUT/lse.npy")
  if [ "$oi" != "<f4 2,4,33,8 finite" ]; then no "run $name" "o.npy is '$oi'"; return; fi
  case "$li" in "<f4 2,4,33 "*) ;; *) no "run $name" "lse.npy is '$li'"; return ;; esac
  fa plan $SHAPE $CPU $opts --json
  local pj=$(cat "$W/so")
  local pf=$(json_field "$pj" forward flops) pt=$(json_field "$pj" forward transcendentals)
  local cf=$(json_field "$counted" "" flops) ct=$(json_field "$counted" "" transcendentals)
  if [ -z "$cf" ] || [ -z "$pf" ]; then no "run $name" "no counts: '$counted' / plan '$(head -c 100 "$W/se")'"; return; fi
  if [ "$exact" = 1 ] && { [ "$cf" != "$pf" ] || [ "$ct" != "$pt" ]; }; then
    no "run $name" "counted $cf flops $ct transcendentals, plan says $pf and $pt"; return
  fi
  if [ "$exact" = 0 ] && { [ "$cf" -gt "$pf" ] || [ "$ct" -gt "$pt" ]; }; then
    no "run $name" "counted $cf/$ct above the plan's bound $pf/$pt"; return
  fi
  ok "run $name: o [2,4,33,8], counts $cf flops $ct transcendentals (plan $pf $pt)"
}
run_case "plain" "" 1
run_case "--causal" "--causal" 1
run_case "--window 7 3" "--window 7 3" 1
run_case "--causal --window 5 -1" "--causal --window 5 -1" 1
run_case "--softcap 20 --scale 0.3" "--softcap 20 --scale 0.3" 1
run_case "--bias [B,Hq,Sq,Sk]" "--bias $I/bias.npy" 1
run_case "--bias [1,Hq,Sq,Sk]" "--bias $I/bias1.npy --causal" 1
run_case "--bias [B,1,Sq,Sk]" "--bias $I/biash.npy" 1
run_case "--alibi" "--alibi $I/slopes.npy --causal" 1
run_case "segments" "--q-segments $I/qseg.npy --kv-segments $I/kvseg.npy" 0
run_case "--dtype bf16" "--dtype bf16" 1
run_case "--dtype f16 --threads 1" "--dtype f16 --threads 1" 1
run_case "--block-q 16 --block-k 8" "--block-q 16 --block-k 8" 1
run_case "--bias-scale 0.25" "--bias $I/bias1.npy --bias-scale 0.25 --causal" 1
run_case "--top-left --causal" "--top-left --causal" 1
run_case "--diag-offset -5 --window 4 2" "--diag-offset -5 --window 4 2" 1
# windows up to INT64_MAX: no overflow (it used to hide every key), the cost stays exact
run_case "--window -1 INT64_MAX" "--window -1 9223372036854775807" 1
run_case "--window INT64_MAX 0 --causal" "--window 9223372036854775807 0 --causal" 1

rm -f "$OUT"/*
fa run --q "$I/q16.npy" --k "$I/k16.npy" --v "$I/v16.npy" $CPU --out "$OUT/o.npy"
[ $rc -eq 0 ] && [ "$("$NPY" info "$OUT/o.npy")" = "<f4 2,4,33,8 finite" ] &&
  ok "run float16 files (dtype from the files)" || no "run float16 files" "exit $rc: $(cat "$W/se")"

for opts in "" "--causal" "--window 6 2" "--causal --top-left" "--diag-offset 3 --window 2 2" \
  "--window -1 9223372036854775807" "--window 9223372036854775803 3" \
  "--bias $I/bias.npy --bias-scale -0.5"; do
  rm -f "$OUT"/*
  fa run $QKV $CPU $opts --out "$OUT/o.npy"
  r=$("$NPY" refcheck "$I/q.npy" "$I/k.npy" "$I/v.npy" "$OUT/o.npy" $opts)
  [ $? -eq 0 ] && ok "run ${opts:-plain} matches the float64 reference" || no "run ${opts:-plain} vs reference" "$r"
done

for opts in "" "--causal --window 9 0"; do
  rm -f "$OUT"/*
  fa grad $QKV $CPU --do "$I/do.npy" $opts --dq "$OUT/dq.npy" --dk "$OUT/dk.npy" --dv "$OUT/dv.npy" \
    --out "$OUT/o.npy" --lse "$OUT/lse.npy" --count
  counted=$(cat "$W/so")
  if [ $rc -ne 0 ]; then no "grad ${opts:-plain}" "exit $rc: $(cat "$W/se")"; continue; fi
  s="$("$NPY" info "$OUT/dq.npy")|$("$NPY" info "$OUT/dk.npy")|$("$NPY" info "$OUT/dv.npy")"
  if [ "$s" != "<f4 2,4,33,16 finite|<f4 2,2,40,16 finite|<f4 2,2,40,8 finite" ]; then
    no "grad ${opts:-plain}" "gradient files: $s"; continue
  fi
  fa plan $SHAPE $CPU $opts --json
  pf=$(json_field "$(cat "$W/so")" backward flops) pt=$(json_field "$(cat "$W/so")" backward transcendentals)
  cf=$(json_field "$counted" "" flops) ct=$(json_field "$counted" "" transcendentals)
  if [ "$cf" != "$pf" ] || [ "$ct" != "$pt" ]; then
    no "grad ${opts:-plain} --count" "counted '$cf' '$ct', plan's backward '$pf' '$pt'"; continue
  fi
  r=$("$NPY" refcheck "$I/q.npy" "$I/k.npy" "$I/v.npy" "$OUT/o.npy" $opts --do "$I/do.npy" \
    --dq "$OUT/dq.npy" --dk "$OUT/dk.npy" --dv "$OUT/dv.npy")
  [ $? -eq 0 ] && ok "grad ${opts:-plain}: shapes, counts ($cf flops) and reference" ||
    no "grad ${opts:-plain} vs reference" "$r"
done

# dbias: [B,Hq,...], [1,Hq,...], [B,1,...] and [B,Hq,1,Sk] (one row for every query row; GQA:
# Hq=4 on Hk=2), against the reference; the backward's counts with dbias equal the plan's
for b in bias bias1 biash biasr; do
  rm -f "$OUT"/*
  opts="--bias $I/$b.npy --bias-scale 0.5 --causal"
  fa grad $QKV $CPU --do "$I/do.npy" $opts $G --dbias "$OUT/db.npy" --out "$OUT/o.npy" --count
  if [ $rc -ne 0 ]; then no "grad --dbias ($b)" "exit $rc: $(cat "$W/se")"; continue; fi
  counted=$(cat "$W/so")
  fa plan $SHAPE $CPU $opts --json
  pf=$(json_field "$(cat "$W/so")" backward flops) cf=$(json_field "$counted" "" flops)
  [ "$cf" = "$pf" ] || { no "grad --dbias ($b) --count" "counted '$cf', plan '$pf'"; continue; }
  r=$("$NPY" refcheck "$I/q.npy" "$I/k.npy" "$I/v.npy" "$OUT/o.npy" $opts --do "$I/do.npy" \
    --dq "$OUT/dq.npy" --dk "$OUT/dk.npy" --dv "$OUT/dv.npy" --dbias "$OUT/db.npy")
  [ $? -eq 0 ] && ok "grad --dbias ($b: $("$NPY" info "$OUT/db.npy")) matches the reference" ||
    no "grad --dbias ($b) vs reference" "$r"
done

rm -f "$OUT"/*
fa bench --batch 1 --heads 2 --seq 64 --head-dim 32 --causal --iters 2 --json $CPU
last=$(tail -n 1 "$W/so")
case "$last" in
  '{"forward": {"seconds": '*'"backward": {"seconds": '*'"peak_rss_bytes": '*) [ $rc -eq 0 ] && ok "bench --json" || no "bench" "exit $rc" ;;
  *) no "bench --json" "exit $rc, last line '$last' $(head -c 200 "$W/se")" ;;
esac
# bench's useful flops are the plan's, under the same key (with Dv != D the backward's was
# 2.5x the forward's, not the plan's 2(3D + 2Dv) a pair)
VD="--batch 1 --heads 2 --seq 64 --head-dim 32 --v-head-dim 8 --causal $CPU"
fa bench $VD --iters 1 --json
jb=$(tail -n 1 "$W/so")
fa plan $VD --json
jp=$(cat "$W/so")
for s in forward backward; do
  a=$(json_field "$jb" $s flops_useful) b=$(json_field "$jp" $s flops_useful)
  [ -n "$a" ] && [ "$a" = "$b" ] && ok "bench's $s flops_useful is the plan's ($a, Dv != D)" ||
    no "bench's $s flops_useful" "bench '$a', plan '$b'"
done

# --backend cuda: where a device is present, run and grad agree with the CPU (bf16); else
# they fail cleanly (exit 1, one line, no output), never as bad input.
fa run $QKV --backend cuda --dtype bf16 --out "$OUT/o.npy"
if [ $rc -eq 0 ] && [ -f "$OUT/o.npy" ]; then
  "$FA" run $QKV --backend cpu --dtype bf16 --out "$OUT/o_cpu.npy" 2>/dev/null
  r=$("$NPY" compare "$OUT/o.npy" "$OUT/o_cpu.npy" 0.01) && ok "run --backend cuda agrees with cpu: $r" ||
    no "run --backend cuda vs cpu" "$r"
  for opts in "--causal" "--window 6 2 --bias $I/bias1.npy --alibi $I/slopes.npy --softcap 5"; do
    rm -f "$OUT"/*
    fa grad $QKV --do "$I/do.npy" --dtype bf16 $opts --backend cuda $G --out "$OUT/o.npy" --count
    if [ $rc -ne 0 ]; then no "grad --backend cuda $opts" "exit $rc: $(cat "$W/se")"; continue; fi
    "$FA" grad $QKV --do "$I/do.npy" --dtype bf16 $opts --backend cpu --out "$OUT/o_c.npy" \
      --dq "$OUT/dq_c.npy" --dk "$OUT/dk_c.npy" --dv "$OUT/dv_c.npy" 2>/dev/null
    r=""
    for t in o dq dk dv; do
      r="$r $t: $("$NPY" compare "$OUT/$t.npy" "$OUT/${t}_c.npy" 0.02)" || { no "grad --backend cuda $opts" "$r"; continue 2; }
    done
    ok "grad --backend cuda $opts agrees with cpu:$r"
  done
  rm -f "$OUT"/*
  fa bench --batch 1 --heads 4 --seq 512 --head-dim 128 --dtype bf16 --backend cuda --iters 2 --json
  [ $rc -eq 0 ] && ok "bench --backend cuda: $(tail -n 1 "$W/so")" || no "bench --backend cuda" "exit $rc: $(cat "$W/se")"
elif [ $rc -eq 1 ] && [ "$(wc -l <"$W/se")" -eq 1 ] && [ -z "$(ls -A "$OUT")" ]; then
  ok "run --backend cuda without a usable device: exit 1, $(cat "$W/se")"
else no "run --backend cuda" "exit $rc: $(cat "$W/se")"; fi
fa plan $SHAPE --backend cuda --json
[ $rc -eq 0 ] && grep -q '"backend": "cuda"' "$W/so" && ok "plan --backend cuda needs no device" ||
  no "plan --backend cuda" "exit $rc: $(cat "$W/se")"

# ---- (3) bad inputs ---------------------------------------------------------------------
# Malformed and mismatched files.
gen k_d12.npy '<f4' 2 2 40 12
gen v_s39.npy '<f4' 2 2 39 8
gen v_b3.npy '<f4' 3 2 40 8
gen q_h3.npy '<f4' 2 3 33 16
gen q_3d.npy '<f4' 2 4 33
gen q_zero.npy '<f4' 2 0 33 16
gen q_f8.npy '<f8' 2 4 33 16
gen slopes3.npy '<f4' 3
gen bias_bad.npy '<f4' 2 4 33 39
gen bias_3d.npy '<f4' 4 33 40
gen qseg_f4.npy '<f4' 2 33
gen qseg_bad.npy '<i4' 2 34
gen do_bad.npy '<f4' 2 4 33 16
head -c 200 "$I/q.npy" >"$I/trunc.npy"
R="$NPY raw"
$R "$I/lying.npy" --header "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4, 33, 16), }" --data 64
$R "$I/magic.npy" --magic "GIF89a"
$R "$I/fortran.npy" --header "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }"
$R "$I/big_endian.npy" --header "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 2), }"
$R "$I/version4.npy" --major 4
$R "$I/hlen.npy" --hlen 60000
$R "$I/noshape.npy" --header "{'descr': '<f4', 'fortran_order': False, }"
$R "$I/trailing.npy" --data 20
$R "$I/garbage.npy" --header "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), } junk"
$R "$I/v2.npy" --major 2 --header "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }" --data 15
echo "not a file" >"$W/keep.txt"
printf 'precious' >"$OUT/existing.npy" # must survive failing runs untouched

# bad NAME PATTERN ARGS...: exit 2, one stderr line matching PATTERN (grep -E, case-insensitive),
# nothing new in $OUT and existing.npy unchanged.
bad() {
  local name=$1 pat=$2
  shift 2
  fa "$@"
  local lines=$(wc -l <"$W/se") msg=$(head -c 300 "$W/se")
  local extra=$(ls -A "$OUT" | grep -v '^existing.npy$')
  if [ $rc -ne 2 ]; then no "$name" "exit $rc, want 2 ($msg)"
  elif [ "$lines" -ne 1 ]; then no "$name" "$lines stderr lines: $msg"
  elif [ -s "$W/so" ]; then no "$name" "printed on stdout: $(head -c 200 "$W/so")"
  elif ! grep -qiE -- "$pat" "$W/se"; then no "$name" "message does not match /$pat/: $msg"
  elif [ -n "$extra" ]; then no "$name" "left output: $extra"; rm -f "$OUT"/*.tmp-* "$OUT"/o*.npy "$OUT"/d*.npy
  elif [ "$(cat "$OUT/existing.npy")" != precious ]; then no "$name" "clobbered an existing file"
  else ok "$name -> $msg"; fi
}
O="--out $OUT/o.npy --lse $OUT/lse.npy"
bad "q/k head dim mismatch" "head dim 12" run --q "$I/q.npy" --k "$I/k_d12.npy" --v "$I/v.npy" $O
bad "k/v seq mismatch" "seq 39" run --q "$I/q.npy" --k "$I/k.npy" --v "$I/v_s39.npy" $O
bad "v/k batch mismatch" "batch 3" run --q "$I/q.npy" --k "$I/k.npy" --v "$I/v_b3.npy" $O
bad "Hq not a multiple of Hk (files)" "multiple" run --q "$I/q_h3.npy" --k "$I/k.npy" --v "$I/v.npy" $O
bad "q not 4-D" "4-D" run --q "$I/q_3d.npy" --k "$I/k.npy" --v "$I/v.npy" $O
bad "zero-size dimension in a file" "zero" run --q "$I/q_zero.npy" --k "$I/k.npy" --v "$I/v.npy" $O
bad "--batch 0" "batch.*below 1" plan --batch 0 --heads 4 --seq 8 --head-dim 16
bad "negative --heads" "heads.*below 1" plan --batch 1 --heads -3 --seq 8 --head-dim 16
bad "--head-dim not a number" "head-dim.*not an integer" plan --batch 1 --heads 4 --seq 8 --head-dim 16x
bad "Hq not a multiple of Hk (flags)" "multiple" plan --batch 1 --heads 6 --kv-heads 4 --seq 8 --head-dim 16
bad "sizes overflow int64" "overflow" plan --batch 1000000000 --heads 1000000000 --seq 1000000000 --head-dim 65536
bad "--seq beyond int64" "seq.*range" plan --batch 1 --heads 1 --seq 99999999999999999999 --head-dim 8
bad "--window -2" "window.*-2.*below -1" run $QKV --window -2 0 $O
bad "--window right -5" "window.*below -1" plan $SHAPE --window 3 -5
bad "--window missing a value" "window.*needs 2" plan $SHAPE --window 3
bad "--threads 0" "threads.*below 1" run $QKV --threads 0 $O
bad "--scale nan" "scale.*finite" run $QKV --scale nan $O
bad "--scale 1e40" "scale.*finite" plan $SHAPE --scale 1e40
bad "--softcap inf" "softcap.*finite" run $QKV --softcap inf $O
bad "--softcap negative" "softcap.*negative" plan $SHAPE --softcap -1
bad "--softcap 1e-50 (rounds to 0: off)" "rounds to 0 in float32" plan $SHAPE --softcap 1e-50
bad "--softcap -1e-50 (negative, though its float is -0)" "softcap: -1e-50 is negative" plan $SHAPE --softcap -1e-50
bad "--softcap 1e-39 (subnormal)" "softcap must be 0 .off. or within" plan $SHAPE --softcap 1e-39
bad "slopes of the wrong length" "alibi.*\(3,\)" run $QKV --alibi "$I/slopes3.npy" $O
bad "bias shape wrong" "bias.*\(2, 4, 33, 39\)" run $QKV --bias "$I/bias_bad.npy" $O
bad "bias 3-D" "bias.*\(4, 33, 40\)" run $QKV --bias "$I/bias_3d.npy" $O
bad "bias shape wrong (plan reads headers)" "bias.*\(2, 4, 33, 39\)" plan $SHAPE --bias "$I/bias_bad.npy"
bad "bias missing (plan)" "nope.npy.*cannot open" plan $SHAPE --bias "$I/nope.npy"
bad "segments wrong dtype" "q-segments.*'<f4'.*int32" run $QKV --q-segments "$I/qseg_f4.npy" --kv-segments "$I/kvseg.npy" $O
bad "segments wrong shape" "q-segments.*\(2, 34\)" run $QKV --q-segments "$I/qseg_bad.npy" --kv-segments "$I/kvseg.npy" $O
bad "q-segments without kv-segments" "kv-segments" run $QKV --q-segments "$I/qseg.npy" $O
bad "truncated .npy" "trunc.npy.*truncated" run --q "$I/trunc.npy" --k "$I/k.npy" --v "$I/v.npy" $O
bad "lying header (shape bigger than data)" "lying.npy.*truncated" run --q "$I/lying.npy" --k "$I/k.npy" --v "$I/v.npy" $O
bad "data beyond the shape" "trailing.npy.*beyond" run --q "$I/trailing.npy" --k "$I/k.npy" --v "$I/v.npy" $O
bad "bad magic" "magic.npy.*magic" run --q "$I/magic.npy" --k "$I/k.npy" --v "$I/v.npy" $O
bad "fortran_order True" "fortran_order" run --q "$I/fortran.npy" --k "$I/k.npy" --v "$I/v.npy" $O
bad "descr <f8" "'<f8'" run --q "$I/q_f8.npy" --k "$I/k.npy" --v "$I/v.npy" $O
bad "descr >f4" "'>f4'" run --q "$I/big_endian.npy" --k "$I/k.npy" --v "$I/v.npy" $O
bad "format version 4.0" "version 4" run --q "$I/version4.npy" --k "$I/k.npy" --v "$I/v.npy" $O
bad "header length past the end" "header length" run --q "$I/hlen.npy" --k "$I/k.npy" --v "$I/v.npy" $O
bad "header without shape" "shape" run --q "$I/noshape.npy" --k "$I/k.npy" --v "$I/v.npy" $O
bad "text after the header dict" "malformed" run --q "$I/garbage.npy" --k "$I/k.npy" --v "$I/v.npy" $O
bad "version 2.0, truncated" "v2.npy.*truncated" run --q "$I/v2.npy" --k "$I/k.npy" --v "$I/v.npy" $O
bad "missing file" "missing.npy.*cannot open" run --q "$I/missing.npy" --k "$I/k.npy" --v "$I/v.npy" $O
bad "a directory as input" "not a regular file" run --q "$I" --k "$I/k.npy" --v "$I/v.npy" $O
# a FIFO with no writer: opening it blocked until one came (the CLI hung); refused at once
mkfifo "$W/fifo.npy"
timeout 20 "$FA" run --q "$W/fifo.npy" --k "$I/k.npy" --v "$I/v.npy" $O >"$W/so" 2>"$W/se"
rc=$?
[ $rc -eq 2 ] && grep -q "not a regular file" "$W/se" && ok "a FIFO as input: exit 2 at once" ||
  no "a FIFO as input" "exit $rc (124: hung), $(head -c 200 "$W/se")"
timeout 20 "$FA" plan --batch 1 --heads 2 --seq 64 --head-dim 16 --alibi "$W/fifo.npy" >"$W/so" 2>"$W/se"
rc=$?
[ $rc -eq 2 ] && grep -q "not a regular file" "$W/se" && ok "a FIFO as an option file: exit 2 at once" ||
  no "a FIFO as an option file" "exit $rc (124: hung), $(head -c 200 "$W/se")"
bad "a text file as input" "magic" run --q "$W/keep.txt" --k "$I/k.npy" --v "$I/v.npy" $O
bad "unknown flag" "unknown option '--frobnicate'" run $QKV --frobnicate $O
bad "flag of another command" "unknown option '--memory-budget' \(an option of plan;" run $QKV --memory-budget 1G $O
bad "missing flag value" "--out needs 1 value" run $QKV --out
bad "flag given twice" "given twice" plan $SHAPE --causal --causal
bad "unknown subcommand" "unknown command 'frob'" frob --batch 1
bad "no subcommand" "missing command"
bad "--bias-scale nan" "bias-scale.*finite" run $QKV --bias "$I/bias.npy" --bias-scale nan $O
bad "--bias-scale 1e39" "bias-scale.*finite" plan $SHAPE --bias "$I/bias.npy" --bias-scale 1e39
bad "--bias-scale not a number" "bias-scale.*not a number" plan $SHAPE --bias "$I/bias.npy" --bias-scale x
bad "--bias-scale without --bias" "bias-scale needs --bias" run $QKV --bias-scale 2 $O
bad "--dbias without --bias" "dbias needs --bias" grad $QKV --do "$I/do.npy" $G --dbias "$OUT/db.npy"
bad "--dsink without --sinks" "dsink needs --sinks" grad $QKV --do "$I/do.npy" $G --dsink "$OUT/ds.npy"
bad "--dbias on run" "unknown option '--dbias'" run $QKV --bias "$I/bias.npy" --dbias "$OUT/db.npy" $O
bad "--dbias same file as --dq" "same file" grad $QKV --do "$I/do.npy" $G --bias "$I/bias.npy" --dbias "$OUT/dq.npy"
bad "--diag-offset not an integer" "diag-offset.*not an integer" plan $SHAPE --diag-offset 1.5
bad "--diag-offset too large" "--diag-offset: 99999999999 is above 2147483647" run $QKV --diag-offset 99999999999 --causal $O
bad "--diag-offset one past the bound" "--diag-offset: 2147483648 is above 2147483647" run $QKV --diag-offset 2147483648 --causal $O
bad "--diag-offset with nothing to place" "--diag-offset places --causal" run $QKV --diag-offset 3 $O
bad "--top-left with nothing to place" "--top-left places --causal" run $QKV --top-left $O
# plan describes every option that changes the problem (it left out the diagonal's alignment,
# the bias scale and sinks, whose costs it did count)
fa plan $SHAPE --causal --top-left --json
[ $rc -eq 0 ] && grep -q '"diag_offset": 0, "bias_scale": null, "sinks": false' "$W/so" &&
  ok "plan --json: the diagonal offset" || no "plan --json --top-left" "exit $rc: $(cat "$W/so" "$W/se")"
fa plan $SHAPE --causal --diag-offset 3
[ $rc -eq 0 ] && grep -q '^problem .*, causal, diagonal offset 3' "$W/so" &&
  ok "plan: the diagonal offset" || no "plan --diag-offset" "exit $rc: $(head -1 "$W/so")"
bad "help names the word it does not take" "not 'bogus'" --help bogus run
bad "bench --decode --pass backward" "--pass backward does not combine with --decode" bench --decode --batch 1 \
  --heads 2 --seq 64 --head-dim 16 --pass backward
bad "bench --varlen --pass backward" "--pass backward does not combine with --varlen" bench --varlen 8,16 \
  --heads 2 --head-dim 16 --pass backward
fa bench $SHAPE --pass forward --iters 1 --threads 1 --json
[ $rc -eq 0 ] && grep -q '"forward": {.*}, "backward": null, "peak_rss_bytes"' "$W/so" &&
  ok "bench --pass forward --json: the backward is null, as plan writes a pass it has not" ||
  no "bench --pass forward --json" "exit $rc: $(cat "$W/so" "$W/se")"
bad "--diag-offset too small" "diag-offset.*below" plan $SHAPE --diag-offset -99999999999
bad "--top-left with --diag-offset" "not both" plan $SHAPE --top-left --diag-offset 2
bad "bad --dtype" "dtype.*f64" plan $SHAPE --dtype f64
bad "bad --memory-budget suffix" "memory-budget.*24X" plan $SHAPE --memory-budget 24X
bad "negative --memory-budget" "memory-budget" plan $SHAPE --memory-budget -5G
bad "bad --backend" "backend.*tpu" plan $SHAPE --backend tpu
bad "--iters 0" "iters.*below 1" bench --batch 1 --heads 1 --seq 8 --head-dim 8 --iters 0
bad "plan missing --head-dim" "missing --head-dim" plan --batch 1 --heads 1 --seq 8
bad "--seq with --seq-q" "not both" plan --batch 1 --heads 1 --seq 8 --seq-q 8 --head-dim 8
bad "run missing --out" "missing --out" run $QKV
bad "grad missing --dk" "missing --dk" grad $QKV --do "$I/do.npy" --dq "$OUT/dq.npy" --dv "$OUT/dv.npy"
bad "grad do shape wrong" "do.*head dim 16" grad $QKV --do "$I/do_bad.npy" --dq "$OUT/dq.npy" --dk "$OUT/dk.npy" --dv "$OUT/dv.npy"
bad "two outputs, one file" "same file" grad $QKV --do "$I/do.npy" --dq "$OUT/d.npy" --dk "$OUT/d.npy" --dv "$OUT/dv.npy"
# one file, two spellings (or a hard link to an existing one): the string check let these
# through, and the later commit replaced the earlier one (exit 0, o lost)
bad "--out and --lse one file, spelled differently" "--out and --lse name the same file" run $QKV --out "$OUT/o.npy" --lse "$OUT/./o.npy"
bad "--dq and --dv one file, spelled differently" "--dq and --dv name the same file" grad $QKV --do "$I/do.npy" \
  --dq "$OUT/d.npy" --dk "$OUT/dk.npy" --dv "$OUT/../$(basename "$OUT")/d.npy"
ln "$OUT/existing.npy" "$W/existing_link.npy"
bad "--out and --lse, an existing file and its hard link" "same file" run $QKV --out "$W/existing_link.npy" --lse "$OUT/existing.npy"
rm -f "$W/existing_link.npy" "$OUT"/d.npy "$OUT"/dk.npy "$OUT"/o.npy # what a failing case above would leave
printf 'precious' >"$OUT/existing.npy"
bad "output directory missing" "nodir/o.npy.*cannot create" run $QKV --out "$OUT/nodir/o.npy"
# names as long as the directory takes: 250 bytes leaves no room for the temporary's suffix,
# which failed the run after computing (exit 1); 256 is refused before anything is read
long=$(printf 'o%.0s' $(seq 246)).npy
fa run $QKV --out "$OUT/$long"
[ $rc -eq 0 ] && [ -s "$OUT/$long" ] && [ -z "$(ls -A "$OUT" | grep -v "^existing.npy$\|^$long$")" ] &&
  ok "an output name of 250 bytes" || no "an output name of 250 bytes" "exit $rc: $(cat "$W/se")"
rm -f "$OUT/$long"
bad "an output name of 256 bytes" "file name too long \(256 bytes" run $QKV --out "$OUT/oo$long.npy"
bad "q and k dtypes differ" "dtype" run --q "$I/q16.npy" --k "$I/k.npy" --v "$I/v.npy" $O
bad "shape flag disagrees with the files" "--batch 3 does not match" run $QKV --batch 3 $O
bad "bad do.npy with every output named (grad)" "trunc.npy.*truncated" grad $QKV --do "$I/trunc.npy" $G --out "$OUT/o.npy"

# ---- (3b) findings of a black-box run (issue 13, item 7), each a regression case ----------
# --threads: OpenMP crashed at 65536 and printed its own message at 50000; bounded to 1..1024.
for c in plan run grad bench; do
  case $c in
    plan|bench) args="$SHAPE" ;;
    run) args="$QKV $O" ;;
    grad) args="$QKV --do $I/do.npy $G" ;;
  esac
  for t in 65536 50000 1025; do
    bad "$c --threads $t" "^flashattn: --threads: $t is above the maximum of 1024" $c $args --threads $t
  done
done
OMP_NUM_THREADS=5000 bad "OMP_NUM_THREADS=5000 (default above the maximum)" "OMP_NUM_THREADS.*1024" plan $SHAPE
rm -f "$OUT"/o.npy
fa run $QKV $CPU --threads 1024 --out "$OUT/o.npy"
[ $rc -eq 0 ] && [ -f "$OUT/o.npy" ] && ok "run --threads 1024 (the maximum) works" || no "run --threads 1024" "exit $rc: $(cat "$W/se")"
rm -f "$OUT"/o.npy
# --memory-budget: whole bytes up to 2^63-1 exactly, units up to E; no hex, no exponents; a
# fraction only where it gives whole bytes, exactly (2^63-1 as a fraction of an E: 60 digits)
M63="7.999999999999999999132638262011596452794037759304046630859375E"
for b in 9223372036854775807:9223372036854775807 7.5E:8646911284551352320 24G:25769803776 1.5T:1649267441664 12B:12 \
  512MiB:536870912 1.50K:1536 0.0009765625K:1 $M63:9223372036854775807; do
  fa plan $SHAPE --memory-budget "${b%%:*}" --json
  got=$(json_field "$(cat "$W/so")" "" memory_budget)
  [ $rc -eq 0 ] && [ "$got" = "${b##*:}" ] && ok "--memory-budget ${b%%:*} = $got bytes" ||
    no "--memory-budget ${b%%:*}" "exit $rc, memory_budget '$got', want ${b##*:}: $(cat "$W/se")"
done
for b in 0x10 1e9 9223372036854775808 8E " 1" 1G5 ""; do
  bad "--memory-budget '$b'" "memory-budget: '$b' is not a size" plan $SHAPE --memory-budget "$b"
done
# fractions of a byte; 7.99999999999999999E went through a double, rounded up to 2^63 and was
# accepted as -2^63 bytes (signed overflow)
for b in 1.5 0.5B 1.3K 7.99999999999999999E 1.00000000000000000000000000000000000000001K; do
  bad "--memory-budget '$b'" "memory-budget: '$b' is not a whole number of bytes" plan $SHAPE --memory-budget "$b"
done
# FA_ISA naming an ISA this CPU lacks is bad input like an unknown name: exit 2, the message
# names it and what this CPU has.
have=$("$BUILD/tool_isas" 2>/dev/null)
FA_ISA=bogus bad "FA_ISA=bogus" "FA_ISA=bogus is not a known ISA.*usable here: .*scalar" run $QKV $CPU $O
for isa in amx avx512bf16 avx512 avx2; do
  case " $have " in *" $isa "*) continue ;; esac
  FA_ISA=$isa bad "FA_ISA=$isa on a CPU without it" "FA_ISA=$isa: this CPU.*does not support $isa; it has: .*scalar" run $QKV $CPU $O
  FA_ISA=$isa bad "FA_ISA=$isa (plan)" "FA_ISA=$isa" plan $SHAPE --backend cpu
done
# FA_BWD_SCHEDULE other than fused or two-pass is bad input too (docs/environment.md)
FA_BWD_SCHEDULE=fussed bad "FA_BWD_SCHEDULE=fussed" "^flashattn: environment: FA_BWD_SCHEDULE must be 'fused' or 'two-pass'.*'fussed'" run $QKV $CPU $O
# .npy descr: exactly what numpy writes here ('<f4', '<f2', '<i4'); a NUL inside the string
# is malformed, '=f4' and '|f4' (which numpy never writes) are refused by name.
nul_npy() { # a [2, 2] file whose descr is '<f4' followed by a NUL byte
  local h1="{'descr': '<f4" h2="', 'fortran_order': False, 'shape': (2, 2), }"
  local n=$((${#h1} + 1 + ${#h2}))
  { printf '\x93NUMPY\x01\x00'; printf "\\x$(printf %02x $n)\\x00"; printf '%s' "$h1"; printf '\0'
    printf '%s' "$h2"; head -c 16 /dev/zero; } >"$1"
}
nul_npy "$I/descr_nul.npy"
$R "$I/descr_eq.npy" --header "{'descr': '=f4', 'fortran_order': False, 'shape': (2, 2), }"
$R "$I/descr_bar.npy" --header "{'descr': '|f4', 'fortran_order': False, 'shape': (2, 2), }"
bad "descr '<f4\\0'" "descr_nul.npy: malformed .npy header \(bad 'descr'\)" run --q "$I/descr_nul.npy" --k "$I/k.npy" --v "$I/v.npy" $O
bad "descr '=f4'" "descr_eq.npy: dtype '=f4' is not supported" run --q "$I/descr_eq.npy" --k "$I/k.npy" --v "$I/v.npy" $O
bad "descr '|f4'" "descr_bar.npy: dtype '\|f4' is not supported" run --q "$I/descr_bar.npy" --k "$I/k.npy" --v "$I/v.npy" $O

# bench --pass forward allocates what the forward needs and no more: its peak RSS, less the
# process's own (a tiny bench), stays within the plan's forward peak; a both-pass bench
# within the backward's (plus the forward's workspace, which malloc may keep), give or take 2 MiB. 8 MiB per [1, 8, 2048, 128] f32 tensor: one
# extra would show.
# (Not under AddressSanitizer: its shadow memory and the quarantine of freed blocks count in RSS.)
MID="--batch 1 --heads 8 --seq 2048 --head-dim 128 --dtype f32 $CPU --threads 2"
if ldd "$FA" 2>/dev/null | grep -q libasan; then
  echo "skip bench peak RSS checks: this flashattn is built with AddressSanitizer"
else
  fa bench --batch 1 --heads 1 --seq 16 --head-dim 8 $CPU --threads 2 --iters 1 --json
  base=$(json_field "$(tail -n 1 "$W/so")" "" peak_rss_bytes)
  fa plan $MID --json
  pj=$(cat "$W/so")
  for passes in forward both; do
    fa bench $MID --iters 1 --pass $passes --json
    rss=$(json_field "$(tail -n 1 "$W/so")" "" peak_rss_bytes)
    sec=$([ $passes = forward ] && echo forward || echo backward)
    peak=$(json_field "$pj" $sec peak_bytes)
    # both passes in one process: the allocator may keep the forward's freed workspace
    [ $passes = both ] && peak=$((peak + $(json_field "$pj" forward workspace_bytes)))
    if [ $rc -ne 0 ] || [ -z "$rss" ] || [ -z "$base" ] || [ -z "$peak" ]; then
      no "bench --pass $passes peak RSS" "exit $rc, rss '$rss' base '$base' peak '$peak': $(tail -n 1 "$W/se")"
    elif [ $((rss - base)) -le $((peak + 2097152)) ]; then
      ok "bench --pass $passes: peak RSS $rss - process $base = $((rss - base)) <= plan's $sec peak $peak + 2 MiB"
    else no "bench --pass $passes peak RSS" "$rss - $base = $((rss - base)) bytes above the plan's $sec peak $peak + 2 MiB"; fi
  done
fi

# ---- (3c) outputs appear only when complete (issue 18, item 7) -----------------------------
# A grad of a few seconds killed with SIGKILL once it runs (the outputs were opened before
# any data was read): nothing may remain in its output folder, neither an output nor a
# PATH.tmp-XXXXXX temporary. Then a small run into the same folder: exactly its two files,
# with the right values.
K=$W/killed
mkdir -p "$K"
# (S = 16384: about 6 s on 2 AMX Xeon cores; S = 8192 took 1.4 s there and ended before the kill)
for f in q k v do; do gen big_$f.npy '<f4' 1 8 16384 64 --seed $((S0 + 9)); done
"$FA" grad --q "$I/big_q.npy" --k "$I/big_k.npy" --v "$I/big_v.npy" --do "$I/big_do.npy" $CPU --threads 2 \
  --out "$K/o.npy" --lse "$K/lse.npy" --dq "$K/dq.npy" --dk "$K/dk.npy" --dv "$K/dv.npy" >/dev/null 2>&1 &
pid=$!
sleep 1.5
if ! kill -0 $pid 2>/dev/null; then
  wait $pid
  no "SIGKILL during grad" "the run ended (exit $?) before the kill: make the shape larger"
else
  kill -9 $pid
  wait $pid 2>/dev/null
  left=$(ls -A "$K")
  [ -z "$left" ] && ok "SIGKILL during grad leaves no output and no temporary" \
    || no "SIGKILL during grad" "left in the output folder: $(echo $left)"
fi
rm -f "$I"/big_*.npy
fa run $QKV --causal --out "$K/o.npy" --lse "$K/lse.npy"
r=$("$NPY" refcheck "$I/q.npy" "$I/k.npy" "$I/v.npy" "$K/o.npy" --causal 2>&1)
rr=$?
left=$(ls -A "$K" | tr '\n' ' ')
if [ $rc -ne 0 ]; then no "run after a killed run" "exit $rc: $(head -c 300 "$W/se")"
elif [ "$left" != "lse.npy o.npy " ]; then no "run after a killed run" "folder holds '$left', want 'lse.npy o.npy '"
elif [ $rr -ne 0 ]; then no "run after a killed run" "values: $r"
else ok "run after a killed run: exactly o.npy and lse.npy, o matches the reference ($r)"; fi

# A failure while outputs are moved into place leaves every target untouched: --lse on a
# file system with one free inode could not name its temporary after --out had already been
# renamed over the old file. Needs a tmpfs mount (root); said so where there is none.
mkdir -p "$W/ino" "$W/keep"
if mount -t tmpfs -o size=1m,nr_inodes=2 tmpfs "$W/ino" 2>/dev/null; then
  echo OLD >"$W/keep/o.npy"
  fa run $QKV --out "$W/keep/o.npy" --lse "$W/ino/lse.npy"
  [ $rc -eq 1 ] && [ "$(cat "$W/keep/o.npy")" = OLD ] && [ "$(ls -A "$W/keep")" = o.npy ] &&
    ok "an output that cannot be moved into place leaves the others untouched" ||
    no "outputs moved into place one by one" "exit $rc, o.npy now $(head -c 6 "$W/keep/o.npy" | od -c | head -1)"
  umount "$W/ino"
else
  echo "skip an output that cannot be moved into place (no tmpfs mount here)"
fi

# ---- (3d) numbers, stdout, the rates cache (audit s11) ------------------------------------
# Numbers are decimal, whole, without spaces of any kind (docs/cli.md, "Numbers"): a leading
# tab or newline passed (strtoll and strtod skip them; only ' ' was refused), --seed $'\t-5'
# became 2^64-5 (strtoull negates), and --scale took hex floats while the integers refused hex.
bad "--threads '\\t2'" "threads: '.2' is not an integer" run $QKV $O --threads $'\t2'
bad "--threads '\\n2'" "threads: '.2' is not an integer" plan $SHAPE --threads $'\n2'
bad "--threads '2 '" "threads: '2 ' is not an integer" plan $SHAPE --threads '2 '
bad "--batch '\\v1'" "batch: '.1' is not an integer" plan --batch $'\v1' --heads 4 --seq 8 --head-dim 16
bad "--window '\\t1' 0" "window \(left\): '.1' is not an integer" run $QKV $O --window $'\t1' 0
bad "--scale '\\n0.5'" "scale: '.0.5' is not a number" run $QKV $O --scale $'\n0.5'
bad "--scale '\\t0.5'" "scale: '.0.5' is not a number" plan $SHAPE --scale $'\t0.5'
bad "--softcap '\\f30'" "softcap: '.30' is not a number" plan $SHAPE --softcap $'\f30'
bad "--dropout '\\r0.1'" "dropout: '.0.1' is not a number" plan $SHAPE --dropout $'\r0.1'
for x in 0x10 0x1p-3 -0x1p-3 0X.8p1 1e 1.2.3 . e5 "0.5 " "+" "-" "1e+"; do
  bad "--scale '$x' (decimal only)" "scale: '${x//+/\\+}' is not a number" plan $SHAPE --scale "$x"
done
for s in $'\t-5' $'\t5' $'\n5' ' 5' '-5' '5 ' '0x 5' $'0x\t5'; do
  bad "--seed '$(printf '%q' "$s")'" "seed: '.*' is not an integer in 0 .. 2\^64-1" plan $SHAPE --dropout 0.1 --seed "$s"
done
bad "--mask-chunk '\\t4'" "mask-chunk: '.4' is not an integer" plan $SHAPE --mask-chunk $'\t4'
bad "--prefix-len '\\t4' (no such number; a file name)" "prefix-len .4: .*(no such|cannot)" plan $SHAPE --prefix-len $'\t4'
bad "bench --varlen ' 8,16'" "varlen: ' 8,16' is not a comma-separated list" bench --varlen ' 8,16' --heads 2 --head-dim 16 --iters 1
bad "bench --varlen '8, 16'" "varlen: ' 16' is not a comma-separated list" bench --varlen '8, 16' --heads 2 --head-dim 16 --iters 1
bad "bench --varlen '8,+16'" "varlen: '\+16' is not a comma-separated list" bench --varlen '8,+16' --heads 2 --head-dim 16 --iters 1
bad "bench --varlen '8,16,'" "varlen: '16,' ends with a comma" bench --varlen '8,16,' --heads 2 --head-dim 16 --iters 1
# the decimal forms still taken: exponents, a leading or trailing point, a sign
for x in 1e-3 .5 5. +0.25 -2 1E+1; do
  fa plan $SHAPE --scale "$x" --json
  [ $rc -eq 0 ] && ok "--scale '$x' is a number" || no "--scale '$x'" "exit $rc: $(cat "$W/se")"
done
fa plan $SHAPE --window -1 +3 --json
[ $rc -eq 0 ] && ok "--window -1 +3: signed decimal integers" || no "--window -1 +3" "exit $rc: $(cat "$W/se")"

# ---- (4) crashes --------------------------------------------------------------------------
[ $crashes -eq 0 ] && ok "no crash (exit >= 128) in $calls calls" || no "crash check" "$crashes of $calls calls crashed"

echo "$pass passed, $fail failed (seed $S0)"
[ $fail -eq 0 ]
