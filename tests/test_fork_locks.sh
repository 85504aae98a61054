#!/usr/bin/env bash
# The libraries take none of libgomp's process-wide locks (GOMP_atomic_start: GCC's combine of
# two reduction variables; GOMP_critical_*: an OpenMP critical section). A fork taken while
# another thread held one left it held in the child, whose first call hung there (seen: 1
# fork in ~300 with six threads calling; tests/python/test_fork.py). The drivers sum counts
# with integer atomics and serialize progress reports with a lock of the call's own.
# A build without libgomp (clang's libomp) or without nm is skipped, never passed.
# Usage: bash tests/test_fork_locks.sh BUILD_DIR
set -u -o pipefail
build=${1:-build}
command -v nm >/dev/null || { echo "no nm here: skipped"; exit 77; }
checked=0
for lib in "$build/libflashattn.so" "$build/libflashattn_mpi.so"; do
  [ -e "$lib" ] || continue
  syms=$(nm -D --undefined-only "$lib") || { echo "FAIL: nm cannot read $lib"; exit 1; }
  gomp=$(printf '%s\n' "$syms" | grep -c 'GOMP_')
  [ "$gomp" -gt 0 ] || continue # not built against libgomp: nothing of this to check
  found=$(printf '%s\n' "$syms" | grep -oE 'GOMP_(atomic|critical)[a-z_]*' | sort -u)
  if [ -n "$found" ]; then
    echo "FAIL: $lib calls libgomp's process-wide locks: $(echo $found)"
    exit 1
  fi
  echo "ok   $lib takes none of libgomp's process-wide locks ($gomp GOMP symbols, none a lock)"
  checked=$((checked + 1))
done
[ $checked -gt 0 ] || { echo "no shared library built against libgomp in $build: skipped"; exit 77; }
