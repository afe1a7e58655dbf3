#!/usr/bin/env bash
# One visit to the GPU machine: build with CUDA, run the test suite (CUDA tests included),
# a compute-sanitizer memcheck of a short generation, and a first benchmark on
# Llama-3.1-8B-shaped fp16 random weights. Logs and results go to $OUT.
# Here: ../shared/device/stage.sh scripts/debian-packages.txt .device (carry .device)
# There: source .device/enter.sh && bash scripts/device_check.sh
set -uo pipefail
OUT=${OUT:-./device-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSPREY_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
time cmake --build build -j"$(nproc)" >"$OUT/build.log" 2>&1 || { grep -E 'error' "$OUT/build.log" | head -30; exit 1; }
# Tokenizer tests need node_modules, which do not travel.
build/osprey_tests --gtest_filter="${TEST_FILTER:--Tokenizer*}" >"$OUT/tests.log" 2>&1
echo "tests exit $?"; grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/tests.log" | head -40
if command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck build/osprey generate -m tests/fixtures/models/llama --device cuda \
    --token-ids 5,99,23,311 -n 40 --ignore-eos >"$OUT/memcheck.log" 2>&1
  echo "memcheck exit $?"; tail -3 "$OUT/memcheck.log"
fi
if [ "${BENCH:-1}" = 1 ]; then
  python3 tools/make_random_checkpoint.py --preset llama-3.1-8b --dtype float16 --out /tmp/llama8b >"$OUT/mkckpt.log" 2>&1 || tail "$OUT/mkckpt.log"
  for arm in 1 0; do
    OSPREY_KV_INPLACE_WRITE=$arm timeout 150 build/osprey bench -m /tmp/llama8b --device cuda ${BENCH_ARGS:--p 512 -n 128 -d 0,2048 -r 2 --warmup 1} -o md 2>&1 | tee "$OUT/bench-8b-arm$arm.md"
  done
fi
