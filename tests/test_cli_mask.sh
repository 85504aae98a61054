#!/usr/bin/env bash
# The command line's mask flags (docs/cli.md, docs/masks.md): --mask-chunk, --prefix-len,
# --documents and --mask on small random files: run --count equals the plan to the unit; a
# mask equal to a built-in one (a lower-triangular --mask, --prefix-len 0, --documents of one
# document under --causal) gives the same o bit for bit; bad files exit 2 with one line.
# Usage: bash tests/test_cli_mask.sh BUILD_DIR. Needs BUILD_DIR/flashattn and BUILD_DIR/tool_npy.
set -u
source "$(dirname "$0")/cli_harness.sh" test_cli_mask "${1:-build}"
fa() { "$FA" "$@" >"$W/so" 2>"$W/se"; rc=$?; }
json_field() {
  local t=$1
  [ -n "$2" ] && t=$(printf '%s' "$t" | sed -n "s/.*\"$2\": {\([^}]*\)}.*/\1/p")
  printf '%s' "$t" | sed -n "s/.*\"$3\": \([0-9a-z]*\).*/\1/p"
}
# B=2 Hq=2 Sq=Sk=200 D=16
"$NPY" rand "$W/q.npy" '<f4' 2 2 200 16 --seed $((S0 + 1)) >/dev/null
"$NPY" rand "$W/k.npy" '<f4' 2 2 200 16 --seed $((S0 + 2)) >/dev/null
"$NPY" rand "$W/v.npy" '<f4' 2 2 200 16 --seed $((S0 + 3)) >/dev/null
"$NPY" write "$W/docs.npy" '<i8' 3 -- 70 1 129
"$NPY" write "$W/docs2.npy" '<i4' 2 3 -- 70 1 129 200 0 0
"$NPY" write "$W/one.npy" '<i8' 1 -- 200
"$NPY" write "$W/pre.npy" '<i4' 2 -- 33 150
"$NPY" write "$W/tril.npy" '|b1' 200 200 -- tril
"$NPY" write "$W/bad_docs.npy" '<i8' 2 -- 70 100
"$NPY" write "$W/pre0d.npy" '<i4' -- 33
"$NPY" write "$W/pre2d.npy" '<i4' 2 1 -- 33 150
"$NPY" write "$W/small.npy" '|b1' 20 20 -- tril
SHAPE="--batch 2 --heads 2 --seq 200 --head-dim 16"
QKV="--q $W/q.npy --k $W/k.npy --v $W/v.npy --backend cpu"

# run --count against plan --json, for each flag and a combination
check_counts() {
  local name=$1 opts=$2
  fa run $QKV $opts --out "$W/o_$3.npy" --count
  [ $rc -eq 0 ] || { no "run $name" "exit $rc: $(cat "$W/se")"; return; }
  local counted=$(cat "$W/so")
  fa plan $SHAPE --backend cpu $opts --json
  [ $rc -eq 0 ] || { no "plan $name" "exit $rc: $(cat "$W/se")"; return; }
  local pj=$(cat "$W/so")
  local pf=$(json_field "$pj" forward flops) pt=$(json_field "$pj" forward transcendentals)
  local cf=$(json_field "$counted" "" flops) ct=$(json_field "$counted" "" transcendentals)
  if [ -z "$cf" ] || [ "$cf" != "$pf" ] || [ "$ct" != "$pt" ]; then
    no "run $name" "counted '$cf' flops '$ct' transcendentals, plan says $pf and $pt"; return
  fi
  ok "run $name: counts $cf flops $ct transcendentals = plan"
}
check_counts "--mask-chunk 48" "--mask-chunk 48" chunk
check_counts "--prefix-len 33" "--prefix-len 33" prefix
check_counts "--prefix-len [B]" "--prefix-len $W/pre.npy" prefixb
check_counts "--documents [n]" "--documents $W/docs.npy --causal" docs
check_counts "--documents [B, n]" "--documents $W/docs2.npy" docs2
check_counts "--mask tril" "--mask $W/tril.npy" tril
check_counts "all four ANDed" "--mask-chunk 64 --prefix-len 10 --documents $W/docs.npy --mask $W/tril.npy" all
fa run $QKV --causal --out "$W/o_causal.npy"
check_counts "--documents one --causal" "--documents $W/one.npy --causal" one
check_counts "--prefix-len 0" "--prefix-len 0" prefix0
# problem.mask names the mask's own batch and heads, whose pairs visible_pairs sums: a chunked
# mask is one (batch, head), 200 rows in chunks of 48 (4 x 48 x 49 / 2 + 8 x 9 / 2 = 4740)
fa plan $SHAPE --mask-chunk 48 --json
if grep -q '"mask": {"batch": 1, "heads": 1, "block_q": 128, "block_k": 128, "visible_pairs": 4740' "$W/so"; then
  ok "plan --json: problem.mask's batch, heads and visible pairs"
else no "plan --json: problem.mask" "$(cat "$W/so")"; fi
for m in tril one prefix0; do
  if cmp -s "$W/o_causal.npy" "$W/o_$m.npy"; then ok "$m gives --causal's o bit for bit"
  else no "$m" "o differs from --causal's"; fi
done
if cmp -s "$W/o_causal.npy" "$W/o_chunk.npy"; then no "--mask-chunk 48" "o equals --causal's"; else ok "--mask-chunk 48 changes o"; fi

# bad inputs: exit 2, one line naming the flag
bad() {
  local name=$1 want=$2
  shift 2
  fa "$@"
  local lines=$(wc -l <"$W/se")
  if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -q -- "$want" "$W/se"; then ok "$name: exit 2, '$(cat "$W/se")'"
  else no "$name" "exit $rc, stderr '$(cat "$W/se")'"; fi
}
bad "--documents not summing to Sq" "documents" plan $SHAPE --documents "$W/bad_docs.npy"
bad "--mask of another shape" "--mask" plan $SHAPE --mask "$W/small.npy"
bad "--mask not bool" "--mask" plan $SHAPE --mask "$W/q.npy"
bad "--prefix-len -3" "--prefix-len" plan $SHAPE --prefix-len -3
# --prefix-len takes [B] only; its message said "1 or 2 dims" (--documents' rule) of a 0-d file
bad "--prefix-len of a 0-d file" "want 1 dim, got 0" plan $SHAPE --prefix-len "$W/pre0d.npy"
bad "--prefix-len of a 2-d file" "want 1 dim, got 2" plan $SHAPE --prefix-len "$W/pre2d.npy"
bad "--mask-chunk 0" "--mask-chunk" plan $SHAPE --mask-chunk 0
bad "--documents with Sq != Sk" "documents" plan --batch 2 --heads 2 --seq-q 100 --seq-k 200 --head-dim 16 --documents "$W/docs.npy"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
