#!/usr/bin/env bash
# Every environment variable the library (src/), the Python package (python/) and the CLI
# (tools/) read has a row in docs/environment.md's table: greps for getenv("NAME") and
# os.environ / os.getenv uses with a literal name, and fails naming any variable that has none.
# Usage: bash tests/test_env_documented.sh [BUILD_DIR] (the build is not needed).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DOC=$ROOT/docs/environment.md
[ -f "$DOC" ] || { echo "FAIL: $DOC is missing"; echo "0 passed, 1 failed"; exit 1; }
names=$(cd "$ROOT" && grep -rhoE \
  'getenv\("[A-Za-z_][A-Za-z0-9_]*"\)|os\.(environ\.get|getenv)\(["'"'"'][A-Za-z_][A-Za-z0-9_]*|os\.environ\[["'"'"'][A-Za-z_][A-Za-z0-9_]*' \
  --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' --include='*.cc' --include='*.py' \
  src python tools | sed -E 's/.*[("'"'"'\[]([A-Za-z_][A-Za-z0-9_]*)"?\)?$/\1/' | sort -u)
pass=0 fail=0
[ -n "$names" ] || { echo "FAIL: found no getenv at all (is the pattern broken?)"; echo "0 passed, 1 failed"; exit 1; }
for n in $names; do
  if grep -qE "^\| \`$n\` \|" "$DOC"; then echo "ok   $n"; pass=$((pass + 1))
  else echo "FAIL $n is read (grep -rn '$n' src python tools) but has no row in docs/environment.md"; fail=$((fail + 1)); fi
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
