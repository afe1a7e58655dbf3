#!/usr/bin/env bash
# Builds the quantized CUDA kernels' tests (tests/backend/cuda_quant_test.cpp) with only the
# sources they need, straight through nvcc (no CMake, no full library: minutes less on a fresh
# GPU machine), then runs the tests and, with --bench, the kernel benchmarks (the DISABLED_
# tests of that file) on the current GPU.
#   scripts/bench_cuda_quant.sh [--build-only] [--bench] [--out DIR] [--binary FILE]
# DIR (default build-cuda-quant) holds the objects, the binary and bench.txt / tests.txt;
# --binary runs FILE (an earlier build of this script) instead of building.
# Needs nvcc (CUDA 12.4 or later, sm_90 by default: CUDA_ARCH=86 ... to change it) and gtest.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build-cuda-quant
build_only=0
bench=0
binary=
while [ $# -gt 0 ]; do
  case "$1" in
    --build-only) build_only=1 ;;
    --bench) bench=1 ;;
    --out) out="$2"; shift ;;
    --binary) binary="$2"; shift ;;
    *) echo "bench_cuda_quant.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
arch=${CUDA_ARCH:-90}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
mkdir -p "$out/obj"
if [ -n "$binary" ]; then
  cp "$binary" "$out/cuda_quant_tests"
else
cu_sources=(src/backend/cuda/runtime.cu src/backend/cuda/linear.cu src/backend/cuda/elementwise.cu
            src/backend/cuda/quant_linear.cu src/backend/cuda/quant_mma.cu src/backend/cuda/quant_gemv.cu
            src/backend/cuda/quant_gemv_fast_f16.cu src/backend/cuda/quant_gemv_fast_bf16.cu
            src/backend/cuda/quant_gemv_generic_f16.cu src/backend/cuda/quant_gemv_generic_bf16.cu)
cpp_sources=(src/core/caching_allocator.cpp src/core/env.cpp src/core/log.cpp src/core/dtype.cpp
             tests/backend/cuda_quant_test.cpp)
flags=(-DOSPREY_WITH_CUDA=1 -DOSPREY_CUDA_ARCHITECTURES_BUILT="\"${CUDA_ARCH:-90}\"" -Isrc -Itests -O3 -DNDEBUG -std=c++20 --expt-relaxed-constexpr -lineinfo)
objs=()
pids=()
for src in "${cu_sources[@]}" "${cpp_sources[@]}"; do
  obj="$out/obj/$(echo "$src" | tr / _).o"
  objs+=("$obj")
  if [ "$obj" -nt "$src" ] && [ -z "${FORCE:-}" ]; then continue; fi
  case "$src" in
    *.cu) "$nvcc" "${flags[@]}" -arch=sm_$arch -Xptxas -v -x cu -c "$src" -o "$obj" >"$obj.log" 2>&1 & ;;
    *) "$nvcc" "${flags[@]}" -x c++ -c "$src" -o "$obj" >"$obj.log" 2>&1 & ;;
  esac
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
if [ $status -ne 0 ]; then
  grep -l -E "error" "$out"/obj/*.log | xargs -r cat >&2
  exit 1
fi
"$nvcc" -arch=sm_$arch "${objs[@]}" -o "$out/cuda_quant_tests" -lgtest -lgtest_main -lcublas -lpthread
grep -h -E "Compiling entry|registers|spill" "$out"/obj/src_backend_cuda_quant_mma.cu.o.log >"$out/registers.txt" || true
fi
[ $build_only -eq 1 ] && exit 0
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv,noheader | tee "$out/gpu.txt"
set +e
"$out/cuda_quant_tests" --gtest_filter='CudaQuant.*' 2>&1 | tee "$out/tests.txt" | grep -E "^\[  (FAILED|PASSED|  OK) |Failure|error|Expected|Which is|rel" | head -80
tstatus=${PIPESTATUS[0]}
if [ $bench -eq 1 ]; then
  "$out/cuda_quant_tests" --gtest_also_run_disabled_tests \
      --gtest_filter='CudaQuant.DISABLED_QuantKernelsByRows' 2>&1 |
    tee "$out/bench.txt"
fi
exit $tstatus
