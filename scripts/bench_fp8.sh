#!/usr/bin/env bash
# FP8 weights on CUDA (backend/cuda/fp8_linear.cu): builds the CUDA tree, runs the FP8 tests
# and the FP8 checkpoints' end-to-end tests, then times the Llama-3.1-8B shape as a random
# fp16 checkpoint and as its `osprey convert --to fp8` copy (tg128, pp512, and batched decode).
#   scripts/bench_fp8.sh [--tests-only]
# BUILD (default build-cuda) is the build folder, WORK (default /tmp) holds the checkpoints
# (about 16 + 8 GB); the results go to $BUILD/fp8_bench.md.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build-cuda}
work=${WORK:-/tmp}
tests_only=0
[ "${1:-}" = "--tests-only" ] && tests_only=1
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSPREY_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
cmake --build "$build" --target osprey osprey_tests
ctest --test-dir "$build" -R 'CudaFp8|HubCheckpoint' --output-on-failure
[ "$tests_only" = 1 ] && exit 0
[ -d "$work/l8" ] || /usr/bin/python3 tools/make_random_checkpoint.py --preset llama-3.1-8b --dtype float16 --out "$work/l8"
[ -d "$work/l8-fp8" ] || "$build/osprey" convert -m "$work/l8" -o "$work/l8-fp8" --to fp8
out="$build/fp8_bench.md"
: > "$out"
for m in "$work/l8" "$work/l8-fp8"; do
  echo "## $m" | tee -a "$out"
  "$build/osprey" bench -m "$m" --device cuda -p 512 -n 128 | tee -a "$out"
  "$build/osprey" bench -m "$m" --device cuda -p 512 -n 128 --batch 1,16,64 | tee -a "$out"
done
