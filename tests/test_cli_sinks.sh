#!/usr/bin/env bash
# The CLI's --sinks (docs/cli.md): run and grad on small random .npy files against the
# float64 reference (o; dq, dk, dv and --dsink), --count equal to plan's figures with the
# sinks' exps, and bad sinks files refused (exit 2, one line naming the flag, no output).
# Usage: bash tests/test_cli_sinks.sh BUILD_DIR. Needs BUILD_DIR/flashattn and BUILD_DIR/tool_npy.
set -u
source "$(dirname "$0")/cli_harness.sh" test_cli_sinks "${1:-build}"
gen() { "$NPY" rand "$W/$1" "$2" "${@:3}" >/dev/null || { echo "tool_npy failed on $1"; exit 1; }; }
# B=2 Hq=4 Hk=2 Sq=30 Sk=20 D=16: causal, so the first 10 rows see no key
gen q.npy '<f4' 2 4 30 16 --seed $((S0 + 1))
gen k.npy '<f4' 2 2 20 16 --seed $((S0 + 2))
gen v.npy '<f4' 2 2 20 16 --seed $((S0 + 3))
gen do.npy '<f4' 2 4 30 16 --seed $((S0 + 4))
gen sinks.npy '<f4' 4 --seed $((S0 + 5))
gen sinks3.npy '<f4' 3 --seed $((S0 + 6))
QKV="--q $W/q.npy --k $W/k.npy --v $W/v.npy"

"$FA" run $QKV --causal --sinks "$W/sinks.npy" --out "$W/o.npy" --count >"$W/so" 2>"$W/se"
rc=$?
r=$("$NPY" refcheck "$W/q.npy" "$W/k.npy" "$W/v.npy" "$W/o.npy" --causal --sinks "$W/sinks.npy" 2>&1)
[ $rc -eq 0 ] && [ "$r" = "matches the reference" ] && ok "run --sinks matches the reference" ||
  no "run --sinks" "exit $rc, $r, $(cat "$W/se")"
counted=$(sed -n 's/.*"transcendentals": \([0-9]*\).*/\1/p' "$W/so")
"$FA" plan --batch 2 --heads 4 --kv-heads 2 --seq-q 30 --seq-k 20 --head-dim 16 --causal \
  --sinks "$W/sinks.npy" --json >"$W/plan" 2>&1
planned=$(sed -n 's/.*"forward": {[^}]*"transcendentals": \([0-9]*\).*/\1/p' "$W/plan")
"$FA" plan --batch 2 --heads 4 --kv-heads 2 --seq-q 30 --seq-k 20 --head-dim 16 --causal --json >"$W/plan0" 2>&1
plain=$(sed -n 's/.*"forward": {[^}]*"transcendentals": \([0-9]*\).*/\1/p' "$W/plan0")
[ -n "$counted" ] && [ "$counted" = "$planned" ] && [ $((planned - plain)) -eq $((2 * 4 * 30)) ] &&
  ok "run --count ($counted transcendentals) == plan, one more exp per row than without sinks" ||
  no "counts" "counted '$counted', planned '$planned', without sinks '$plain'"
grep -q '"sinks": true' "$W/plan" && grep -q '"sinks": false' "$W/plan0" &&
  ok "plan --json says the problem has sinks" || no "plan --json sinks" "$(cat "$W/plan")"

"$FA" grad $QKV --do "$W/do.npy" --causal --sinks "$W/sinks.npy" --out "$W/o.npy" --dq "$W/dq.npy" \
  --dk "$W/dk.npy" --dv "$W/dv.npy" --dsink "$W/ds.npy" >"$W/so" 2>"$W/se"
rc=$?
r=$("$NPY" refcheck "$W/q.npy" "$W/k.npy" "$W/v.npy" "$W/o.npy" --causal --sinks "$W/sinks.npy" \
  --do "$W/do.npy" --dq "$W/dq.npy" --dk "$W/dk.npy" --dv "$W/dv.npy" --dsink "$W/ds.npy" 2>&1)
[ $rc -eq 0 ] && [ "$r" = "matches the reference" ] && ok "grad --sinks --dsink matches the reference" ||
  no "grad --sinks" "exit $rc, $r, $(cat "$W/se")"

rm -f "$W/o2.npy"
"$FA" run $QKV --sinks "$W/sinks3.npy" --out "$W/o2.npy" >"$W/so" 2>"$W/se"
rc=$?
[ $rc -eq 2 ] && grep -q -- "--sinks" "$W/se" && [ "$(wc -l <"$W/se")" -eq 1 ] && [ ! -e "$W/o2.npy" ] &&
  ok "sinks of the wrong shape: exit 2 ($(cat "$W/se"))" || no "wrong shape" "exit $rc, $(cat "$W/se")"
"$FA" run $QKV --sinks "$W/q.npy" --out "$W/o2.npy" >"$W/so" 2>"$W/se"
rc=$?
[ $rc -eq 2 ] && [ ! -e "$W/o2.npy" ] && ok "a 4-D sinks file: exit 2 ($(cat "$W/se"))" ||
  no "4-D sinks" "exit $rc, $(cat "$W/se")"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
