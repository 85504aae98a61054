#!/usr/bin/env bash
# The CLI's --lengths-per-call (docs/cli.md): run makes the plan from the files' capacities
# (caches, packed rows) and passes --cache-seqlens / --cu-seqlens-q/-k with the call. A decode
# step (appending, --update-cache) gives the bits, caches and counts of the plain run; a packed
# batch whose prefix sums end below the tensors' rows gives the rows of a run on the cut tensors
# and o = 0 past the ends; plan --lengths-per-call prints the capacity plan (every cache full);
# lengths past the capacities stay the library's error (exit 2, nothing written).
# Usage: bash tests/test_cli_lengths_per_call.sh BUILD_DIR. Needs BUILD_DIR/flashattn and tool_npy.
set -u
source "$(dirname "$0")/cli_harness.sh" test_cli_lengths_per_call "${1:-build}"
gen() { "$NPY" rand "$W/$1" "$2" "${@:3}" >/dev/null || { echo "tool_npy failed on $1"; exit 1; }; }
ints() { "$NPY" write "$W/$1" '<i4' "${@:2}" >/dev/null || { echo "tool_npy failed on $1"; exit 1; }; }
fa() { "$FA" "$@" >"$W/so" 2>"$W/se"; rc=$?; }
data_bytes() { echo $(($(stat -c %s "$1") - $2)); } # FILE DATA_BYTES: the header's length
flops() { grep -o '"flops": [0-9]*' "$1" | head -1 | grep -o '[0-9]*$'; } # --count's, or plan's forward

# ---- a decode step: B=3 Hq=4 Hk=2 D=16, caches of 32 rows, one new token ----------------
gen q.npy '<f4' 3 1 4 16 --seed $((S0 + 1))
gen kc.npy '<f4' 3 32 2 16 --seed $((S0 + 2))
gen vc.npy '<f4' 3 32 2 16 --seed $((S0 + 3))
gen kn.npy '<f4' 3 1 2 16 --seed $((S0 + 4))
gen vn.npy '<f4' 3 1 2 16 --seed $((S0 + 5))
ints lens.npy 3 -- 0 9 31
ints full.npy 3 -- 31
ints past.npy 3 -- 0 32 3
for m in plain per; do
  mkdir -p "$W/$m" && cp "$W/kc.npy" "$W/vc.npy" "$W/$m/"
  flag=$([ $m = per ] && echo --lengths-per-call)
  fa run --q "$W/q.npy" --k "$W/$m/kc.npy" --v "$W/$m/vc.npy" --cache-seqlens "$W/lens.npy" --k-new "$W/kn.npy" \
    --v-new "$W/vn.npy" --update-cache --causal --out "$W/$m/o.npy" --lse "$W/$m/lse.npy" --count $flag
  [ $rc -eq 0 ] || no "decode run $m" "exit $rc: $(cat "$W/se")"
  cp "$W/so" "$W/$m/count"
done
if cmp -s "$W/plain/o.npy" "$W/per/o.npy" && cmp -s "$W/plain/lse.npy" "$W/per/lse.npy" &&
  cmp -s "$W/plain/kc.npy" "$W/per/kc.npy" && cmp -s "$W/plain/vc.npy" "$W/per/vc.npy"; then
  ok "decode --lengths-per-call: o, lse and the updated caches are the plain run's bits"
else no "decode --lengths-per-call" "o, lse or caches differ from the plain run"; fi
cmp -s "$W/plain/count" "$W/per/count" && [ -n "$(flops "$W/per/count")" ] &&
  ok "decode --lengths-per-call: --count $(cat "$W/per/count") == the plain run's" ||
  no "decode counts" "$(cat "$W/per/count") vs $(cat "$W/plain/count")"
P="plan --heads 4 --kv-heads 2 --head-dim 16 --seq-k 32 --k-new $W/kn.npy --v-new $W/vn.npy --causal"
fa $P --json --cache-seqlens "$W/lens.npy" --lengths-per-call && cp "$W/so" "$W/cap"
fa $P --json --cache-seqlens "$W/full.npy" && cp "$W/so" "$W/fullplan"
fa $P --json --cache-seqlens "$W/lens.npy" && cp "$W/so" "$W/lensplan"
c=$(flops "$W/cap") f=$(flops "$W/fullplan") l=$(flops "$W/lensplan")
[ -n "$c" ] && [ "$c" = "$f" ] && [ "$l" -lt "$c" ] &&
  ok "plan --lengths-per-call: the capacity plan ($c flops, every cache full; these lengths: $l)" ||
  no "plan --lengths-per-call" "capacity '$c', full '$f', lengths '$l' ($(cat "$W/se"))"
# plan --lengths-per-call judges the lengths it was given as a call would (it required the file,
# then ignored its values: exit 0 with lengths past the capacity)
fa $P --json --cache-seqlens "$W/past.npy" --lengths-per-call
[ $rc -eq 2 ] && grep -q "cache-seqlens: cache_seqlens\[1\] = 32 plus 1 new tokens exceeds" "$W/se" &&
  ok "plan --lengths-per-call: lengths past the capacity refused ($(cat "$W/se"))" ||
  no "plan --lengths-per-call past capacity" "exit $rc: $(cat "$W/se")"
# decoding and lengths per call have no backward (docs/semantics.md): null in the JSON, no
# backward column or budget line in the human form; a dense plan keeps both
fa plan --heads 4 --head-dim 16 --cu-seqlens-q "$W/lens.npy" --cu-seqlens-k "$W/lens.npy" --lengths-per-call --json
cp "$W/so" "$W/packedplan"
fa plan --batch 1 --heads 4 --head-dim 16 --seq 8 --json && cp "$W/so" "$W/denseplan"
fa $P --cache-seqlens "$W/lens.npy" && cp "$W/so" "$W/decodehuman"
bad=""
for f in cap fullplan packedplan; do
  grep -q '"backward": null' "$W/$f" && grep -q '"fits_backward": null' "$W/$f" || bad="$bad $f: $(cat "$W/$f")"
done
grep -q '"backward": {"flops": [1-9]' "$W/denseplan" && grep -q '"fits_backward": true' "$W/denseplan" ||
  bad="$bad dense: $(cat "$W/denseplan")"
grep -q "no backward: decoding has none" "$W/decodehuman" && ! grep -q "flash backward" "$W/decodehuman" ||
  bad="$bad human: $(cat "$W/decodehuman")"
[ -z "$bad" ] && ok "plan: decoding and lengths per call show no backward (JSON null), a dense plan both passes" ||
  no "plan with no backward" "$bad"
cp "$W/kc.npy" "$W/kc_keep.npy"
fa run --q "$W/q.npy" --k "$W/kc.npy" --v "$W/vc.npy" --cache-seqlens "$W/past.npy" --k-new "$W/kn.npy" \
  --v-new "$W/vn.npy" --update-cache --lengths-per-call --out "$W/o_past.npy"
[ $rc -eq 2 ] && grep -q "cache_seqlens\[1\]" "$W/se" && [ ! -e "$W/o_past.npy" ] && cmp -s "$W/kc.npy" "$W/kc_keep.npy" &&
  ok "decode --lengths-per-call: a length past the capacity is exit 2, nothing written" ||
  no "decode past capacity" "exit $rc: $(cat "$W/se")"

# ---- a packed batch: 40 query rows and 50 key rows, the sums ending at 37 and 45 ----------
gen q40.npy '<f4' 40 4 16 --seed $((S0 + 6)) # the same seed: q37 is its first 37 rows
gen q37.npy '<f4' 37 4 16 --seed $((S0 + 6))
gen k50.npy '<f4' 50 2 16 --seed $((S0 + 7))
gen k45.npy '<f4' 45 2 16 --seed $((S0 + 7))
gen v50.npy '<f4' 50 2 8 --seed $((S0 + 8))
gen v45.npy '<f4' 45 2 8 --seed $((S0 + 8))
ints cq.npy 5 -- 0 5 5 20 37
ints ck.npy 5 -- 0 10 11 11 45
ints ck_past.npy 5 -- 0 10 11 11 51
CU="--cu-seqlens-q $W/cq.npy --cu-seqlens-k $W/ck.npy --causal"
fa run --q "$W/q37.npy" --k "$W/k45.npy" --v "$W/v45.npy" $CU --out "$W/o37.npy" --count
cp "$W/so" "$W/count37"
# glibc fills what malloc returns with 0x5a (MALLOC_PERTURB_): rows the CLI leaves unset would show
MALLOC_PERTURB_=165 fa run --q "$W/q40.npy" --k "$W/k50.npy" --v "$W/v50.npy" $CU --out "$W/o40.npy" --count \
  --lengths-per-call
n37=$((37 * 4 * 8 * 4)) n3=$((3 * 4 * 8 * 4))
h37=$(data_bytes "$W/o37.npy" $n37) h40=$(data_bytes "$W/o40.npy" $((n37 + n3)))
if [ $rc -ne 0 ]; then no "packed --lengths-per-call" "exit $rc: $(cat "$W/se")"
elif ! cmp -s -n $n37 -i "$h37:$h40" "$W/o37.npy" "$W/o40.npy"; then no "packed --lengths-per-call" "rows differ"
elif [ -n "$(tail -c $n3 "$W/o40.npy" | tr -d '\0')" ]; then no "packed --lengths-per-call" "rows past 37 are not 0"
elif ! cmp -s "$W/so" "$W/count37"; then no "packed --lengths-per-call" "counts $(cat "$W/so") vs $(cat "$W/count37")"
else ok "packed --lengths-per-call: capacity rows, the cut run's rows and counts, o = 0 past the sums' end"; fi
fa run --q "$W/q40.npy" --k "$W/k50.npy" --v "$W/v50.npy" --cu-seqlens-q "$W/cq.npy" --cu-seqlens-k "$W/ck_past.npy" \
  --lengths-per-call --out "$W/o_past.npy"
[ $rc -eq 2 ] && grep -q "reaches past" "$W/se" && [ ! -e "$W/o_past.npy" ] &&
  ok "packed --lengths-per-call: sums past the rows are exit 2, nothing written" ||
  no "packed past capacity" "exit $rc: $(cat "$W/se")"
fa run --q "$W/q40.npy" --k "$W/k50.npy" --v "$W/v50.npy" --lengths-per-call --out "$W/o_none.npy"
[ $rc -eq 2 ] && grep -q -- "--lengths-per-call needs" "$W/se" && ok "--lengths-per-call without lengths: exit 2" ||
  no "--lengths-per-call without lengths" "exit $rc: $(cat "$W/se")"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
