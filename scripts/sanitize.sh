#!/usr/bin/env bash
# Builds Osprey and its unit tests with AddressSanitizer and UndefinedBehaviorSanitizer into
# build-asan/ (CPU only) and runs the suite there. Extra arguments go to ctest (e.g.
# -R CliHostile). Any sanitizer report fails the run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=${OSPREY_SANITIZE_BUILD:-build-asan}
t0=$(date +%s)
cmake -S . -B "$build" -G Ninja -DOSPREY_SANITIZE=ON -DOSPREY_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" ${OSPREY_SANITIZE_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j"$(nproc)"
echo "sanitize: built in $(($(date +%s) - t0)) s"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" "$@"
echo "sanitize: done in $(($(date +%s) - t0)) s"
