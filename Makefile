# Thin wrapper over CMake: make, make run, make test, make bench.
MAKEFLAGS += --no-print-directory
JOBS ?= 2
BUILD ?= build
CMAKE_FLAGS ?=

.PHONY: all build run test test-deps bench bench-inference bench-decode-peers bench-targets clean fuzz check-long

all: build

build:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

# The demo: plans the seed's problem, then runs a scaled-down version of it on this CPU.
run: build
	bash tools/demo.sh $(BUILD)

# Installs what the tests need, then builds and runs every test: the Release build once per
# CPU instruction set this machine has, then the whole suite under ASan + UBSan.
test: test-deps
	bash tests/run_all.sh

# The long differential run: FA_CHECK_CASES (default 10000) random forward and as many
# backward configurations against the float64 reference; prints its seed (FA_TEST_SEED); then
# the Python drop-ins against torch's SDPA and jax.nn on 600 random cases each.
check-long: build
	bash tests/check_long.sh $(BUILD)
	bash tests/check_long_python.sh

test-deps:
	bash tests/install_deps.sh

bench: build
	bash bench/run.sh

# The inference shapes (decode vs memory bandwidth and PyTorch, varlen vs padding).
bench-inference: build
	bash bench/inference.sh --record
	bash bench/decode_caches.sh --record

# Issues 20 and 21's speed targets (masks, sinks, dropout, decode caches, shared prefix).
bench-targets: build
	bash bench/targets.sh

# Decode against OpenVINO, ggml, ONNX Runtime and torch (bench/decode_peers.sh; the peers go
# into their own venv, ~/.cache/flashattn/bench-venv).
bench-decode-peers:
	bash bench/decode_peers.sh --record

# libFuzzer on the .npy reader, the CLI parser, the plan and the forward vs the reference
# (clang; FUZZ_SECONDS in all, default 240). See tests/fuzz/run.sh.
fuzz:
	bash tests/fuzz/run.sh

clean:
	rm -rf build build-asan build-fuzz build-tsan
