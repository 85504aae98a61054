#!/usr/bin/env bash
# What the tests need: a C compiler, CMake and make (gcc's OpenMP runtime comes with gcc),
# Open MPI's development package for the sequence-parallel component, and for the
# ThreadSanitizer build clang with LLVM's OpenMP runtime (libomp-dev).
# Installs only what is missing, so it is quick on a machine that has them.
set -euo pipefail
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v gcc >/dev/null || need+=(gcc)
command -v make >/dev/null || need+=(make)
# Open MPI for the sequence-parallel component (its tests are skipped without it)
command -v mpicc >/dev/null || need+=(libopenmpi-dev)
command -v mpirun >/dev/null || need+=(openmpi-bin)
command -v clang >/dev/null || need+=(clang)
if command -v clang >/dev/null; then
  # clang finds omp.h in its own resource directory only when libomp-dev is installed
  echo '#include <omp.h>
int main(void) { return omp_get_max_threads() < 1; }' |
    clang -fopenmp -x c - -o /dev/null 2>/dev/null || need+=(libomp-dev)
else
  need+=(libomp-dev)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need[@]}"
fi

# The Python suite's virtual environment (tests/python/requirements.txt): created when
# missing, filled only when a requirement is missing (a metadata look-up, no imports, so a
# ready environment costs well under a second).
VENV=${FA_VENV:-$HOME/.cache/flashattn/venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv --help >/dev/null 2>&1 || {
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq python3-venv
  }
  echo "creating the Python test environment $VENV"
  python3 -m venv "$VENV"
fi
req="$(dirname "$0")/python/requirements.txt"
if ! "$VENV/bin/python" - "$req" <<'PY'
import re, sys
from importlib import metadata
missing = []
for line in open(sys.argv[1]):
    name = re.split(r"[<>=!~;\[ ]", line.split("#")[0].strip())[0]
    if name:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
if missing:
    print("missing from the Python test environment:", *missing)
    sys.exit(1)
PY
then
  "$VENV/bin/pip" install -q -r "$req"
fi
