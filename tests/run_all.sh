#!/usr/bin/env bash
# Every test: Release build (with CUDA compiled where nvcc exists), the suite once per CPU
# instruction set this machine supports (FA_ISA), then an ASan + UBSan build, run the same way.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$JOBS"

isas=$(./build/tool_isas)
echo "== CPU instruction sets available here: $isas"
first=1
for isa in $isas; do
  echo "== ctest with FA_ISA=$isa"
  if [ $first = 1 ]; then
    FA_ISA=$isa ctest --test-dir build --output-on-failure -j "$JOBS"
    first=0
  else
    # the kernels' correctness and count tests again; the CLI and install tests do not depend on the ISA
    FA_ISA=$isa ctest --test-dir build --output-on-failure -j "$JOBS" -E 'test_cli|test_cuda|test_mpi_cli|test_install'
  fi
done

echo "== AddressSanitizer + UndefinedBehaviorSanitizer build"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DFA_SANITIZE=ON -DFA_CUDA=OFF \
  -DCMAKE_C_FLAGS_DEBUG="-O1 -g" >/dev/null
cmake --build build-asan -j "$JOBS"
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
first=1
for isa in $isas; do
  echo "== sanitized ctest with FA_ISA=$isa"
  if [ $first = 1 ]; then
    FA_ISA=$isa ctest --test-dir build-asan --output-on-failure -j "$JOBS"
    first=0
  else
    FA_ISA=$isa ctest --test-dir build-asan --output-on-failure -j "$JOBS" -E 'test_cli|test_cuda|test_mpi_cli|test_install'
  fi
done

# The Python package: built and installed into the test environment by pip (the same CMake
# build, through scikit-build-core; build isolation off, the environment has the backend),
# then its suite. The installed package is what runs: no FLASHATTN_LIBDIR, no source path.
VENV=${FA_VENV:-$HOME/.cache/flashattn/venv}
echo "== Python: pip install . into $VENV"
time "$VENV/bin/pip" install -q --no-build-isolation --no-deps --force-reinstall .
echo "== Python: pytest tests/python"
(cd tests/python && env -u FLASHATTN_LIBDIR -u PYTHONPATH "$VENV/bin/python" -m pytest -q -rs -p no:cacheprovider .)
