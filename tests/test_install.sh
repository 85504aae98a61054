#!/usr/bin/env bash
# C users: `cmake --install` into a temporary prefix, then an external program
# (tests/install/consumer.c) configured and built against it through find_package
# (flashattn::flashattn and flashattn::flashattn_static) and through pkg-config (shared, and
# --static), each run. Usage: test_install.sh BUILD_DIR. Exits 77 (skipped) for sanitizer
# builds: their libraries need the sanitizer runtime linked first into every program.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
if grep -q '^FA_SANITIZE:BOOL=ON' "$build/CMakeCache.txt"; then
  echo "skipped: sanitizer build (the install test runs in the Release build)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" --component dev >/dev/null
for f in include/flashattn.h lib/libflashattn.so lib/libflashattn.a \
         lib/cmake/flashattn/flashattnConfig.cmake lib/pkgconfig/flashattn.pc; do
  [ -e "$prefix/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done

echo "== find_package(flashattn)"
cmake -S "$src/tests/install" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/cm" >/dev/null
"$tmp/cm/consumer_shared"
"$tmp/cm/consumer_static"
# each linked what it says: the shared one loads the installed .so, the static one no .so of ours
# (ldd's output is read whole first: under pipefail, grep -q quitting at its match can
# leave ldd killed by SIGPIPE, a failed pipeline although the line was there)
libs_shared=$(ldd "$tmp/cm/consumer_shared") libs_static=$(ldd "$tmp/cm/consumer_static")
grep -q "$prefix/lib/libflashattn.so" <<<"$libs_shared" || { echo "FAIL: consumer_shared does not load $prefix/lib/libflashattn.so"; exit 1; }
if grep -q libflashattn <<<"$libs_static"; then echo "FAIL: consumer_static loads libflashattn"; exit 1; fi

echo "== find_package(flashattn) from a C++-only project, and without MPI or CUDA findable"
cmake -S "$src/tests/install/cxx" -B "$tmp/cxx" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/cxx" >/dev/null
"$tmp/cxx/consumer_cxx_shared"
"$tmp/cxx/consumer_cxx_static"
# a project of the shared library alone needs neither (the static library's dependencies are
# looked for quietly): configured with both hidden
cmake -S "$src/tests/install" -B "$tmp/nodeps" -DCMAKE_PREFIX_PATH="$prefix" -DSHARED_ONLY=ON \
      -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON \
      -DCMAKE_DISABLE_FIND_PACKAGE_OpenMP=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/nodeps" --target consumer_shared >/dev/null
"$tmp/nodeps/consumer_shared"

echo "== pkg-config flashattn"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
cc=${CC:-cc}
# shellcheck disable=SC2046
$cc -std=c11 -o "$tmp/pc_shared" "$src/tests/install/consumer.c" $(pkg-config --cflags --libs flashattn) -lm
LD_LIBRARY_PATH=$prefix/lib "$tmp/pc_shared"
# the static archive by name (-l: also finds it beside the .so), then its private needs
static_libs=$(pkg-config --static --libs flashattn | sed 's/-lflashattn/-l:libflashattn.a/')
# shellcheck disable=SC2046,SC2086
$cc -std=c11 -o "$tmp/pc_static" "$src/tests/install/consumer.c" $(pkg-config --cflags flashattn) $static_libs -lm
"$tmp/pc_static"
# the MPI part, where this build has it: header, library, CMake target and pkg-config file,
# a consumer built both ways and run on 1 and 2 ranks
if [ -e "$build/libflashattn_mpi.so" ]; then
  for f in include/flashattn_mpi.h lib/libflashattn_mpi.so lib/pkgconfig/flashattn_mpi.pc \
           lib/cmake/flashattn/flashattnMpiTargets.cmake; do
    [ -e "$prefix/$f" ] || { echo "FAIL: $f not installed (the build has MPI)"; exit 1; }
  done
  [ -x "$tmp/cm/consumer_mpi" ] || { echo "FAIL: find_package(flashattn) gave no flashattn::flashattn_mpi"; exit 1; }
  mpicc -std=c11 -o "$tmp/pc_mpi" "$src/tests/install/consumer_mpi.c" $(pkg-config --cflags --libs flashattn_mpi) -lm
  for np in 1 2; do
    for exe in "$tmp/cm/consumer_mpi" "$tmp/pc_mpi"; do
      LD_LIBRARY_PATH=$prefix/lib timeout 120 mpirun --allow-run-as-root --oversubscribe -np $np "$exe"
    done
  done
  libs_mpi=$(LD_LIBRARY_PATH=$prefix/lib ldd "$tmp/pc_mpi")
  grep -q "$prefix/lib/libflashattn_mpi.so" <<<"$libs_mpi" || { echo "FAIL: pc_mpi does not load the installed libflashattn_mpi.so"; exit 1; }
fi
echo "PASS: installed header, libraries, CMake package and pkg-config file"
