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
