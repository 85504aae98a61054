#!/usr/bin/env bash
# What the tests need: a C compiler, CMake and make (gcc's OpenMP runtime comes with gcc),
# and Open MPI's development package for the sequence-parallel component.
# Installs only what is missing, so it is quick on a machine that has them.
set -euo pipefail
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v gcc >/dev/null || need+=(gcc)
command -v make >/dev/null || need+=(make)
# Open MPI for the sequence-parallel component (its tests are skipped without it)
command -v mpicc >/dev/null || need+=(libopenmpi-dev)
command -v mpirun >/dev/null || need+=(openmpi-bin)
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
