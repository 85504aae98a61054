# Sourced by the command-line tests (test_cli*.sh) after `set -u`, with the test's name and
# the build folder: checks that BUILD's flashattn and tool_npy are built (FA, NPY), makes a
# scratch folder W removed at exit, counts results with ok NAME / no NAME WHY, and draws the
# run's seed S0 (FA_TEST_SEED reproduces a run; else from the clock; printed, last 9 digits).
#   source "$(dirname "$0")/cli_harness.sh" test_cli_x "${1:-build}"
CLI_TEST=$1
BUILD=$2
FA=$(cd "$BUILD" && pwd)/flashattn
NPY=$(cd "$BUILD" && pwd)/tool_npy
for x in "$FA" "$NPY"; do
  [ -x "$x" ] || { echo "missing $x (build first)"; echo "0 passed, 1 failed"; exit 1; }
done
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
no() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
S0=${FA_TEST_SEED:-$(($(date +%s%N) % 1000000000))}
case $S0 in *[!0-9]*|'') echo "FA_TEST_SEED must be a decimal number, got '$S0'"; echo "0 passed, 1 failed"; exit 1 ;; esac
[ ${#S0} -le 9 ] || S0=${S0: -9}
S0=$((10#$S0)) # the tests' file seeds are S0 + 1, S0 + 2, ...
echo "$CLI_TEST: seed $S0 (FA_TEST_SEED=$S0 reproduces)"
