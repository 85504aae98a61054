#!/usr/bin/env bash
# `flashattn calibrate` and the predicted seconds of `plan` and `bench` (tools/rates.h): bad
# flags exit 2 with one line; --no-cache writes nothing; a calibration is cached per kernel
# set and thread count in $XDG_CACHE_HOME/flashattn/rates.json, and only plans with that
# thread count predict from it. Usage: bash tests/test_calibrate.sh BUILD_DIR.
set -u
BUILD=${1:-build}
FA=$(cd "$BUILD" && pwd)/flashattn
[ -x "$FA" ] || { echo "missing $FA (build first)"; echo "0 passed, 1 failed"; exit 1; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export XDG_CACHE_HOME=$W/cache # never the user's cache
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
no() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
fa() { "$FA" "$@" >"$W/so" 2>"$W/se"; rc=$?; }

fa calibrate --help
[ $rc -eq 0 ] && grep -q "no-cache" "$W/so" && ok "calibrate --help" || no "calibrate --help" "exit $rc"
# calibrate parses as every subcommand does (cli_parse): twice, above the library's
# thread limit, another subcommand's flag: bad input before any measuring
for args in "--bogus" "--threads 0" "--threads x" "--threads" "--json --json" "--threads 2000" "--threads=1025" \
  "--causal" "--no-cache --no-cache"; do
  fa calibrate $args
  lines=$(wc -l <"$W/se")
  [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && [ ! -e "$W/cache" ] && ok "calibrate $args -> $(cat "$W/se")" ||
    no "calibrate $args" "exit $rc, $lines stderr lines"
done

fa calibrate --threads=1 --no-cache --json
fma=$(sed -n 's/.*"fma_gflops": \([0-9.e+]*\).*/\1/p' "$W/so")
eff=$(sed -n 's/.*"eff_backward_f32": \([0-9.e+]*\).*/\1/p' "$W/so")
[ $rc -eq 0 ] && [ -n "$fma" ] && [ -n "$eff" ] && [ ! -e "$W/cache/flashattn/rates.json" ] &&
  ok "calibrate --no-cache measures (fma $fma GFLOP/s, backward f32 efficiency $eff), writes nothing" ||
  no "calibrate --no-cache" "exit $rc: $(cat "$W/so" "$W/se")"

fa calibrate --threads 1
f="$W/cache/flashattn/rates.json"
[ $rc -eq 0 ] && [ -s "$f" ] && grep -q '"[a-z0-9]*/t1/eff_forward_bf16": ' "$f" &&
  ok "calibrate caches per kernel set and thread count in \$XDG_CACHE_HOME/flashattn/rates.json" ||
  no "calibrate" "exit $rc, cache: $(cat "$f" 2>&1)"

SHAPE="--batch 1 --heads 2 --seq 256 --head-dim 64 --backend cpu"
fa plan $SHAPE --threads 1 --json
[ $rc -eq 0 ] && grep -q '"predicted_seconds": {"forward": [0-9.e-]*, "backward": [0-9.e-]*}' "$W/so" &&
  ok "plan predicts from the cached rates (1 thread)" || no "plan --threads 1" "$(cat "$W/so" "$W/se")"
fa plan $SHAPE --threads 3 --json
[ $rc -eq 0 ] && grep -q '"predicted_seconds": null' "$W/so" &&
  ok "plan on 3 threads predicts nothing (no rates for 3 threads)" || no "plan --threads 3" "$(cat "$W/so")"
fa plan $SHAPE --threads 3
[ $rc -eq 0 ] && grep -q "run \`flashattn calibrate --threads 3\`" "$W/so" &&
  ok "plan says how to get predictions" || no "plan --threads 3 (text)" "$(cat "$W/so")"
fa bench $SHAPE --threads 1 --iters 1 --json
[ $rc -eq 0 ] && grep -q '"forward": {[^}]*"predicted_seconds": [0-9.e-]*[1-9]' "$W/so" &&
  grep -q '"backward": {[^}]*"predicted_seconds": [0-9.e-]*[1-9]' "$W/so" &&
  ok "bench reports predicted beside measured seconds" || no "bench --json" "$(cat "$W/so" "$W/se")"
fa bench $SHAPE --threads 3 --iters 1 --json
[ $rc -eq 0 ] && grep -q '"forward": {[^}]*"predicted_seconds": null' "$W/so" &&
  ok "bench without rates for 3 threads predicts null, as plan" ||
  no "bench --threads 3 --json" "$(cat "$W/so" "$W/se")"

# a cache that cannot be read (here a directory where the file goes) is a failure, never
# "no rates" (the plan once printed "run calibrate" with exit 0 after a calibration)
XDG_CACHE_HOME=$W/broken
mkdir -p "$W/broken/flashattn/rates.json"
fa plan $SHAPE --threads 1
lines=$(wc -l <"$W/se")
[ $rc -eq 1 ] && [ "$lines" -eq 1 ] && grep -q "cannot read the rates cache" "$W/se" && [ ! -s "$W/so" ] &&
  ok "plan with an unreadable rates cache: exit 1, one line ($(cat "$W/se"))" ||
  no "plan, unreadable rates cache" "exit $rc: $(cat "$W/so" "$W/se")"
fa bench $SHAPE --threads 1 --iters 1 --json
[ $rc -eq 1 ] && grep -q "cannot read the rates cache" "$W/se" && ok "bench with an unreadable rates cache: exit 1" ||
  no "bench, unreadable rates cache" "exit $rc: $(cat "$W/se")"
XDG_CACHE_HOME=$W/cache

# the cache's path in --json is a JSON string: a directory with a quote and a backslash in its
# name is escaped (it was printed as it is, which no JSON reader takes)
XDG_CACHE_HOME=$W/'odd"dir\x'
fa calibrate --threads 1 --json
[ $rc -eq 0 ] && grep -qF '"cache": "'"$W"'/odd\"dir\\x/flashattn/rates.json"}' "$W/so" &&
  ok "calibrate --json escapes the cache's path ($(grep -o '"cache": .*' "$W/so"))" ||
  no "calibrate --json, odd cache path" "exit $rc: $(cat "$W/so" "$W/se")"
# a byte that is no part of UTF-8 (a JSON text is Unicode) is written as U+FFFD, valid JSON
XDG_CACHE_HOME=$W/$'bad\xffbyte'
fa calibrate --threads 1 --json
[ $rc -eq 0 ] && grep -qF 'bad\ufffdbyte/flashattn/rates.json"}' "$W/so" && ! LC_ALL=C grep -q $'\xff' "$W/so" &&
  ok "calibrate --json: a byte not UTF-8 in the cache's path as \\ufffd" ||
  no "calibrate --json, non-UTF-8 cache path" "exit $rc: $(cat "$W/so" "$W/se")"
XDG_CACHE_HOME=$W/cache

# calibrate writes its rates cache as the outputs are written: a temporary of its own (once
# the fixed rates.json.tmp, which two calibrations shared), removed on any failure (a write
# that fails left it behind), the cache replaced only when whole and after stdout is flushed
C=$W/ratecache
mkdir -p "$C/flashattn"
printf '{\n  "x/t1/fma_gflops": 1\n}\n' >"$C/flashattn/rates.json"
cp "$C/flashattn/rates.json" "$W/rates0.json"
msg=$(XDG_CACHE_HOME=$C bash -c 'trap "" XFSZ; ulimit -f 0; exec "$0" calibrate --threads 1 2>&1 >/dev/null' "$FA")
rc=$?
left=$(ls -A "$C/flashattn" | tr '\n' ' ')
[ $rc -eq 1 ] && [ "$left" = "rates.json " ] && cmp -s "$C/flashattn/rates.json" "$W/rates0.json" &&
  printf '%s' "$msg" | tail -n 1 | grep -q "calibrate: .*rates.json: writing failed" &&
  ok "calibrate whose cache cannot be written: exit 1, no temporary, cache unchanged ($(printf '%s' "$msg" | tail -n 1))" ||
  no "calibrate, cache write fails" "exit $rc, folder holds '$left': $(printf '%s' "$msg" | tail -n 2)"
XDG_CACHE_HOME=$C "$FA" calibrate --threads 1 --json >/dev/full 2>"$W/se"
rc=$?
left=$(ls -A "$C/flashattn" | tr '\n' ' ')
[ $rc -eq 1 ] && [ "$left" = "rates.json " ] && cmp -s "$C/flashattn/rates.json" "$W/rates0.json" &&
  grep -q "cannot write to stdout" "$W/se" && ok "calibrate > /dev/full: exit 1, cache unchanged" ||
  no "calibrate > /dev/full" "exit $rc, folder holds '$left': $(tail -n 1 "$W/se")"
XDG_CACHE_HOME=$C "$FA" calibrate --threads 1 --json >"$W/so" 2>"$W/se"
rc=$?
left=$(ls -A "$C/flashattn" | tr '\n' ' ')
[ $rc -eq 0 ] && [ "$left" = "rates.json " ] && grep -q '"x/t1/fma_gflops": 1,' "$C/flashattn/rates.json" &&
  grep -q '"[a-z0-9]*/t1/eff_backward_bf16": ' "$C/flashattn/rates.json" && grep -q "\"cache\": \"$C/flashattn/rates.json\"" "$W/so" &&
  ok "calibrate: the cache gains this machine's entry, keeps the others, no temporary left" ||
  no "calibrate into an existing cache" "exit $rc, folder '$left': $(cat "$C/flashattn/rates.json" "$W/se")"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
