#!/usr/bin/env bash
# Every test: Release build (with CUDA compiled where nvcc exists), the suite once per CPU
# instruction set this machine supports (FA_ISA), then an ASan + UBSan build, run the same way.
# So every row of the shared case list (tests/cases.h) runs on every ISA; test_cuda runs it
# on a device where there is one.
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
    # the kernels' correctness and count tests again; the CLI (calibrate included: it tests flags,
    # caching and predictions, and under ASan it alone took 2-7 min an ISA), install and MPI CLI
    # tests do not depend on the ISA
    FA_ISA=$isa ctest --test-dir build --output-on-failure -j "$JOBS" -E 'test_cli|test_calibrate|test_cuda|test_install|test_mpi_cli'
  fi
done

echo "== AddressSanitizer + UndefinedBehaviorSanitizer build"
# (with the allocation-failure hook: tests/alloc/ fail every allocation in turn)
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DFA_SANITIZE=ON -DFA_CUDA=OFF \
  -DCMAKE_C_FLAGS_DEBUG="-O1 -g" -DFA_ALLOC_FAILURE_INJECTION=ON >/dev/null
cmake --build build-asan -j "$JOBS"
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
first=1
for isa in $isas; do
  echo "== sanitized ctest with FA_ISA=$isa"
  if [ $first = 1 ]; then
    FA_ISA=$isa ctest --test-dir build-asan --output-on-failure -j "$JOBS"
    first=0
  else
    FA_ISA=$isa ctest --test-dir build-asan --output-on-failure -j "$JOBS" -E 'test_cli|test_calibrate|test_cuda|test_install|test_mpi_cli'
  fi
done

# ThreadSanitizer on the threaded CPU paths (test_threads: forward and backward with 2-4
# threads, progress callbacks). GCC's libgomp is not instrumented, so this build uses clang
# with LLVM's OpenMP runtime; libomp loads LLVM's Archer tool (libarcher), which tells TSan
# about OpenMP's barriers, reductions and critical sections. libomp itself is still not
# instrumented: its own bookkeeping (memset/malloc/mutex calls made inside the runtime on the
# runtime's buffers, e.g. ___kmp_free of a reduction buffer) shows as races unless TSan
# ignores calls made by non-instrumented modules, which ignore_noninstrumented_modules does
# (Archer asks for it). Every access made by flashattn's code is still checked: forward.c
# with all threads sharing one scratch slice is reported at once (README, "Fuzzing and
# sanitizers"). No report is suppressed by name.
echo "== ThreadSanitizer build (clang, LLVM OpenMP + Archer): test_threads"
CC=clang cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DFA_TSAN=ON -DFA_CUDA=OFF \
  -DCMAKE_C_FLAGS_DEBUG="-O1 -g" >/dev/null
cmake --build build-tsan -j "$JOBS" --target test_threads
TSAN_OPTIONS="ignore_noninstrumented_modules=1 halt_on_error=1" ./build-tsan/test_threads

# The Python package: built and installed into the test environment by pip (the same CMake
# build, through scikit-build-core; build isolation off, the environment has the backend),
# then its suite. The installed package is what runs: no FLASHATTN_LIBDIR, no source path.
VENV=${FA_VENV:-$HOME/.cache/flashattn/venv}
echo "== Python: pip install . into $VENV"
time "$VENV/bin/pip" install -q --no-build-isolation --no-deps --force-reinstall .
echo "== Python: pytest tests/python"
(cd tests/python && env -u FLASHATTN_LIBDIR -u PYTHONPATH "$VENV/bin/python" -m pytest -q -rs -p no:cacheprovider .)
