#!/usr/bin/env bash
# The CLI's standard streams and output links (docs/cli.md, "Outputs"): a stdout or stderr the
# caller closed (`>&-`, `2>&-`) never becomes an output's file (the next open file takes the
# lowest free number: --progress or --count text once landed inside o.npy, with exit 0); a
# closed pipe on stdout is exit 1 ("cannot write to stdout"), not a death by SIGPIPE; an
# output path that is a symbolic link, to a file, a device or a directory, is replaced by
# the new file and its target left alone.
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

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
