#!/usr/bin/env bash
# AMX-INT8 prompts on the CPU (docs/design.md, "AMX-INT8"): the tests that run only on a CPU with
# AMX, then Osprey with OSPREY_CPU_AMX=1 against itself without it and against llama.cpp on the
# same GGUF files (scripts/bench_gguf.sh, alternating in each round, pinned to physical cores).
#
# Usage: scripts/bench_cpu_amx.sh OUT_DIR
#
# From the repository root: builds the CPU tree in build-cpu (osprey, osprey_tests,
# osprey_stream_read), runs the quantized-linear tests with OSPREY_CPU_AMX=1 (an error where
# the CPU or OS lacks AMX), builds llama.cpp's llama-bench and llama-quantize from LLAMA_SRC
# (CPU only, native) when given, and runs bench_gguf.sh with DEVICE=cpu. Results under OUT_DIR:
# tests.log, and bench_gguf.sh's summary.md / summary.json / raw/ under OUT_DIR/gguf-cpu.
#
# Environment:
#   LLAMA_SRC      a llama.cpp source folder: its llama-quantize makes the quantized files (without
#                  it, TYPES may hold only F16, or the files must exist in FILES_DIR)
#   TOKENIZER_DIR  a Llama 3.x tokenizer folder (tokenizer.json, tokenizer_config.json), needed
#                  for GGUF files llama.cpp loads
#   TYPES, REPS, THREADS  passed to bench_gguf.sh (default "Q4_0 Q4_K_M", 5, "16 4")
set -euo pipefail

if [[ $# -ne 1 || $1 == -h || $1 == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit $(( $# != 1 ? 2 : 0 ))
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT_DIR=$(mkdir -p "$1" && cd "$1" && pwd)
LLAMA_SRC=${LLAMA_SRC:-}
[[ -z $LLAMA_SRC || -f $LLAMA_SRC/CMakeLists.txt ]] || { echo "bench_cpu_amx.sh: LLAMA_SRC=$LLAMA_SRC has no CMakeLists.txt" >&2; exit 1; }
cd "$ROOT"
cmake -S . -B build-cpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSPREY_CUDA=OFF >"$OUT_DIR/cmake.log"
cmake --build build-cpu --target osprey osprey_tests osprey_stream_read >"$OUT_DIR/build.log"
status=0
OSPREY_CPU_AMX=1 build-cpu/osprey_tests --gtest_filter='QuantLinear*:*/QuantLinear.*:*CpuAmx*:*BatchInvariant*:QuantReference*' \
  >"$OUT_DIR/tests.log" 2>&1 || status=$?
echo "bench_cpu_amx.sh: tests exit $status" >&2
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]' "$OUT_DIR/tests.log" >&2 || true
llama_build=
if [[ -n $LLAMA_SRC ]]; then
  llama_build=$OUT_DIR/llama-build
  cmake -S "$LLAMA_SRC" -B "$llama_build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_SERVER=OFF >"$OUT_DIR/llama-cmake.log"
  cmake --build "$llama_build" --target llama-bench llama-quantize >"$OUT_DIR/llama-build.log"
fi
amx_bin=$OUT_DIR/osprey-amx
printf '#!/bin/sh\nOSPREY_CPU_AMX=1 exec %s "$@"\n' "$ROOT/build-cpu/osprey" >"$amx_bin"
chmod +x "$amx_bin"
DEVICE=cpu TYPES=${TYPES:-Q4_0 Q4_K_M} REPS=${REPS:-5} THREADS=${THREADS:-16 4} LLAMA_BUILD=$llama_build \
  OSPREY_BIN=$amx_bin OSPREY_BASE_BIN=$ROOT/build-cpu/osprey STREAM_BIN=$ROOT/build-cpu/osprey_stream_read \
  bash scripts/bench_gguf.sh "$OUT_DIR/gguf-cpu"
exit $status
