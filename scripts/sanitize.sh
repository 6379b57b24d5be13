#!/usr/bin/env bash
# Builds the C++ core and its tests with AddressSanitizer and UndefinedBehaviorSanitizer (no Python module, no CUDA)
# and runs CTest there. Any sanitizer report fails the run: ASan aborts on the first error, UBSan is made fatal.
# Needs the packages scripts/setup.sh installs (compiler, CMake, Ninja, GoogleTest, Eigen, spdlog).
#   bash scripts/sanitize.sh            # build-asan/, then ctest
set -euo pipefail
cd "$(dirname "$0")/.."
build=${DYNACP_ASAN_BUILD:-build-asan}
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDYNACP_BUILD_PYTHON=OFF -DDYNACP_BUILD_TESTS=ON \
      -DDYNACP_BUILD_BENCHMARKS=OFF -DDYNACP_CUDA=OFF \
      -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$build" -j"$(nproc)"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# The fuzz target runs 300 instances in CTest; instrumented it is ~10x slower, so it runs a shorter sample here. The
# exhaustive comparison with the optimum (about 3 minutes uninstrumented) is left to the plain CTest run; its small
# hand-checked cases and the local search's own test still run here.
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" \
      -E '^(fuzz_plans_(extended_|links_|ring_sets_)?short|Exhaustive\.DynacpNearOptimumAndNothingBelowTheBound)$'
# The fuzz under the sanitizers, smaller than CTest's runs (about ten times slower here): plain, random links, ring sets.
"$build/tests/cpp/fuzz_plans" --instances "${DYNACP_ASAN_FUZZ:-40}" --seed 7
"$build/tests/cpp/fuzz_plans" --instances "${DYNACP_ASAN_FUZZ_LINKS:-15}" --seed 13 --links 1
"$build/tests/cpp/fuzz_plans" --instances "${DYNACP_ASAN_FUZZ_RINGS:-10}" --seed 17 --ring-sets 1
