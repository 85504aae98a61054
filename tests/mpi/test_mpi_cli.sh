#!/usr/bin/env bash
# The command line under mpirun (docs/mpi.md): run and grad with --seq-parallel ring,
# ring --zigzag and ulysses on P = 2 and 3 equal the single-process outputs (f32 bound) and
# repeat bit for bit, also causal --top-left with Sq != Sk; --count prints one JSON line per
# rank; --progress prints rank 0's progress; --dsink is written; bad input exits 2 on every
# rank with nothing written (shapes not divisible, Ulysses with Hk % P != 0, --bias,
# --zigzag alone, any inference shape: cu_seqlens, a cache with new rows or a block table);
# ranks given different problems or output paths, or one rank failing to read its input, end every rank
# with exit 2 within seconds; bench --seq-parallel --json reports per-rank times.
# Exits 77 (skipped) where this build has no MPI. Usage: bash tests/mpi/test_mpi_cli.sh BUILD
set -u
BUILD=${1:-build}
FA=$(cd "$BUILD" && pwd)/flashattn
NPY=$(cd "$BUILD" && pwd)/tool_npy
if [ ! -x "$BUILD/mpi_check" ] || ! command -v mpirun >/dev/null; then
  echo "skipped: no MPI in this build"
  exit 77
fi
export OMP_NUM_THREADS=1
# sanitized builds: Open MPI's own leaks are suppressed; the slow unwinder reaches the MPI
# library frames even under its unloaded plugins, so that the suppressions match
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$(cd "$(dirname "$0")" && pwd)/lsan.supp:print_suppressions=0"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W" || exit 1
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
no() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
mpi() { timeout 60 mpirun --oversubscribe --allow-run-as-root "$@" >so 2>se; rc=$?; }

gen() { "$NPY" rand "$1" "$2" "${@:3}" >/dev/null || { echo "tool_npy failed"; exit 1; }; }
# Random data from a fresh seed per run (printed); FA_TEST_SEED=<seed> reproduces a run.
S0=${FA_TEST_SEED:-$(($(date +%s%N) % 1000000000))}
case $S0 in *[!0-9]*|'') echo "FA_TEST_SEED must be a decimal number, got '$S0'"; echo "0 passed, 1 failed"; exit 1 ;; esac
S0=$((10#${S0: -9})) # its last 9 digits: the file seeds below are S0 + n
echo "$(basename "$0" .sh): seed $S0 (FA_TEST_SEED=$S0 reproduces)"
# B=2 Hq=4 Hk=2 S=48 (divisible by 2P for P = 2, 3) D=16 Dv=8
gen q.npy '<f4' 2 4 48 16 --seed $((S0 + 11))
gen k.npy '<f4' 2 2 48 16 --seed $((S0 + 12))
gen v.npy '<f4' 2 2 48 8 --seed $((S0 + 13))
gen do.npy '<f4' 2 4 48 8 --seed $((S0 + 14))
gen q50.npy '<f4' 2 4 50 16 --seed $((S0 + 15))
gen k72.npy '<f4' 2 2 72 16 --seed $((S0 + 17))
gen v72.npy '<f4' 2 2 72 8 --seed $((S0 + 18))
IN="--q q.npy --k k.npy --v v.npy"

# cases: P, method, mask (a few of each; tests/mpi/mpi_check.c covers the library in full)
cases=("2|ring|--causal" "2|ring --zigzag|--causal" "2|ulysses|--causal" "3|ring --zigzag|--causal"
       "3|ring|" "2|ulysses|" "2|ring|--window 9 3" "3|ring --zigzag|--window 9 3")
last_mask=none
for c in "${cases[@]}"; do
  IFS='|' read -r np sp mask <<<"$c"
  name="P=$np --seq-parallel $sp $mask"
  if [ "$mask" != "$last_mask" ]; then
    "$FA" grad $IN --do do.npy $mask --out o1.npy --lse l1.npy --dq dq1.npy --dk dk1.npy --dv dv1.npy ||
      { no "single process $mask" "exit $?"; continue; }
    last_mask=$mask
  fi
  out="--out o2.npy --lse l2.npy --dq dq2.npy --dk dk2.npy --dv dv2.npy"
  mpi -np $np "$FA" grad $IN --do do.npy $mask $out --seq-parallel $sp --count
  if [ $rc != 0 ]; then no "$name" "exit $rc: $(head -c 300 se)"; continue; fi
  bad=""
  for t in o l dq dk dv; do
    "$NPY" compare ${t}2.npy ${t}1.npy 1e-5 >cmp || bad="$bad $t($(cat cmp))"
  done
  [ -z "$bad" ] && ok "$name: outputs and gradients equal one process's" || no "$name" "$bad"
  lines=$(grep -c '^{"rank": [0-9]*, "flops": [0-9]*, "transcendentals": [0-9]*, "bytes_sent": [0-9]*, "bytes_received": [0-9]*}$' so)
  ranks=$(sed -n 's/^{"rank": \([0-9]*\),.*/\1/p' so | sort -n | tr '\n' ' ')
  want=$(seq 0 $((np - 1)) | tr '\n' ' ')
  [ "$lines" = "$np" ] && [ "$ranks" = "$want" ] && ok "$name: --count one JSON line per rank" ||
    no "$name --count" "$(cat so)"
done
# the same bits again (the last case)
for t in o dq dk; do cp ${t}2.npy ${t}2a.npy; done
mpi -np $np "$FA" grad $IN --do do.npy $mask $out --seq-parallel $sp
same=1
for t in o dq dk; do cmp -s ${t}2.npy ${t}2a.npy || same=0; done
[ $rc = 0 ] && [ $same = 1 ] && ok "$name: same bits on a second run" || no "$name rerun" "exit $rc, same=$same"

# Sq != Sk with the causal mask aligned top-left (--top-left), zigzag over 3 ranks
"$FA" run --q q.npy --k k72.npy --v v72.npy --causal --top-left --out o1.npy --lse l1.npy >/dev/null
mpi -np 3 "$FA" run --q q.npy --k k72.npy --v v72.npy --causal --top-left --out o2.npy --lse l2.npy \
  --seq-parallel ring --zigzag
if [ $rc = 0 ] && "$NPY" compare o2.npy o1.npy 1e-5 >cmp && "$NPY" compare l2.npy l1.npy 1e-5 >>cmp; then
  ok "P=3 ring --zigzag --causal --top-left, Sq=48 Sk=72: equals one process"
else no "top-left" "exit $rc: $(cat cmp) $(head -c 300 se)"; fi

# --progress under --seq-parallel: rank 0 alone prints its progress (ring steps; Ulysses, the
# local call's tiles), forward and backward, ending at 100%; nothing on stdout
for sp in "ring|ring steps" "ulysses|tiles"; do
  IFS='|' read -r m unit <<<"$sp"
  mpi -np 2 "$FA" grad $IN --do do.npy --causal --out o2.npy --dq dq2.npy --dk dk2.npy --dv dv2.npy --seq-parallel $m --progress
  if [ $rc = 0 ] && grep -q "^flashattn: forward 100% (.* $unit)$" se && grep -q "^flashattn: backward 100% (.* $unit)$" se &&
     [ "$(grep -c '100%' se)" = 2 ] && [ ! -s so ]; then
    ok "P=2 $m --progress: rank 0's progress lines"
  else no "$m --progress" "exit $rc: $(head -c 400 se)"; fi
done

# progress by itself over 500 GFLOP in all: a causal forward of 5.5e11 flops in bf16 (about a
# second) as a contiguous ring, whose rank 0 holds a quarter of the work (its share times P,
# what was once compared, is under 5e11: no progress), without --progress
gen qbig.npy '<f4' 1 1 65536 64 --seed $((S0 + 40))
timeout 300 mpirun --oversubscribe --allow-run-as-root -np 2 "$FA" run --q qbig.npy --k qbig.npy --v qbig.npy \
  --out obig.npy --causal --dtype bf16 --seq-parallel ring >so 2>se # seconds, longer under the sanitizers
rc=$?
if [ $rc = 0 ] && grep -q "^flashattn: forward 100% (.* ring steps)$" se; then
  ok "P=2 ring, 5.5e11 flops in all: progress by itself"
else no "ring over 500 GFLOP" "exit $rc: $(head -c 300 se)"; fi
rm -f qbig.npy obig.npy

# sinks' gradient: every rank holds the whole sum, rank 0 writes it (--dsink was refused)
gen sinks.npy '<f4' 4 --seed $((S0 + 21))
"$FA" grad $IN --do do.npy --sinks sinks.npy --causal --out o1.npy --dq dq1.npy --dk dk1.npy --dv dv1.npy \
  --dsink ds1.npy >/dev/null
for sp in "ring --zigzag" ulysses; do
  rm -f ds2.npy
  mpi -np 2 "$FA" grad $IN --do do.npy --sinks sinks.npy --causal --out o2.npy --dq dq2.npy --dk dk2.npy --dv dv2.npy \
    --dsink ds2.npy --seq-parallel $sp
  if [ $rc = 0 ] && "$NPY" compare ds2.npy ds1.npy 1e-5 >cmp && "$NPY" compare dq2.npy dq1.npy 1e-5 >>cmp; then
    ok "P=2 $sp --sinks --dsink: dsink and dq equal one process's"
  else no "$sp --dsink" "exit $rc: $(cat cmp 2>/dev/null) $(head -c 300 se)"; fi
done

# bad input: every rank exits 2, one line each, nothing written
rm -f o9.npy
expect2() {
  local what=$1 say=$2
  shift 2
  mpi "$@"
  local lines
  lines=$(grep -c '^flashattn: ' se)
  if [ $rc = 2 ] && [ ! -e o9.npy ] && grep -q "$say" se; then ok "$what: exit 2 ($lines stderr lines)"; else
    no "$what" "exit $rc, $(head -c 300 se)"; fi
}
expect2 "Sq not divisible by 2P (zigzag)" "divisible" -np 2 "$FA" run --q q50.npy --k k.npy --v v.npy \
  --out o9.npy --seq-parallel ring --zigzag
expect2 "ulysses with Hk=2 on 3 ranks" "divisible" -np 3 "$FA" run $IN --out o9.npy --seq-parallel ulysses
expect2 "--out and --lse one file, spelled differently" "\-\-out and \-\-lse name the same file" -np 2 "$FA" run $IN \
  --out o9.npy --lse ./o9.npy --seq-parallel ring
gen bias.npy '<f4' 2 4 48 48 --seed $((S0 + 16))
expect2 "--bias" "not supported" -np 2 "$FA" run $IN --bias bias.npy --out o9.npy --seq-parallel ring
# inference shapes with --seq-parallel: refused by the backend table's supports (exit 2,
# naming both features), under mpirun and alone; they once ran as dense attention, exit 0
gen lens.npy '<i4' 2
gen cu.npy '<i4' 3
gen table.npy '<i4' 2 3
gen kn.npy '<f4' 2 1 2 16 --seed $((S0 + 19))
gen vn.npy '<f4' 2 1 2 8 --seed $((S0 + 20))
for sp in ring ulysses; do
  expect2 "$sp with --cache-seqlens --k-new --v-new --update-cache" "sequence parallel.*kv-cache decoding" -np 2 \
    "$FA" run $IN --cache-seqlens lens.npy --k-new kn.npy --v-new vn.npy --update-cache --out o9.npy --seq-parallel $sp
  expect2 "$sp with --block-table" "sequence parallel.*kv-cache decoding" -np 2 \
    "$FA" run $IN --cache-seqlens lens.npy --block-table table.npy --out o9.npy --seq-parallel $sp
  expect2 "$sp with --cu-seqlens-*" "sequence parallel.*packed variable-length" -np 2 \
    "$FA" run $IN --cu-seqlens-q cu.npy --cu-seqlens-k cu.npy --out o9.npy --seq-parallel $sp
done
mpi -np 2 "$FA" bench --batch 1 --heads 4 --seq 64 --head-dim 32 --seq-parallel ring --decode --iters 1
[ $rc = 2 ] && grep -q "sequence parallel.*kv-cache decoding" se && ok "bench --seq-parallel --decode: exit 2" ||
  no "bench --seq-parallel --decode" "exit $rc, $(head -c 300 se)"
for extra in "--cache-seqlens lens.npy --k-new kn.npy --v-new vn.npy --update-cache" "--cu-seqlens-q cu.npy --cu-seqlens-k cu.npy"; do
  "$FA" run $IN $extra --out o9.npy --seq-parallel ring >so 2>se
  [ $? = 2 ] && [ ! -e o9.npy ] && grep -q "sequence parallel.*does not combine" se && ok "alone: ring with $extra: exit 2" ||
    no "alone: ring with $extra" "$(cat se)"
done
"$FA" run $IN --out o9.npy --zigzag >so 2>se
[ $? = 2 ] && [ ! -e o9.npy ] && grep -q "needs --seq-parallel" se && ok "--zigzag alone: exit 2" || no "--zigzag alone" "$(cat se)"
t0=$(date +%s)
expect2 "ranks given different problems" "disagree" -np 1 "$FA" run $IN --causal --out o9.npy --seq-parallel ring : \
  -np 1 "$FA" run $IN --out o9.npy --seq-parallel ring
expect2 "one rank cannot read its input" "cannot open" -np 1 "$FA" run $IN --out o9.npy --seq-parallel ring : \
  -np 1 "$FA" run --q missing.npy --k k.npy --v v.npy --out o9.npy --seq-parallel ring
# ranks started with other output flags or commands: the phases would differ (--lse on one
# rank, or grad beside run, hung every rank); refused on every rank, nothing written
expect2 "--lse on one rank only" "different commands or flags" -np 1 "$FA" run $IN --out o9.npy --seq-parallel ring : \
  -np 1 "$FA" run $IN --out o9.npy --lse l9.npy --seq-parallel ring
expect2 "grad beside run" "different commands or flags" -np 1 "$FA" run $IN --out o9.npy --seq-parallel ring : \
  -np 1 "$FA" grad $IN --do do.npy --dq dq9.npy --dk dk9.npy --dv dv9.npy --seq-parallel ring
[ ! -e l9.npy ] && [ ! -e dq9.npy ] && ok "different flags: nothing written" || no "different flags" "an output was written"
# ranks given different output paths: only rank 0 writes, so another rank's path was neither
# used nor refused (exit 0, its file never written); refused on every rank, naming the flag
rm -f o8.npy dq8.npy
expect2 "--out differs between ranks" "\-\-out .*different \-\-out paths" -np 1 "$FA" run $IN --out o9.npy --seq-parallel ring : \
  -np 1 "$FA" run $IN --out o8.npy --seq-parallel ring
expect2 "--out on rank 1 in a missing folder" "different \-\-out paths" -np 1 "$FA" run $IN --out o9.npy --seq-parallel ring : \
  -np 1 "$FA" run $IN --out nodir/o9.npy --seq-parallel ring
expect2 "--dq differs between ranks (grad)" "different \-\-dq paths" -np 1 "$FA" grad $IN --do do.npy --dq dq9.npy \
  --dk dk9.npy --dv dv9.npy --seq-parallel ring : -np 1 "$FA" grad $IN --do do.npy --dq dq8.npy --dk dk9.npy --dv dv9.npy \
  --seq-parallel ring
expect2 "--lse spelled ./l9.npy on one rank" "different \-\-lse paths" -np 1 "$FA" run $IN --out o9.npy --lse l9.npy \
  --seq-parallel ring : -np 1 "$FA" run $IN --out o9.npy --lse ./l9.npy --seq-parallel ring
[ "$(grep -c '^flashattn: ' se)" = 2 ] && ok "different paths: every rank says so" || no "different paths" "$(cat se)"
[ ! -e o8.npy ] && [ ! -e dq8.npy ] && [ ! -e dq9.npy ] && [ ! -e l9.npy ] && ok "different paths: nothing written" ||
  no "different paths" "an output was written"
# a plan that fails on one rank only (bench): every rank exits 2 (the others waited for it)
expect2 "bench with a diag offset past the blocks' range" "diag_offset" -np 2 "$FA" bench --batch 1 --heads 2 --seq 64 \
  --head-dim 16 --causal --diag-offset 2147483640 --seq-parallel ring --iters 1
dt=$(($(date +%s) - t0))
[ $dt -lt 60 ] && ok "failing ranks end the job in ${dt} s" || no "failing ranks" "took ${dt} s"

# bench's flags it does not take: refused on every rank (they timed the dense problem, exit 0);
# a mask by the library's plan, naming both features; one rank alone with a mask: every rank
B2="bench --batch 1 --heads 2 --seq 64 --head-dim 16 --iters 1 --seq-parallel ring"
for f in "--mask-chunk 16" "--prefix-len 8" "--varlen 20,44" "--layers 2" "--huge-pages" "--page-size 16" "--cache-len 64"; do
  case $f in --mask*|--prefix*) say="block-sparse mask.*sequence parallel" ;; --varlen*) say="varlen.*seq-parallel" ;;
    *) say="applies to --decode" ;; esac
  expect2 "bench --seq-parallel $f" "$say" -np 2 "$FA" $B2 $f
done
expect2 "bench --seq-parallel, a mask on one rank" "block-sparse mask\|another rank refused" -np 1 "$FA" $B2 \
  --mask-chunk 16 : -np 1 "$FA" $B2
# bench: per-rank compute / comm-wait / merge
mpi -np 2 "$FA" bench --batch 1 --heads 4 --seq 256 --head-dim 32 --causal --seq-parallel ring --zigzag --iters 2 --json
last=$(tail -n 1 so)
if [ $rc = 0 ] && printf '%s' "$last" | grep -q '"per_rank": \[{"rank": 0, "seconds": [0-9.e-]*, "compute_s": [0-9.e-]*, "comm_wait_s": [0-9.e-]*, "merge_s"'; then
  ok "bench --seq-parallel --json: per-rank split"; else no "bench" "exit $rc: $last $(head -c 300 se)"; fi

echo "$pass passed, $fail failed"
[ $fail = 0 ]
