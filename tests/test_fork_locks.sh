#!/usr/bin/env bash
# The library takes none of libgomp's process-wide locks (GOMP_atomic_start: GCC's combine of
# two reduction variables; GOMP_critical_*: an OpenMP critical section). A fork taken while
# another thread held one left it held in the child, whose first call hung there (seen: 1
# fork in ~300 with six threads calling; tests/python/test_fork.py). The drivers sum counts
# with integer atomics and serialize progress reports with a lock of the call's own.
# Usage: bash tests/test_fork_locks.sh BUILD_DIR
set -u
lib=${1:-build}/libflashattn.so nm=nm
command -v "$nm" >/dev/null || { echo "no $nm here: skipped"; exit 77; }
[ -e "$lib" ] || { echo "no $lib (a static-only build): skipped"; exit 77; }
found=$("$nm" -D --undefined-only "$lib" | grep -oE 'GOMP_(atomic|critical)[a-z_]*' | sort -u)
if [ -n "$found" ]; then
  echo "FAIL: $lib calls libgomp's process-wide locks: $(echo $found)"
  exit 1
fi
echo "ok   $lib takes none of libgomp's process-wide locks ($("$nm" -D --undefined-only "$lib" | grep -c GOMP_) GOMP symbols, none a lock)"
