#!/usr/bin/env bash
# The CLI's standard streams and output links (docs/cli.md, "Outputs"): a stdout or stderr the
# caller closed (`>&-`, `2>&-`) never becomes an output's file (the next open file takes the
# lowest free number: --progress or --count text once landed inside o.npy, with exit 0); a
# closed pipe on stdout is exit 1 ("cannot write to stdout"), not a death by SIGPIPE; an
# output path that is a symbolic link, to a file, a device or a directory, is replaced by
# the new file and its target left alone. stdout is written and flushed before any output is
# moved into place (a full stdout: exit 1, no output).
# Usage: bash tests/test_cli_streams.sh BUILD_DIR. Needs BUILD_DIR/flashattn and BUILD_DIR/tool_npy.
set -u
source "$(dirname "$0")/cli_harness.sh" test_cli_streams "${1:-build}"
gen() { "$NPY" rand "$W/$1" "$2" "${@:3}" >/dev/null || { echo "tool_npy failed on $1"; exit 1; }; }
gen q.npy '<f4' 1 2 64 16 --seed $((S0 + 1))
gen k.npy '<f4' 1 2 64 16 --seed $((S0 + 2))
gen v.npy '<f4' 1 2 64 16 --seed $((S0 + 3))
QKV="--q $W/q.npy --k $W/k.npy --v $W/v.npy"
refcheck() { "$NPY" refcheck "$W/q.npy" "$W/k.npy" "$W/v.npy" "$1" 2>&1; }
mkdir "$W/out"

# stderr closed, progress on: o.npy holds o alone
"$FA" run $QKV --out "$W/out/o.npy" --progress --block-q 16 >"$W/so" 2>&-
rc=$? r=$(refcheck "$W/out/o.npy")
[ $rc -eq 0 ] && [ "$r" = "matches the reference" ] && ok "run --progress 2>&-: exit 0, o.npy is o alone" ||
  no "run --progress 2>&-" "exit $rc, $r"
rm -f "$W/out/"*

# stdout closed, --count: stdout cannot be written, exit 1, nothing written
"$FA" run $QKV --out "$W/out/o.npy" --count >&- 2>"$W/se"
rc=$? left=$(ls -A "$W/out")
[ $rc -eq 1 ] && grep -q "cannot write to stdout" "$W/se" && [ -z "$left" ] &&
  ok "run --count >&-: exit 1, no output ($(cat "$W/se"))" || no "run --count >&-" "exit $rc, left '$left': $(cat "$W/se")"
rm -f "$W/out/"*

# stdout closed, no --count: nothing goes to stdout, so the run succeeds
"$FA" run $QKV --out "$W/out/o.npy" >&- 2>"$W/se"
rc=$? r=$(refcheck "$W/out/o.npy")
[ $rc -eq 0 ] && [ "$r" = "matches the reference" ] && ok "run >&- without --count: exit 0, o.npy is o" ||
  no "run >&-" "exit $rc, $r, $(cat "$W/se")"
rm -f "$W/out/"*

# a closed pipe: the reader has gone before anything is written
for args in "plan --batch 1 --heads 2 --seq 64 --head-dim 16 --json" "run $QKV --out $W/out/o.npy --count"; do
  { sleep 1; "$FA" $args 2>"$W/se"; echo $? >"$W/rc"; } | true
  rc=$(cat "$W/rc") left=$(ls -A "$W/out")
  [ "$rc" = 1 ] && grep -q "cannot write to stdout" "$W/se" && [ -z "$left" ] &&
    ok "${args%% *} | (closed): exit 1 ($(cat "$W/se"))" || no "${args%% *} | (closed)" "exit $rc, left '$left': $(cat "$W/se")"
  rm -f "$W/out/"*
done

# output paths that are links: replaced, their targets untouched
echo precious >"$W/target.txt"
mkdir "$W/dir"
for target in "$W/target.txt" /dev/null "$W/dir" "$W/missing"; do
  ln -s "$target" "$W/out/o.npy"
  "$FA" run $QKV --out "$W/out/o.npy" >"$W/so" 2>"$W/se"
  rc=$? r=$(refcheck "$W/out/o.npy")
  intact=1
  [ "$(cat "$W/target.txt")" = precious ] || intact=0
  [ -c /dev/null ] && [ -d "$W/dir" ] && [ -z "$(ls -A "$W/dir")" ] && [ ! -e "$W/missing" ] || intact=0
  [ $rc -eq 0 ] && [ ! -L "$W/out/o.npy" ] && [ "$r" = "matches the reference" ] && [ $intact = 1 ] &&
    ok "--out a link to $target: the link replaced by o, the target untouched" ||
    no "--out a link to $target" "exit $rc, $r, intact $intact, $(cat "$W/se")"
  rm -f "$W/out/"*
done

# (the grad case's inputs and outputs)
gen do.npy '<f4' 1 2 64 16 --seed $((S0 + 4))
G="--dq $W/out/dq.npy --dk $W/out/dk.npy --dv $W/out/dv.npy"
# stdout is written and flushed before any output is moved into place: --count to a full
# stdout once exited 1 ("cannot write to stdout") with the outputs already committed
rm -f "$W/out"/o.npy "$W/out"/lse.npy
"$FA" run $QKV --out "$W/out/o.npy" --lse "$W/out/lse.npy" --count >/dev/full 2>"$W/se"
rc=$?
left=$(ls -A "$W/out" | tr '\n' ' ')
[ $rc -eq 1 ] && [ -z "$left" ] && grep -q "cannot write to stdout" "$W/se" && [ "$(wc -l <"$W/se")" -eq 1 ] &&
  ok "run --count > /dev/full: exit 1, no output written ($(cat "$W/se"))" ||
  no "run --count > /dev/full" "exit $rc, left '$left': $(cat "$W/se")"
"$FA" grad $QKV --do "$W/do.npy" $G --out "$W/out/o.npy" --count >/dev/full 2>"$W/se"
rc=$?
left=$(ls -A "$W/out" | tr '\n' ' ')
[ $rc -eq 1 ] && [ -z "$left" ] && grep -q "cannot write to stdout" "$W/se" &&
  ok "grad --count > /dev/full: exit 1, no output written" || no "grad --count > /dev/full" "exit $rc, left '$left': $(cat "$W/se")"
rm -f "$W/out"/o.npy "$W/out"/lse.npy "$W/out"/d*.npy "$W/out"/*.tmp-*
"$FA" run $QKV --out "$W/out/o.npy" --count >"$W/so" 2>"$W/se"
rc=$?
[ $rc -eq 0 ] && [ -s "$W/out/o.npy" ] && grep -q '^{"flops": [0-9]*, "transcendentals": [0-9]*}$' "$W/so" &&
  ok "run --count to a writable stdout: the line and the output" || no "run --count" "exit $rc: $(cat "$W/so" "$W/se")"
rm -f "$W/out"/o.npy


echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
