#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ (clang, AddressSanitizer and
# UndefinedBehaviorSanitizer) into build-fuzz/ and runs each for a bounded time from seed
# corpora made from the fixtures (scripts/fuzz_seeds.py). Exits non-zero when a target
# finds a crash, a leak, undefined behaviour, an unexpected exception or a timeout; the
# input that did it is left in build-fuzz/findings/ (turn it into a regression test).
#
#   scripts/fuzz.sh                      every target, OSPREY_FUZZ_SECONDS (default 30) each
#   scripts/fuzz.sh config_fuzz ...      the named targets only
#
# Variables: OSPREY_FUZZ_SECONDS (time per target), OSPREY_FUZZ_BUILD (build folder),
# CXX (default clang++-14).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

secs=${OSPREY_FUZZ_SECONDS:-30}
build=${OSPREY_FUZZ_BUILD:-build-fuzz}
cxx=${CXX:-clang++-14}
command -v "$cxx" >/dev/null || { echo "fuzz: $cxx not found (scripts/setup.sh installs clang-14)" >&2; exit 1; }

t0=$(date +%s)
# The same folder and flags as scripts/sanitize.sh (which adds the unit tests).
cmake -S . -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" -DOSPREY_FUZZ=ON -DOSPREY_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" ${OSPREY_FUZZ_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" --target osprey_fuzzers -j"$(nproc)"
t1=$(date +%s)
echo "fuzz: built in $((t1 - t0)) s"

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in tests/fuzz/*_fuzz.cpp; do targets+=("$(basename "$f" .cpp)"); done
fi

rm -rf "$build/seeds"
python3 scripts/fuzz_seeds.py "$build/seeds"
mkdir -p "$build/findings"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"
  mkdir -p "$corpus"
  log="$build/$t.log"
  # -timeout: one input running longer than 10 s is a finding (a hang); -rss_limit_mb bounds
  # memory (an allocation a file asked for).
  if "$build/$t" "$corpus" "$build/seeds/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
      -max_len=65536 -print_final_stats=1 -artifact_prefix="$build/findings/$t-" >"$log" 2>&1; then
    echo "fuzz: $t: ok ($(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$') runs)"
  else
    echo "fuzz: $t: FAILED (log: $log)" >&2
    tail -40 "$log" >&2
    failed+=("$t")
  fi
done
echo "fuzz: done in $(($(date +%s) - t0)) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in ${failed[*]}: inputs in $build/findings/" >&2
  exit 1
fi
