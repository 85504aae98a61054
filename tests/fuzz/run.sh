#!/usr/bin/env bash
# make fuzz: builds the libFuzzer harnesses with clang (-fsanitize=fuzzer,address,undefined,
# the library instrumented too) and runs each for its share of FUZZ_SECONDS (default 240 s
# in all), one process at a time (the machine's cores are shared). Each starts from the
# committed seed corpus (tests/fuzz/corpus/<h>/) plus what earlier runs here found
# (build-fuzz/corpus/<h>/, not committed). A crash, leak, timeout or broken invariant is
# copied to tests/fuzz/regressions/<h>/ (commit it with the fix: make test replays it)
# and makes this script fail. Prints executions and coverage (libFuzzer's cov/ft) per harness.
#   FUZZ_SECONDS=1800 make fuzz          FUZZ_HARNESSES="npy plan" make fuzz
set -euo pipefail
cd "$(dirname "$0")/../.."
FUZZ_SECONDS=${FUZZ_SECONDS:-240}
HARNESSES=(${FUZZ_HARNESSES:-npy cli_args plan forward})
JOBS=${JOBS:-2}
BUILD=build-fuzz
CC=${FUZZ_CC:-clang}

command -v "$CC" >/dev/null || { echo "make fuzz needs clang (apt-get install clang)"; exit 1; }
CC=$CC cmake -S . -B $BUILD -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-O1 -g" -DFA_SANITIZE=ON \
  -DFA_FUZZ=ON -DFA_CUDA=OFF >/dev/null
cmake --build $BUILD -j "$JOBS" --target "${HARNESSES[@]/#/fuzz_}"

per=$((FUZZ_SECONDS / ${#HARNESSES[@]}))
[ "$per" -ge 1 ] || per=1
declare -A MAXLEN=([npy]=4096 [cli_args]=1024 [plan]=512 [forward]=96)
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export OMP_WAIT_POLICY=passive # idle OpenMP workers sleep instead of spinning on shared cores
failed=()
summary=()
for h in "${HARNESSES[@]}"; do
  work=$BUILD/corpus/$h art=$BUILD/artifacts/$h/ log=$BUILD/logs/$h.log
  mkdir -p "$work" "$art" "$(dirname "$log")" tests/fuzz/regressions/$h
  rm -f "$art"*
  echo "== fuzz_$h for ${per}s (log: $log)"
  rc=0
  # the CLI parser's error lines would flood the log: its stderr is closed (libFuzzer keeps
  # its own, and the sanitizers' reports, on a duplicate)
  quiet=(); [ "$h" = cli_args ] && quiet=(-close_fd_mask=2)
  ./$BUILD/fuzz_$h "$work" tests/fuzz/corpus/$h -max_total_time="$per" -timeout=30 \
    -rss_limit_mb=4096 -max_len="${MAXLEN[$h]:-1024}" -print_final_stats=1 "${quiet[@]}" \
    -artifact_prefix="$art" >"$log" 2>&1 || rc=$?
  runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
  cov=$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+' || echo 'cov: ? ft: ?')
  # slow-unit-*: inputs slower than 10 s (libFuzzer's report, not a failure) are listed apart
  found=$(ls "$art" 2>/dev/null | grep -vc '^slow-unit-' || true)
  slow=$(ls "$art" 2>/dev/null | grep -c '^slow-unit-' || true)
  summary+=("fuzz_$h: ${runs} executions in ${per}s, ${cov}, corpus $(ls "$work" | wc -l) inputs, ${found} crashes, ${slow} slow inputs (>10 s)")
  if [ "$rc" != 0 ] || [ "$found" != 0 ]; then
    for f in "$art"*; do [ -f "$f" ] && [[ $f != *slow-unit-* ]] && cp "$f" tests/fuzz/regressions/$h/; done
    grep -E 'ERROR|invariant|differs|SUMMARY|runtime error' "$log" | head -5 || true
    failed+=("$h")
  fi
done
echo "== fuzz summary"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}: inputs copied to tests/fuzz/regressions/<harness>/ (make test replays them)"
  exit 1
fi
