#!/usr/bin/env bash
# On the GPU machine: builds with CUDA for the local card and runs the whole test suite (CUDA
# tests included), then the samplers' timing reports. Results under OUT: build.log, ctest.log,
# failed.txt (the failing tests' names), failed-logs.txt (their output), sampler-speed.txt.
# Environment: OUT (default ./device-out), JOBS (ctest parallelism, default 8), CTEST_TIMEOUT
# (per test, default 120 s), ARCH (default 90).
set -uo pipefail
OUT=${OUT:-./device-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSPREY_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="${ARCH:-90}" >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
start=$(date +%s)
cmake --build build -j"$(nproc)" --target osprey osprey_tests >"$OUT/build.log" 2>&1 ||
  { grep -E 'error' "$OUT/build.log" | head -30; exit 1; }
echo "build $(( $(date +%s) - start )) s"
start=$(date +%s)
ctest --test-dir build -j"${JOBS:-8}" --timeout "${CTEST_TIMEOUT:-120}" -E 'WebUiBrowser' >"$OUT/ctest.log" 2>&1
echo "ctest exit $? in $(( $(date +%s) - start )) s"
grep -E 'tests passed|tests failed' "$OUT/ctest.log"
grep -E '^\s+[0-9]+ - ' "$OUT/ctest.log" | sed -E 's/^\s+[0-9]+ - //; s/ \(.*//' >"$OUT/failed.txt"
head -40 "$OUT/failed.txt"
if [ -s "$OUT/failed.txt" ]; then
  timeout 90 build/osprey_tests --gtest_filter="$(paste -sd: "$OUT/failed.txt")" >"$OUT/failed-logs.txt" 2>&1
fi
timeout 120 build/osprey_tests --gtest_also_run_disabled_tests \
  --gtest_filter='CudaSampleRows.DISABLED_Speed:CudaSample.DISABLED_SampleSpeed' 2>&1 | grep -E 'Speed |us' |
  tee "$OUT/sampler-speed.txt"
