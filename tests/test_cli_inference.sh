#!/usr/bin/env bash
# The command line of the inference shapes (docs/cli.md, "Inference shapes"): packed varlen runs, kv-cache
# decoding (appending with --update-cache, paged caches), their plans and counts, the
# benchmarks' forms, and bad input (exit 2, one stderr line naming the argument, no output
# file, caches untouched).
# Usage: bash tests/test_cli_inference.sh BUILD_DIR (needs flashattn, tool_npy, tool_inference).
set -u
BUILD=${1:-build}
FA=$(cd "$BUILD" && pwd)/flashattn
NPY=$(cd "$BUILD" && pwd)/tool_npy
TI=$(cd "$BUILD" && pwd)/tool_inference
for x in "$FA" "$NPY" "$TI"; do
  [ -x "$x" ] || { echo "missing $x (build first)"; echo "0 passed, 1 failed"; exit 1; }
done
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
OUT=$W/out
I=$W/in
mkdir -p "$OUT" "$I"
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
no() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
fa() { "$FA" "$@" >"$W/so" 2>"$W/se"; rc=$?; if [ $rc -ge 128 ]; then echo "CRASH (exit $rc): flashattn $*"; fi; }
gen() { "$NPY" rand "$I/$1" "$2" "${@:3}" >/dev/null || { echo "tool_npy failed on $1"; exit 1; }; }
ints() { "$TI" ints "$I/$1" "${@:2}" || { echo "tool_inference failed on $1"; exit 1; }; }
json_int() { sed -n "s/.*\"$1\": \([0-9]*\).*/\1/p" "$W/so" | head -1; }
# expect_bad NAME NEEDLE ARGS...: exit 2, one stderr line containing NEEDLE, $OUT empty
expect_bad() {
  local name=$1 needle=$2
  shift 2
  fa "$@"
  local lines
  lines=$(wc -l <"$W/se")
  if [ $rc -ne 2 ]; then no "$name" "exit $rc, want 2 ($(head -c 300 "$W/se"))"
  elif [ "$lines" -ne 1 ]; then no "$name" "$lines stderr lines"
  elif ! grep -q -- "$needle" "$W/se"; then no "$name" "message lacks '$needle': $(cat "$W/se")"
  elif [ -n "$(ls -A "$OUT")" ]; then no "$name" "left output: $(ls "$OUT")"
  else ok "$name"; fi
  rm -f "$OUT"/*
}

# Random data from a fresh seed per run (printed); FA_TEST_SEED=<seed> reproduces a run.
S0=${FA_TEST_SEED:-$(($(date +%s%N) % 1000000000))}
case $S0 in *[!0-9]*|'') echo "FA_TEST_SEED must be a decimal number, got '$S0'"; echo "0 passed, 1 failed"; exit 1 ;; esac
[ ${#S0} -le 9 ] || S0=${S0: -9}; S0=$((10#$S0)) # its last 9 digits: the file seeds below are S0 + n
echo "$(basename "$0" .sh): seed $S0 (FA_TEST_SEED=$S0 reproduces)"
# ---- packed varlen --------------------------------------------------------------------
# 4 sequences: (Sq, Sk) = (5, 10), (0, 1), (15, 0), (17, 34); Hq=4 Hk=2 D=16 Dv=8
gen q.npy '<f4' 37 4 16 --seed $((S0 + 1))
gen k.npy '<f4' 45 2 16 --seed $((S0 + 2))
gen v.npy '<f4' 45 2 8 --seed $((S0 + 3))
ints cq.npy 5 -- 0 5 5 20 37
ints ck.npy 5 -- 0 10 11 11 45
VL="--q $I/q.npy --k $I/k.npy --v $I/v.npy --cu-seqlens-q $I/cq.npy --cu-seqlens-k $I/ck.npy"
for c in "" "--causal"; do
  fa run $VL $c --out "$OUT/o.npy" --lse "$OUT/lse.npy" --count
  if [ $rc -ne 0 ]; then no "varlen run $c" "exit $rc: $(cat "$W/se")"; else
    flops=$(json_int flops) trans=$(json_int transcendentals)
    if [ "$("$NPY" info "$OUT/o.npy")" != "<f4 37,4,8 finite" ]; then no "varlen o shape $c" "$("$NPY" info "$OUT/o.npy")"
    elif ! "$TI" varlen "$I/q.npy" "$I/k.npy" "$I/v.npy" "$I/cq.npy" "$I/ck.npy" "$OUT/o.npy" "$OUT/lse.npy" $c >"$W/ref"; then
      no "varlen run $c vs reference" "$(cat "$W/ref")"
    else ok "varlen run $c: o [37,4,8] and lse [4,37] match the reference"; fi
    fa plan --heads 4 --kv-heads 2 --head-dim 16 --v-head-dim 8 --cu-seqlens-q "$I/cq.npy" --cu-seqlens-k "$I/ck.npy" $c --json
    pf=$(sed -n 's/.*"forward": {"flops": \([0-9]*\), [^}]*"transcendentals": \([0-9]*\),.*/\1 \2/p' "$W/so")
    if [ $rc -eq 0 ] && [ "$pf" = "$flops $trans" ]; then ok "varlen $c: counts == plan ($pf)"
    else no "varlen $c counts" "run counted '$flops $trans', plan says '$pf' (exit $rc: $(cat "$W/se"))"; fi
  fi
  rm -f "$OUT"/*
done
ints bad_dec.npy 5 -- 0 5 3 20 37
ints bad_past.npy 5 -- 0 5 5 20 40
ints bad_start.npy 5 -- 1 5 5 20 37
ints short.npy 4 -- 0 5 20 37
expect_bad "varlen: decreasing cu_seqlens_q" cu_seqlens_q run --q "$I/q.npy" --k "$I/k.npy" --v "$I/v.npy" \
  --cu-seqlens-q "$I/bad_dec.npy" --cu-seqlens-k "$I/ck.npy" --out "$OUT/o.npy"
expect_bad "varlen: cu_seqlens_q past the tensor" "reaches past" run --q "$I/q.npy" --k "$I/k.npy" --v "$I/v.npy" \
  --cu-seqlens-q "$I/bad_past.npy" --cu-seqlens-k "$I/ck.npy" --out "$OUT/o.npy"
expect_bad "varlen: cu_seqlens_k not starting at 0" "cu_seqlens_k\[0\]" run --q "$I/q.npy" --k "$I/k.npy" --v "$I/v.npy" \
  --cu-seqlens-q "$I/cq.npy" --cu-seqlens-k "$I/bad_start.npy" --out "$OUT/o.npy"
expect_bad "varlen: cu_seqlens of different lengths" "entries" run --q "$I/q.npy" --k "$I/k.npy" --v "$I/v.npy" \
  --cu-seqlens-q "$I/cq.npy" --cu-seqlens-k "$I/short.npy" --out "$OUT/o.npy"
expect_bad "varlen: cu_seqlens-q alone" "go together" run --q "$I/q.npy" --k "$I/k.npy" --v "$I/v.npy" \
  --cu-seqlens-q "$I/cq.npy" --out "$OUT/o.npy"
# ---- packed varlen grad (the backward) ----------------------------------------------------
# the same 4 sequences (an empty query side and an empty key side among them); dq, dk, dv
# packed like q, k, v against the float64 reference, --count against the plan's backward
# (tiles of 8 x 8 where masks apply, so that they skip tiles)
gen do.npy '<f4' 37 4 8 --seed $((S0 + 4))
gen do16.npy '<f2' 37 4 8 --seed $((S0 + 5))
GR="--do $I/do.npy --dq $OUT/dq.npy --dk $OUT/dk.npy --dv $OUT/dv.npy"
for c in "" "--causal" "--window 3 2" "--causal --window 6 0"; do
  bs=${c:+--block-q 8 --block-k 8}
  fa grad $VL $c $bs $GR --out "$OUT/o.npy" --lse "$OUT/lse.npy" --count
  if [ $rc -ne 0 ]; then no "varlen grad ${c:-plain}" "exit $rc: $(cat "$W/se")"; rm -f "$OUT"/*; continue; fi
  flops=$(json_int flops) trans=$(json_int transcendentals)
  sh="$("$NPY" info "$OUT/dq.npy")|$("$NPY" info "$OUT/dk.npy")|$("$NPY" info "$OUT/dv.npy")"
  if [ "$sh" != "<f4 37,4,16 finite|<f4 45,2,16 finite|<f4 45,2,8 finite" ]; then no "varlen grad ${c:-plain} shapes" "$sh"
  elif [ "$("$NPY" info "$OUT/o.npy")" != "<f4 37,4,8 finite" ] || [ -z "$("$NPY" info "$OUT/lse.npy" | grep '^<f4 4,37 ')" ]; then
    no "varlen grad ${c:-plain} --out/--lse" "$("$NPY" info "$OUT/o.npy"), $("$NPY" info "$OUT/lse.npy")"
  elif ! "$TI" varlen-grad "$I/q.npy" "$I/k.npy" "$I/v.npy" "$I/do.npy" "$I/cq.npy" "$I/ck.npy" \
       "$OUT/dq.npy" "$OUT/dk.npy" "$OUT/dv.npy" $c >"$W/ref"; then no "varlen grad ${c:-plain} vs reference" "$(cat "$W/ref")"
  else ok "varlen grad ${c:-plain}: dq [37,4,16], dk [45,2,16], dv [45,2,8] match the reference"; fi
  fa plan --heads 4 --kv-heads 2 --head-dim 16 --v-head-dim 8 --cu-seqlens-q "$I/cq.npy" --cu-seqlens-k "$I/ck.npy" $c $bs --json
  pb=$(sed -n 's/.*"backward": {"flops": \([0-9]*\), [^}]*"transcendentals": \([0-9]*\),.*/\1 \2/p' "$W/so")
  if [ $rc -eq 0 ] && [ -n "$flops" ] && [ "$pb" = "$flops $trans" ]; then ok "varlen grad ${c:-plain}: counts == plan's backward ($pb)"
  else no "varlen grad ${c:-plain} counts" "grad counted '$flops $trans', plan's backward '$pb' (exit $rc: $(cat "$W/se"))"; fi
  rm -f "$OUT"/*
done
# sinks' gradient from a packed grad (once not written, with exit 0): float32 [Hq]
gen sk.npy '<f4' 4 --seed $((S0 + 7))
fa grad $VL --causal $GR --sinks "$I/sk.npy" --dsink "$OUT/ds.npy"
if [ $rc -eq 0 ] && [ "$("$NPY" info "$OUT/ds.npy" 2>&1)" = "<f4 4 finite" ]; then ok "varlen grad --dsink: float32 [4] written"
else no "varlen grad --dsink" "exit $rc: $(cat "$W/se"); $("$NPY" info "$OUT/ds.npy" 2>&1)"; fi
rm -f "$OUT"/*
fa plan --heads 4 --kv-heads 2 --head-dim 16 --v-head-dim 8 --cu-seqlens-q "$I/cq.npy" --cu-seqlens-k "$I/ck.npy" --causal
if [ $rc -eq 0 ] && grep -q "flash backward" "$W/so" && grep -q "^  flops " "$W/so"; then ok "varlen plan (human): both passes' cost"
else no "varlen plan (human)" "exit $rc: $(cat "$W/se")"; fi
# plan's --seq-q / --seq-k / --seq beside the prefix sums: the rows the sums reach (37, 45) or,
# with --lengths-per-call, capacities at least that; others were ignored (the sums' plan, exit 0)
PV="--heads 4 --kv-heads 2 --head-dim 16 --v-head-dim 8 --cu-seqlens-q $I/cq.npy --cu-seqlens-k $I/ck.npy"
expect_bad "varlen plan --seq-q 36" "seq-q 36 does not match the 37 rows" plan $PV --seq-q 36
expect_bad "varlen plan --seq-k 3" "seq-k 3 does not match the 45 rows" plan $PV --seq-k 3
expect_bad "varlen plan --seq 7" "seq 7 does not match the 37 rows" plan $PV --seq 7
expect_bad "varlen plan --lengths-per-call --seq-q 36" "seq-q 36 is below the 37 rows" plan $PV --lengths-per-call --seq-q 36
for c in "--seq-q 37 --seq-k 45:37:45" "--lengths-per-call --seq 64:64:64" "--lengths-per-call --seq-k 50:37:50"; do
  fa plan $PV ${c%%:*} --json
  got="$(sed -n 's/.*"seq_q": \([0-9]*\), "seq_k": \([0-9]*\).*/\1:\2/p' "$W/so" | head -1)"
  [ $rc -eq 0 ] && [ "$got" = "${c#*:}" ] && ok "varlen plan ${c%%:*}: seq_q:seq_k $got" ||
    no "varlen plan ${c%%:*}" "exit $rc, seq_q:seq_k '$got', want ${c#*:}: $(cat "$W/se")"
done
gen cq_f4.npy '<f4' 5 --seed $((S0 + 6))
ints cq_2d.npy 1 5 -- 0 5 5 20 37
VG="--q $I/q.npy --k $I/k.npy --v $I/v.npy $GR"
expect_bad "varlen grad: decreasing cu_seqlens_q" "non-decreasing" grad $VG \
  --cu-seqlens-q "$I/bad_dec.npy" --cu-seqlens-k "$I/ck.npy" --out "$OUT/o.npy"
expect_bad "varlen grad: cu_seqlens_q past the tensor" "cu_seqlens_q.*reaches past" grad $VG \
  --cu-seqlens-q "$I/bad_past.npy" --cu-seqlens-k "$I/ck.npy"
expect_bad "varlen grad: cu_seqlens_k not starting at 0" "cu_seqlens_k\[0\]" grad $VG \
  --cu-seqlens-q "$I/cq.npy" --cu-seqlens-k "$I/bad_start.npy"
expect_bad "varlen grad: cu_seqlens_k of the wrong length" "entries" grad $VG \
  --cu-seqlens-q "$I/cq.npy" --cu-seqlens-k "$I/short.npy" --lse "$OUT/lse.npy"
expect_bad "varlen grad: float32 cu_seqlens_q" "cu-seqlens-q" grad $VG --cu-seqlens-q "$I/cq_f4.npy" --cu-seqlens-k "$I/ck.npy"
expect_bad "varlen grad: 2-D cu_seqlens_q" "cu-seqlens-q.*1-D" grad $VG --cu-seqlens-q "$I/cq_2d.npy" --cu-seqlens-k "$I/ck.npy"
expect_bad "varlen grad: --cu-seqlens-k alone" "go together" grad $VG --cu-seqlens-k "$I/ck.npy"
expect_bad "varlen grad: do of o's shape" "\-\-do .*: head dim Dv 16 does not match --v's 8\$" grad \
  --q "$I/q.npy" --k "$I/k.npy" --v "$I/v.npy" --do "$I/q.npy" --dq "$OUT/dq.npy" --dk "$OUT/dk.npy" --dv "$OUT/dv.npy" \
  --cu-seqlens-q "$I/cq.npy" --cu-seqlens-k "$I/ck.npy"
expect_bad "varlen grad: do of another dtype" "share a dtype" grad --q "$I/q.npy" --k "$I/k.npy" --v "$I/v.npy" \
  --do "$I/do16.npy" --dq "$OUT/dq.npy" --dk "$OUT/dk.npy" --dv "$OUT/dv.npy" --cu-seqlens-q "$I/cq.npy" --cu-seqlens-k "$I/ck.npy"
expect_bad "varlen grad: missing --dv" "missing --dv" grad --q "$I/q.npy" --k "$I/k.npy" --v "$I/v.npy" \
  --do "$I/do.npy" --dq "$OUT/dq.npy" --dk "$OUT/dk.npy" --cu-seqlens-q "$I/cq.npy" --cu-seqlens-k "$I/ck.npy"
expect_bad "varlen grad: dq and dk one file" "same file" grad --q "$I/q.npy" --k "$I/k.npy" --v "$I/v.npy" \
  --do "$I/do.npy" --dq "$OUT/d.npy" --dk "$OUT/d.npy" --dv "$OUT/dv.npy" --cu-seqlens-q "$I/cq.npy" --cu-seqlens-k "$I/ck.npy"
expect_bad "varlen grad: --cache-seqlens is run's" "cache-seqlens" grad $VG --cache-seqlens "$I/ck.npy"
expect_bad "varlen grad: --heads disagrees with the files" "\-\-heads 3 does not match the input files' 4" grad $VG \
  --cu-seqlens-q "$I/cq.npy" --cu-seqlens-k "$I/ck.npy" --heads 3
expect_bad "varlen run: --head-dim disagrees with the files" "\-\-head-dim 8 does not match" run $VL --head-dim 8 \
  --out "$OUT/o.npy"

# a packed run shows progress on stderr as a dense one does (a long one by itself, over 500
# GFLOP; any with --progress, which keeps this test brief under the sanitizers), through each
# sequence, not once per sequence: sequences of 2000 and 48 rows (Hq = Hk = 16, D = 16) report
# every 10% in order, ending at 100%
gen Lq.npy '<f4' 2048 16 16 --seed $((S0 + 21))
gen Lk.npy '<f4' 2048 16 16 --seed $((S0 + 22))
gen Lv.npy '<f4' 2048 16 16 --seed $((S0 + 23))
ints Lcu.npy 3 -- 0 2000 2048
fa run --q "$I/Lq.npy" --k "$I/Lk.npy" --v "$I/Lv.npy" --cu-seqlens-q "$I/Lcu.npy" --cu-seqlens-k "$I/Lcu.npy" \
  --out "$OUT/o.npy" --threads 2 --progress
pcts=$(sed -n 's/^flashattn: forward *\([0-9]*\)% ([0-9]*\/[0-9]* tiles)$/\1/p' "$W/se" | tr '\n' ' ')
last=$(tail -n 1 "$W/se" | sed -n 's/.*(\([0-9]*\)\/\([0-9]*\) tiles)$/\1 \2/p')
if [ $rc -ne 0 ]; then no "packed run progress" "exit $rc: $(head -c 300 "$W/se")"
elif [ "$(printf '%s' "$pcts" | wc -w)" -lt 10 ]; then no "packed run progress" "percents '$pcts' (want every 10%): $(head -c 300 "$W/se")"
elif [ "$(printf '%s\n' $pcts | sort -n -u | tr '\n' ' ')" != "$pcts" ]; then no "packed run progress" "not increasing: '$pcts'"
elif [ "${pcts% }" = "${pcts% 100 }" ] || [ "${last% *}" != "${last#* }" ]; then no "packed run progress" "does not end at 100% ('$pcts', last '$last')"
else ok "packed run progress: ${pcts}% (ending $(tail -n 1 "$W/se" | sed 's/.*(//')"; fi
rm -f "$OUT"/* "$I"/L*.npy

fa plan --heads 4 --kv-heads 2 --head-dim 16 --cu-seqlens-q "$I/cq.npy" --cu-seqlens-k "$I/ck.npy" --backend cuda
if [ $rc -eq 1 ] && grep -q "cuda backend has no" "$W/se"; then ok "varlen plan --backend cuda: unsupported, said clearly"
else no "varlen plan --backend cuda" "exit $rc: $(cat "$W/se")"; fi

# ---- kv-cache decoding ------------------------------------------------------------------
# B=3, Sq_new=2, Hq=8, Hk=1 (MQA), D=16; caches [3, 64, 1, 16]; lengths 0, 17, 50
gen dq.npy '<f4' 3 2 8 16 --seed $((S0 + 11))
gen kc.npy '<f4' 3 64 1 16 --seed $((S0 + 12))
gen vc.npy '<f4' 3 64 1 16 --seed $((S0 + 13))
gen kn.npy '<f4' 3 2 1 16 --seed $((S0 + 14))
gen vn.npy '<f4' 3 2 1 16 --seed $((S0 + 15))
ints lens.npy 3 -- 0 17 50
ints full.npy 3 -- 0 63 50
cp "$I/kc.npy" "$W/kc0.npy"; cp "$I/vc.npy" "$W/vc0.npy"
DEC="--q $I/dq.npy --k $I/kc.npy --v $I/vc.npy --cache-seqlens $I/lens.npy --causal"
fa run $DEC --k-new "$I/kn.npy" --v-new "$I/vn.npy" --out "$OUT/o.npy" --lse "$OUT/lse.npy" --count
if [ $rc -ne 0 ]; then no "decode run (append)" "exit $rc: $(cat "$W/se")"
elif ! cmp -s "$I/kc.npy" "$W/kc0.npy" || ! cmp -s "$I/vc.npy" "$W/vc0.npy"; then no "decode without --update-cache" "a cache file changed"
elif ! "$TI" decode "$I/dq.npy" "$I/kc.npy" "$I/vc.npy" "$I/lens.npy" "$OUT/o.npy" "$OUT/lse.npy" --causal --new "$I/kn.npy" "$I/vn.npy" >"$W/ref"; then
  no "decode run vs reference" "$(cat "$W/ref")"
else ok "decode (MQA, ragged lengths with 0, 2 new tokens): o matches the reference, cache files untouched"; fi
flops=$(json_int flops) trans=$(json_int transcendentals)
fa plan --heads 8 --kv-heads 1 --head-dim 16 --seq-k 64 --cache-seqlens "$I/lens.npy" --k-new "$I/kn.npy" --v-new "$I/vn.npy" --causal --json
pf=$(sed -n 's/.*"forward": {"flops": \([0-9]*\), [^}]*"transcendentals": \([0-9]*\),.*/\1 \2/p' "$W/so")
if [ $rc -eq 0 ] && [ "$pf" = "$flops $trans" ]; then ok "decode: counts == plan ($pf)"
else no "decode counts" "run counted '$flops $trans', plan says '$pf' (exit $rc: $(cat "$W/se"))"; fi
rm -f "$OUT"/*
OUTK=$W/upd; mkdir -p "$OUTK"; cp "$W/kc0.npy" "$OUTK/kc.npy"; cp "$W/vc0.npy" "$OUTK/vc.npy"
fa run --q "$I/dq.npy" --k "$OUTK/kc.npy" --v "$OUTK/vc.npy" --cache-seqlens "$I/lens.npy" --causal \
  --k-new "$I/kn.npy" --v-new "$I/vn.npy" --update-cache --out "$OUT/o.npy"
if [ $rc -ne 0 ]; then no "decode --update-cache" "exit $rc: $(cat "$W/se")"
elif ! "$TI" cache "$W/kc0.npy" "$OUTK/kc.npy" "$I/lens.npy" "$I/kn.npy" >"$W/ref" || \
     ! "$TI" cache "$W/vc0.npy" "$OUTK/vc.npy" "$I/lens.npy" "$I/vn.npy" >>"$W/ref"; then no "decode --update-cache" "$(cat "$W/ref")"
else ok "decode --update-cache: both caches rewritten with the new rows at cache_seqlens[b], the rest unchanged"; fi
rm -f "$OUT"/*
# computed in bf16 from float32 files: only the appended rows change (bf16-rounded); the
# rows already cached keep their float32 bits (a run once rewrote every row rounded)
cp "$W/kc0.npy" "$OUTK/kc.npy"; cp "$W/vc0.npy" "$OUTK/vc.npy"
fa run --q "$I/dq.npy" --k "$OUTK/kc.npy" --v "$OUTK/vc.npy" --cache-seqlens "$I/lens.npy" --causal \
  --k-new "$I/kn.npy" --v-new "$I/vn.npy" --update-cache --dtype bf16 --out "$OUT/o.npy"
if [ $rc -ne 0 ]; then no "decode --update-cache --dtype bf16" "exit $rc: $(cat "$W/se")"
elif ! "$TI" cache "$W/kc0.npy" "$OUTK/kc.npy" "$I/lens.npy" "$I/kn.npy" --bf16 >"$W/ref" || \
     ! "$TI" cache "$W/vc0.npy" "$OUTK/vc.npy" "$I/lens.npy" "$I/vn.npy" --bf16 >>"$W/ref"; then
  no "decode --update-cache --dtype bf16" "$(cat "$W/ref")"
else ok "decode --update-cache --dtype bf16: only the new rows change (bf16), the cached ones keep their f32 bits"; fi
rm -f "$OUT"/*
# caches named through symbolic links: --update-cache rewrites the files the links name and
# leaves the links as they are (the rename went onto the link: it became a regular file with
# the new rows, and the cache it named stayed stale). A relative link in another folder too.
cp "$W/kc0.npy" "$OUTK/kc.npy"; cp "$W/vc0.npy" "$OUTK/vc.npy"
mkdir -p "$W/links"; ln -sfn kc.npy "$OUTK/klink.npy"; ln -sfn ../upd/vc.npy "$W/links/vlink.npy"
fa run --q "$I/dq.npy" --k "$OUTK/klink.npy" --v "$W/links/vlink.npy" --cache-seqlens "$I/lens.npy" --causal \
  --k-new "$I/kn.npy" --v-new "$I/vn.npy" --update-cache --out "$OUT/o.npy"
if [ $rc -ne 0 ]; then no "decode --update-cache through links" "exit $rc: $(cat "$W/se")"
elif [ ! -L "$OUTK/klink.npy" ] || [ ! -L "$W/links/vlink.npy" ]; then no "decode --update-cache through links" "a link was replaced"
elif ! "$TI" cache "$W/kc0.npy" "$OUTK/kc.npy" "$I/lens.npy" "$I/kn.npy" >"$W/ref" || \
     ! "$TI" cache "$W/vc0.npy" "$OUTK/vc.npy" "$I/lens.npy" "$I/vn.npy" >>"$W/ref"; then
  no "decode --update-cache through links" "the links' targets: $(cat "$W/ref")"
elif [ -n "$(ls -A "$OUTK" | grep -v '^\(kc\|vc\|klink\)\.npy$')" ] || [ "$(ls -A "$W/links")" != vlink.npy ]; then
  no "decode --update-cache through links" "left: $(ls -A "$OUTK" "$W/links" | tr '\n' ' ')"
else ok "decode --update-cache through symbolic links: the linked caches rewritten, the links kept"; fi
rm -f "$OUT"/*
# --out through a link to the --k cache is the cache itself: refused (the files compared)
cp "$W/kc0.npy" "$OUTK/kc.npy"; cp "$W/vc0.npy" "$OUTK/vc.npy"
expect_bad "decode --update-cache: --out a link to the --k cache" "name the same file" run --q "$I/dq.npy" \
  --k "$OUTK/kc.npy" --v "$OUTK/vc.npy" --cache-seqlens "$I/lens.npy" --k-new "$I/kn.npy" --v-new "$I/vn.npy" \
  --update-cache --out "$OUTK/klink.npy"
[ -L "$OUTK/klink.npy" ] && cmp -s "$OUTK/kc.npy" "$W/kc0.npy" && ok "refused: the link and the cache untouched" ||
  no "refused --out link to the cache" "the link or the cache changed"
# --v a link to the --k cache: refused, the message naming the file (it printed the resolved
# path after freeing it: garbage bytes)
expect_bad "decode --update-cache: --v a link to the --k cache" "--k and --v name the same file .*kc.npy\$" run \
  --q "$I/dq.npy" --k "$OUTK/kc.npy" --v "$OUTK/klink.npy" --cache-seqlens "$I/lens.npy" --k-new "$I/kn.npy" \
  --v-new "$I/vn.npy" --update-cache --out "$OUT/o.npy"
rm -f "$OUTK/klink.npy"; rm -rf "$W/links"
# stdout before the commit: --count to a full stdout is a failure with nothing written, the
# caches included (the outputs were committed first, then the exit was 1)
"$FA" run --q "$I/dq.npy" --k "$OUTK/kc.npy" --v "$OUTK/vc.npy" --cache-seqlens "$I/lens.npy" --causal \
  --k-new "$I/kn.npy" --v-new "$I/vn.npy" --update-cache --out "$OUT/o.npy" --count >/dev/full 2>"$W/se"
rc=$?
if [ $rc -eq 1 ] && [ -z "$(ls -A "$OUT")" ] && cmp -s "$OUTK/kc.npy" "$W/kc0.npy" && cmp -s "$OUTK/vc.npy" "$W/vc0.npy" &&
   grep -q "cannot write to stdout" "$W/se"; then ok "decode --update-cache --count > /dev/full: exit 1, no output, caches untouched"
else no "decode --count > /dev/full" "exit $rc, out: $(ls -A "$OUT"), $(cat "$W/se")"; fi
rm -f "$OUT"/*
# --progress on a decode run reports as dense and packed runs do
fa run --q "$I/dq.npy" --k "$W/kc0.npy" --v "$W/vc0.npy" --cache-seqlens "$I/lens.npy" --out "$OUT/o.npy" --progress
if [ $rc -eq 0 ] && grep -q "100%.*work items)" "$W/se"; then ok "decode --progress: $(tail -n 1 "$W/se")"
else no "decode --progress" "exit $rc: $(cat "$W/se")"; fi
rm -f "$OUT"/*
cp "$W/kc0.npy" "$OUTK/kc.npy"; cp "$W/vc0.npy" "$OUTK/vc.npy"
expect_bad "decode: cache_seqlens + new tokens past the capacity" "cache_seqlens\[1\]" run --q "$I/dq.npy" \
  --k "$OUTK/kc.npy" --v "$OUTK/vc.npy" --cache-seqlens "$I/full.npy" --k-new "$I/kn.npy" --v-new "$I/vn.npy" \
  --update-cache --out "$OUT/o.npy"
if cmp -s "$OUTK/kc.npy" "$W/kc0.npy" && cmp -s "$OUTK/vc.npy" "$W/vc0.npy"; then ok "refused decode: caches untouched"
else no "refused decode" "a cache file changed"; fi
# outputs against the caches --update-cache rewrites, compared as files: ./kc.npy is kc.npy
expect_bad "decode --update-cache: --out names the --k cache" "\-\-out and \-\-k name the same file" run --q "$I/dq.npy" \
  --k "$OUTK/kc.npy" --v "$OUTK/vc.npy" --cache-seqlens "$I/lens.npy" --k-new "$I/kn.npy" --v-new "$I/vn.npy" \
  --update-cache --out "$OUTK/./kc.npy"
expect_bad "decode --update-cache: --k and --v one cache" "\-\-k and \-\-v name the same file" run --q "$I/dq.npy" \
  --k "$OUTK/kc.npy" --v "$OUTK/./kc.npy" --cache-seqlens "$I/lens.npy" --k-new "$I/kn.npy" --v-new "$I/vn.npy" \
  --update-cache --out "$OUT/o.npy"
if cmp -s "$OUTK/kc.npy" "$W/kc0.npy" && cmp -s "$OUTK/vc.npy" "$W/vc0.npy"; then ok "refused same-file decodes: caches untouched"
else no "refused same-file decodes" "a cache file changed"; fi
expect_bad "decode: --update-cache without new tokens" "update-cache" run $DEC --update-cache --out "$OUT/o.npy"
expect_bad "decode: --k-new without --v-new" "go together" run $DEC --k-new "$I/kn.npy" --out "$OUT/o.npy"

# a shared prefix of 600 keys (two chunks) before every cache: counts == plan, bad prefixes refused
gen kp.npy '<f4' 600 1 16 --seed $((S0 + 16))
gen vp.npy '<f4' 600 1 16 --seed $((S0 + 17))
gen kp8.npy '<f4' 600 1 8 --seed $((S0 + 18))
fa run $DEC --k-new "$I/kn.npy" --v-new "$I/vn.npy" --k-prefix "$I/kp.npy" --v-prefix "$I/vp.npy" --out "$OUT/o.npy" --count
flops=$(json_int flops) trans=$(json_int transcendentals)
fa plan --heads 8 --kv-heads 1 --head-dim 16 --seq-k 64 --cache-seqlens "$I/lens.npy" --k-new "$I/kn.npy" --v-new "$I/vn.npy" \
  --k-prefix "$I/kp.npy" --v-prefix "$I/vp.npy" --causal --json
pf=$(sed -n 's/.*"forward": {"flops": \([0-9]*\), [^}]*"transcendentals": \([0-9]*\),.*/\1 \2/p' "$W/so")
if [ $rc -eq 0 ] && [ -n "$flops" ] && [ "$pf" = "$flops $trans" ]; then ok "decode with a shared prefix: counts == plan ($pf)"
else no "shared prefix counts" "run counted '$flops $trans', plan says '$pf' (exit $rc: $(cat "$W/se"))"; fi
rm -f "$OUT"/*
cp "$W/kc0.npy" "$I/kc.npy"; cp "$W/vc0.npy" "$I/vc.npy"
expect_bad "decode: --k-prefix without --v-prefix" "go together" run $DEC --k-prefix "$I/kp.npy" --out "$OUT/o.npy"
expect_bad "decode: a prefix of another head dim" "k-prefix" run $DEC --k-prefix "$I/kp8.npy" --v-prefix "$I/vp.npy" --out "$OUT/o.npy"
# a wrong dimension of the new tokens or the prefix is named, with the file its value comes
# from (it said "a dimension 1 does not match [B, Sq_new, Hk, D]'s 2", and D for v's Dv)
gen kn_b2.npy '<f4' 2 2 1 16 --seed $((S0 + 19))
gen kn_s1.npy '<f4' 3 1 1 16 --seed $((S0 + 19))
gen vn_h2.npy '<f4' 3 2 2 16 --seed $((S0 + 19))
gen vn_d8.npy '<f4' 3 2 1 8 --seed $((S0 + 19))
gen vp5.npy '<f4' 5 1 16 --seed $((S0 + 19))
expect_bad "decode: --k-new of another batch, named" "\-\-k-new .*kn_b2.npy: batch 2 does not match --cache-seqlens's 3\$" \
  run $DEC --k-new "$I/kn_b2.npy" --v-new "$I/vn.npy" --out "$OUT/o.npy"
expect_bad "decode: --k-new of another Sq_new, named" "\-\-k-new .*: Sq_new 1 does not match --q's 2\$" \
  run $DEC --k-new "$I/kn_s1.npy" --v-new "$I/vn.npy" --out "$OUT/o.npy"
expect_bad "decode: --v-new of other kv heads, named" "\-\-v-new .*: kv heads Hk 2 does not match --v's 1\$" \
  run $DEC --k-new "$I/kn.npy" --v-new "$I/vn_h2.npy" --out "$OUT/o.npy"
expect_bad "decode: --v-new of another Dv, named" "\-\-v-new .*: head dim Dv 8 does not match --v's 16\$" \
  run $DEC --k-new "$I/kn.npy" --v-new "$I/vn_d8.npy" --out "$OUT/o.npy"
expect_bad "decode: --k-prefix of another D, named" "\-\-k-prefix .*: head dim D 8 does not match --k's 16\$" \
  run $DEC --k-prefix "$I/kp8.npy" --v-prefix "$I/vp.npy" --out "$OUT/o.npy"
expect_bad "decode: --v-prefix of other rows, named" "\-\-v-prefix .*: rows P 5 does not match --k-prefix's 600\$" \
  run $DEC --k-prefix "$I/kp.npy" --v-prefix "$I/vp5.npy" --out "$OUT/o.npy"

# option files whose features the inference shapes do not run are refused by the library's one
# message naming both, before any file is checked against the shape (a shape check came first
# and asked for a shape the combination then refused anyway); --alibi and --sinks combine
gen b_any.npy '<f4' 1 4 1 300 --seed $((S0 + 19))
gen b_dec.npy '<f4' 1 8 1 64 --seed $((S0 + 20))
"$NPY" write "$I/qs_any.npy" '<i4' 1 37 -- 0 >/dev/null
"$NPY" write "$I/ks_any.npy" '<i4' 1 45 -- 0 >/dev/null
ints docs_any.npy 2 -- 5 32
ints pl_any.npy 2 -- 1 2
"$NPY" write "$I/m_any.npy" '|b1' 3 3 -- 1 >/dev/null
VLR="run $VL --out $OUT/o.npy"
DECR="run $DEC --out $OUT/o.npy"
DECP="plan --heads 8 --kv-heads 1 --head-dim 16 --seq-k 64 --cache-seqlens $I/lens.npy"
VLP="plan --heads 4 --kv-heads 2 --head-dim 16 --cu-seqlens-q $I/cq.npy --cu-seqlens-k $I/ck.npy"
NV="with packed variable-length batches (cu_seqlens)" ND="with kv-cache decoding (cache_seqlens)"
MASK="a block-sparse mask (mask) does not combine"
for form in VLR DECR VLP DECP; do
  case $form in VL*) with=$NV ;; *) with=$ND ;; esac
  for f in "--bias $I/b_any.npy" "--bias $I/b_dec.npy" "--q-segments $I/qs_any.npy --kv-segments $I/ks_any.npy"            "--documents $I/docs_any.npy" "--mask $I/m_any.npy" "--prefix-len $I/pl_any.npy" "--prefix-len 3" "--mask-chunk 4"; do
    case $f in --bias*) what="an additive bias (has_bias) does not combine" ;; --q-seg*) what="segment ids (has_segment_ids) do not combine" ;;
      *) what=$MASK ;; esac
    expect_bad "$form ${f%% *}: the library's refusal" "$what $with" ${!form} $f
  done
done
expect_bad "varlen grad --bias --dbias: the library's refusal" "an additive bias (has_bias) does not combine $NV" \
  grad $VG --cu-seqlens-q "$I/cq.npy" --cu-seqlens-k "$I/ck.npy" --bias "$I/b_any.npy" --dbias "$OUT/db.npy"
gen al8.npy '<f4' 8 --seed $((S0 + 9))
fa run $DEC --alibi "$I/al8.npy" --sinks "$I/al8.npy" --out "$OUT/o.npy"
if [ $rc -eq 0 ] && [ "$("$NPY" info "$OUT/o.npy")" = "<f4 3,2,8,16 finite" ]; then ok "decode --alibi --sinks: they combine"
else no "decode --alibi --sinks" "exit $rc: $(cat "$W/se")"; fi
rm -f "$OUT"/*

# paged: 10 pages of 16 rows, Hk=2; tables [3, 4] in shuffled order; sequences 0 and 1 share page 7
gen pq.npy '<f4' 3 1 4 16 --seed $((S0 + 21))
gen pk.npy '<f4' 10 16 2 16 --seed $((S0 + 22))
gen pv.npy '<f4' 10 16 2 16 --seed $((S0 + 23))
gen pkn.npy '<f4' 3 1 2 16 --seed $((S0 + 24))
gen pvn.npy '<f4' 3 1 2 16 --seed $((S0 + 25))
ints bt.npy 3 4 -- 7 2 9 -1 7 4 -1 -1 5 0 3 8
ints bt_bad.npy 3 4 -- 7 2 9 -1 7 4 -1 -1 5 0 10 8
ints plens.npy 3 -- 40 20 50
PG="--q $I/pq.npy --k $I/pk.npy --v $I/pv.npy --cache-seqlens $I/plens.npy --block-table"
fa run $PG "$I/bt.npy" --out "$OUT/o.npy" --lse "$OUT/lse.npy"
if [ $rc -ne 0 ]; then no "paged decode" "exit $rc: $(cat "$W/se")"
elif ! "$TI" decode "$I/pq.npy" "$I/pk.npy" "$I/pv.npy" "$I/plens.npy" "$OUT/o.npy" "$OUT/lse.npy" --table "$I/bt.npy" >"$W/ref"; then
  no "paged decode vs reference" "$(cat "$W/ref")"
else ok "paged decode (shuffled pages, a shared page, unused entries -1): matches the reference"; fi
rm -f "$OUT"/*
cp "$I/pk.npy" "$W/pk0.npy"
expect_bad "paged decode: block id out of range" "block_table\[2\]\[2\]" run $PG "$I/bt_bad.npy" \
  --k-new "$I/pkn.npy" --v-new "$I/pvn.npy" --update-cache --out "$OUT/o.npy"
if cmp -s "$I/pk.npy" "$W/pk0.npy"; then ok "refused paged decode: cache untouched"; else no "refused paged decode" "cache changed"; fi
ints plens_full.npy 3 -- 40 20 64
expect_bad "paged decode: new tokens past the capacity" "cache_seqlens\[2\]" run --q "$I/pq.npy" --k "$I/pk.npy" \
  --v "$I/pv.npy" --cache-seqlens "$I/plens_full.npy" --block-table "$I/bt.npy" --k-new "$I/pkn.npy" --v-new "$I/pvn.npy" \
  --out "$OUT/o.npy"
fa plan --heads 4 --kv-heads 2 --head-dim 16 --cache-seqlens "$I/plens.npy" --block-table "$I/bt.npy" --page-size 16 --num-pages 10 --json
if [ $rc -eq 0 ] && grep -q '"bytes_accessed"' "$W/so"; then ok "paged plan --json"; else no "paged plan" "exit $rc: $(cat "$W/se")"; fi

# a plan's paged cache is described by --block-table (issue 18, item 9: these were ignored)
PP="--heads 4 --kv-heads 2 --head-dim 16 --cache-seqlens $I/plens.npy"
expect_bad "paged plan: --page-size/--num-pages without --block-table" "page-size.*--block-table" plan $PP \
  --page-size 16 --num-pages 10 --seq-k 64
expect_bad "paged plan: --num-pages without --block-table" "num-pages.*--block-table" plan $PP --num-pages 10 --seq-k 64
expect_bad "paged plan: --seq-k contradicts the table" "\-\-seq-k 100 does not match the paged capacity.*= 64" plan $PP \
  --block-table "$I/bt.npy" --page-size 16 --num-pages 10 --seq-k 100
# a table with no pages is an empty input, refused in the command line's words (cli.md)
ints bt_empty.npy 3 0 --
expect_bad "paged plan: a [3, 0] block table" "shape \[3, 0\] has a zero dimension" plan $PP --block-table "$I/bt_empty.npy" \
  --page-size 16 --num-pages 10
fa plan $PP --block-table "$I/bt.npy" --page-size 16 --num-pages 10 --seq-k 64 --json
[ $rc -eq 0 ] && ok "paged plan: a --seq-k equal to the table's capacity is fine" || no "paged plan --seq-k 64" "exit $rc: $(cat "$W/se")"
# the page size of the files is the library's to check (one rule, one message)
gen pk8.npy '<f4' 20 8 2 16 --seed $((S0 + 26))
expect_bad "paged decode: pages of 8 rows" "page_size must be a positive multiple of 16" run --q "$I/pq.npy" \
  --k "$I/pk8.npy" --v "$I/pk8.npy" --cache-seqlens "$I/plens.npy" --block-table "$I/bt.npy" --out "$OUT/o.npy"

# ---- the benchmarks' forms ---------------------------------------------------------------
fa bench --decode --batch 2 --heads 8 --kv-heads 2 --head-dim 32 --cache-len 300 --dtype bf16 --iters 2 --json
if [ $rc -eq 0 ] && grep -q '"decode": {"seconds"' "$W/so"; then ok "bench --decode --json"; else no "bench --decode" "exit $rc: $(cat "$W/se")"; fi
fa bench --decode --batch 2 --heads 8 --kv-heads 2 --head-dim 32 --cache-len 300 --page-size 32 --iters 2
if [ $rc -eq 0 ] && grep -q 'GB/s of cache read' "$W/so"; then ok "bench --decode --page-size"; else no "bench --decode paged" "exit $rc: $(cat "$W/se")"; fi
# --huge-pages: the caches on 2 MiB pages where Linux grants them (the JSON says how many bytes
# of the process are; 0 or more, -1 where /proc cannot tell), refused for anything but --decode
fa bench --decode --batch 1 --heads 8 --kv-heads 2 --head-dim 64 --cache-len 4096 --dtype bf16 --iters 2 --json --huge-pages
if [ $rc -eq 0 ] && grep -q '"huge_page_bytes": -\{0,1\}[0-9]' "$W/so"; then ok "bench --decode --huge-pages"
else no "bench --decode --huge-pages" "exit $rc: $(cat "$W/so" "$W/se")"; fi
# option files: the inference benchmarks time shapes alone; a combination the library refuses
# is its message, a feature it runs is refused by name (both were ignored, exit 0)
gen bal.npy '<f4' 8 --seed $((S0 + 27))
gen bb.npy '<f4' 1 8 1 300 --seed $((S0 + 28))
expect_bad "bench --decode --bias" "additive bias (has_bias) does not combine with kv-cache decoding" bench --decode \
  --batch 2 --heads 8 --kv-heads 2 --head-dim 32 --cache-len 300 --iters 1 --bias "$I/bb.npy"
expect_bad "bench --decode --alibi" "does not apply --alibi" bench --decode --batch 2 --heads 8 --kv-heads 2 \
  --head-dim 32 --cache-len 300 --iters 1 --alibi "$I/bal.npy"
expect_bad "bench --varlen --mask-chunk" "does not combine with packed variable-length" bench --varlen 16,70 \
  --heads 2 --head-dim 16 --iters 1 --mask-chunk 8
expect_bad "bench --huge-pages without --decode" "--huge-pages" bench --varlen 16,70 --heads 2 --head-dim 16 --huge-pages
expect_bad "bench --huge-pages on a training bench" "--huge-pages" bench --batch 1 --heads 2 --seq 64 --head-dim 16 --huge-pages
# --layers L: L sets of caches read in turn (int8: codes and scales in each); 1 to 4096, --decode only
fa bench --decode --batch 1 --heads 4 --kv-heads 2 --head-dim 32 --cache-len 200 --cache-dtype int8 --iters 4 --json --layers 3
if [ $rc -eq 0 ] && grep -q '"layers": 3}' "$W/so"; then ok "bench --decode --layers 3"; else no "bench --decode --layers" "exit $rc: $(cat "$W/so" "$W/se")"; fi
expect_bad "bench --decode --layers 4097" "at most 4096" bench --decode --batch 1 --heads 2 --head-dim 16 --cache-len 8 --layers 4097
expect_bad "bench --layers without --decode" "--layers applies to --decode" bench --batch 1 --heads 2 --seq 64 --head-dim 16 --layers 2
expect_bad "bench --varlen --layers" "--layers applies to --decode" bench --varlen 16,70 --heads 2 --head-dim 16 --layers 2
# flags the chosen benchmark does not read: refused by name, never ignored (they were, exit 0)
expect_bad "bench --page-size without --decode" "--page-size applies to --decode" bench --batch 1 --heads 2 --seq 64 \
  --head-dim 16 --page-size 16
expect_bad "bench --cache-len without --decode" "--cache-len applies to --decode" bench --varlen 16,70 --heads 2 \
  --head-dim 16 --cache-len 64
expect_bad "bench --varlen --seq-q" "--seq-q does not apply to --varlen" bench --varlen 16,70 --heads 2 --head-dim 16 --seq-q 4
expect_bad "bench --varlen --batch" "--batch does not apply to --varlen" bench --varlen 16,70 --heads 2 --head-dim 16 --batch 2
expect_bad "bench --decode --seq" "--seq does not apply to --decode" bench --decode --batch 1 --heads 2 --head-dim 16 \
  --cache-len 64 --seq 8
fa bench --varlen 16,0,70,33 --heads 2 --head-dim 16 --causal --iters 1 --json
if [ $rc -eq 0 ] && grep -q '"time_per_useful_flop_ratio"' "$W/so"; then ok "bench --varlen --json"; else no "bench --varlen" "exit $rc: $(cat "$W/se")"; fi
expect_bad "bench --varlen: bad list" "--varlen" bench --varlen 16,x --heads 2 --head-dim 16
# no useful flops (every length 0): the ratio is undefined, not a ratio of two timings of nothing
fa bench --varlen 0,0 --heads 2 --head-dim 16 --iters 1
if [ $rc -eq 0 ] && grep -q 'time per useful flop: undefined' "$W/so" && ! grep -q ' x padded' "$W/so"; then
  ok "bench --varlen 0,0: ratio undefined"; else no "bench --varlen 0,0" "exit $rc: $(tail -n 1 "$W/so") $(head -c 200 "$W/se")"; fi
fa bench --varlen 0 --heads 2 --head-dim 16 --iters 1 --json
if [ $rc -eq 0 ] && grep -q '"time_per_useful_flop_ratio": null}' "$W/so"; then ok "bench --varlen 0 --json: ratio null"
else no "bench --varlen 0 --json" "exit $rc: $(tail -n 1 "$W/so")"; fi
# --cache-len 0 was refused as if missing ("needs --batch, --heads, --head-dim and --cache-len")
expect_bad "bench --decode --cache-len 0" "\-\-cache-len: 0 is below 1" bench --decode --batch 1 --heads 2 --head-dim 16 --cache-len 0
expect_bad "bench --decode without --cache-len" "missing \-\-cache-len" bench --decode --batch 1 --heads 2 --head-dim 16
# quantized caches (docs/caches.md): plan bytes of codes and scales, bench over them, bad names
fwd_bytes() { grep -o '"bytes_accessed": [0-9]*' "$W/so" | head -1 | grep -o '[0-9]*$'; } # the forward's
fa plan --batch 3 --heads 8 --kv-heads 2 --head-dim 16 --seq-k 64 --cache-seqlens "$I/lens.npy" --dtype bf16 --json
plain=$(fwd_bytes)
fa plan --batch 3 --heads 8 --kv-heads 2 --head-dim 16 --seq-k 64 --cache-seqlens "$I/lens.npy" --dtype bf16 --cache-dtype int8 --json
quant=$(fwd_bytes)
# problem.inference says what seq_k is (the caches' capacity) and the cache's type; a plan made
# from capacities is not exact (its figures are the capacity's, a call's are plan's without
# the flag): it said exact, and the problem object was a dense one's
if grep -q '"inference": {"shape": "decode", "lengths_per_call": false, "cache_dtype": "int8", "page_size": 0' "$W/so" &&
  grep -q '"exact": true' "$W/so"; then ok "plan --json: problem.inference of a decode plan"
else no "plan --json: problem.inference" "$(cat "$W/so")"; fi
fa plan --batch 3 --heads 8 --kv-heads 2 --head-dim 16 --seq-k 64 --cache-seqlens "$I/lens.npy" --lengths-per-call --json
if grep -q '"inference": {"shape": "decode", "lengths_per_call": true' "$W/so" && grep -q '"exact": false' "$W/so"; then
  ok "plan --lengths-per-call --json: exact false, lengths_per_call true"
else no "plan --lengths-per-call --json" "$(cat "$W/so" "$W/se")"; fi
if [ $rc -eq 0 ] && [ -n "$quant" ] && [ "$quant" -lt "$plain" ]; then ok "plan --cache-dtype int8: fewer bytes ($quant < $plain)"
else no "plan --cache-dtype int8" "bytes '$quant' vs '$plain' (exit $rc: $(cat "$W/se"))"; fi
# the human form names the cache dtype its figures count (it once printed the problem without it)
fa plan --batch 3 --heads 8 --kv-heads 2 --head-dim 16 --seq-k 64 --cache-seqlens "$I/lens.npy" --dtype bf16 --cache-dtype fp8
if [ $rc -eq 0 ] && head -1 "$W/so" | grep -q ', fp8_e4m3 cache'; then ok "plan --cache-dtype fp8 names it"
else no "plan --cache-dtype fp8 names it" "$(head -1 "$W/so")"; fi
for cd in int8 fp8; do
  fa bench --decode --batch 2 --heads 8 --kv-heads 2 --head-dim 32 --cache-len 300 --page-size 32 --cache-dtype $cd --iters 2 --json
  if [ $rc -eq 0 ] && grep -q '"decode": {"seconds"' "$W/so"; then ok "bench --decode --cache-dtype $cd"; else no "bench --decode --cache-dtype $cd" "exit $rc: $(cat "$W/se")"; fi
done
expect_bad "--cache-dtype: bad name" "--cache-dtype" bench --decode --batch 1 --heads 2 --head-dim 16 --cache-len 64 --cache-dtype int4
expect_bad "--cache-dtype: dense attention refuses it" "quantized" plan --batch 1 --heads 2 --seq 64 --head-dim 16 --cache-dtype fp8

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
