#!/usr/bin/env bash
# FP8 weights on CUDA (backend/cuda/fp8_linear.cu): builds the CUDA tree, runs the FP8 tests
# and the FP8 checkpoints' end-to-end tests, times one linear layer per FP8 path against bf16
# weights (osprey_fp8_linear_bench), then the Llama-3.1-8B shape as a random fp16 checkpoint
# and as its `osprey convert --to fp8` copy (tg128, pp512, batched decode): the FP8 default
# (W8A8 on the tensor cores for 2 rows and more) and the weights kept FP8 without the tensor
# cores (OSPREY_CUDA_FP8_WEIGHTS=1 OSPREY_CUDA_FP8_MMA=0: activations never quantized).
#   scripts/bench_fp8.sh [--tests-only]
# BUILD (default build-cuda) is the build folder, WORK (default /tmp) holds the checkpoints
# (about 16 + 8 GB); the results go to $BUILD/fp8_bench.md. The end-to-end tests write their
# checkpoints with numpy: OSPREY_TEST_PYTHON names an interpreter that has it, when
# /usr/bin/python3 does not.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build-cuda}
work=${WORK:-/tmp}
tests_only=0
[ "${1:-}" = "--tests-only" ] && tests_only=1
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSPREY_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
cmake --build "$build" --target osprey osprey_tests osprey_fp8_linear_bench
ctest --test-dir "$build" -R 'CudaFp8|HubCheckpoint|HubQuant' --output-on-failure
OSPREY_CUDA_FP8_MMA=0 ctest --test-dir "$build" -R 'CudaFp8|HubCheckpoint.*cuda' --output-on-failure
[ "$tests_only" = 1 ] && exit 0
out="$build/fp8_bench.md"
"$build/osprey_fp8_linear_bench" | tee "$out"
[ -d "$work/l8" ] || /usr/bin/python3 tools/make_random_checkpoint.py --preset llama-3.1-8b --dtype float16 --out "$work/l8"
[ -d "$work/l8-fp8" ] || "$build/osprey" convert -m "$work/l8" -o "$work/l8-fp8" --to fp8
for arm in "fp16|$work/l8|" "FP8|$work/l8-fp8|" "FP8 kept without the tensor cores|$work/l8-fp8|OSPREY_CUDA_FP8_WEIGHTS=1 OSPREY_CUDA_FP8_MMA=0"; do
  IFS='|' read -r name m envs <<< "$arm"
  echo "## $name" | tee -a "$out"
  env $envs "$build/osprey" bench -m "$m" --device cuda -p 512 -n 128 -r 3 | tee -a "$out"
  env $envs "$build/osprey" bench -m "$m" --device cuda -p 512 -n 128 -r 1 --batch 1,2,4,8,16,64 | tee -a "$out"
done
