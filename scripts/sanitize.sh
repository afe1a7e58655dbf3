#!/usr/bin/env bash
# Builds Osprey and its unit tests with AddressSanitizer and UndefinedBehaviorSanitizer (clang,
# CPU only) and runs the suite there. It shares its build folder and flags with
# scripts/fuzz.sh, so the library is compiled once for both. Extra arguments go to ctest
# (e.g. -R CliHostile). Any sanitizer report fails the test that caused it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=${OSPREY_FUZZ_BUILD:-build-fuzz}
cxx=${CXX:-clang++-14}
command -v "$cxx" >/dev/null || { echo "sanitize: $cxx not found (scripts/setup.sh installs clang-14)" >&2; exit 1; }
t0=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" -DOSPREY_FUZZ=ON -DOSPREY_CUDA=OFF -DOSPREY_BUILD_TESTS=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" ${OSPREY_FUZZ_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" --target osprey osprey_tests -j"$(nproc)"
echo "sanitize: built in $(($(date +%s) - t0)) s"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" "$@"
echo "sanitize: done in $(($(date +%s) - t0)) s"
