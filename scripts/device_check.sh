#!/usr/bin/env bash
# One visit to the GPU machine: build with CUDA, run the test suite (CUDA tests included), a
# compute-sanitizer memcheck of a short pipelined, graph-replayed generation, and benchmarks
# on Llama-3.1-8B-shaped random weights (fp16, and converted to MLX 4-bit g64).
# Logs and results go to $OUT.
# Here: ../shared/device/stage.sh scripts/debian-packages.txt .device (carry .device)
# There: source .device/enter.sh && bash scripts/device_check.sh
# Environment: TEST_FILTER (gtest filter), TESTS=0 / MEMCHECK=0 / BENCH=0 skip a part,
# BENCH_ARGS (osprey bench arguments), QUANT=0 skips the 4-bit conversion and bench,
# PRESETS (make_random_checkpoint presets, default llama-3.1-8b).
set -uo pipefail
OUT=${OUT:-./device-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSPREY_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
time cmake --build build -j"$(nproc)" >"$OUT/build.log" 2>&1 || { grep -E 'error' "$OUT/build.log" | head -30; exit 1; }
if [ "${TESTS:-1}" = 1 ]; then
  # Tokenizer tests need node_modules, which do not travel.
  build/osprey_tests --gtest_filter="${TEST_FILTER:--Tokenizer*}" >"$OUT/tests.log" 2>&1
  echo "tests exit $?"; grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]' "$OUT/tests.log" | head -40
fi
if [ "${MEMCHECK:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck build/osprey generate -m tests/fixtures/models/llama --device cuda \
    --token-ids 5,99,23,311 -n 40 --ignore-eos >"$OUT/memcheck.log" 2>&1
  echo "memcheck exit $?"; tail -3 "$OUT/memcheck.log"
fi
if [ "${BENCH:-1}" = 1 ]; then
  for preset in ${PRESETS:-llama-3.1-8b}; do
    ck=/tmp/$preset
    [ -f $ck/config.json ] || python3 tools/make_random_checkpoint.py --preset $preset --dtype float16 --out $ck >"$OUT/mkckpt-$preset.log" 2>&1 || tail "$OUT/mkckpt-$preset.log"
    for arm in 1 0; do
      OSPREY_KV_INPLACE_WRITE=$arm timeout 200 build/osprey bench -m $ck --device cuda ${BENCH_ARGS:--p 512 -n 128 -d 0,8192 -r 2 --warmup 1} -o md 2>&1 | tee "$OUT/bench-$preset-f16-arm$arm.md" | tail -n +3
    done
    if [ "${MEMORY:-1}" = 1 ]; then
      for arm in 1 0; do
        OSPREY_KV_INPLACE_WRITE=$arm timeout 200 build/osprey bench -m $ck --device cuda -p 0 -n 512 -d 2048 -r 1 --warmup 0 -o md 2>&1 | tee "$OUT/bench-$preset-f16-mem-arm$arm.md" | tail -n +3
      done
    fi
    if [ "${QUANT:-1}" = 1 ]; then
      rm -rf $ck-q4
      ( time build/osprey convert -m $ck -o $ck-q4 --q-bits 4 --q-group-size 64 ) >"$OUT/convert-$preset.log" 2>&1 || tail -5 "$OUT/convert-$preset.log"
      for arm in 1 0; do
        OSPREY_KV_INPLACE_WRITE=$arm timeout 200 build/osprey bench -m $ck-q4 --device cuda ${QBENCH_ARGS:--p 512 -n 128 -d 0,2048 -r 2 --warmup 1} -o md 2>&1 | tee "$OUT/bench-$preset-q4-arm$arm.md" | tail -n +3
      done
    fi
  done
fi
