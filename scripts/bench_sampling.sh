#!/usr/bin/env bash
# One visit to the GPU machine for sampling: builds with CUDA, runs the sampler tests (the
# batched device sampler's included) and their timing reports, then, per shape, serves a
# random checkpoint and runs scripts/bench_serving.py with sampled (temperature 0.8, top-p 0.95)
# and greedy requests at each concurrency, and `osprey generate` sampled against greedy.
# Needs the project's Debian packages (scripts/debian-packages.txt) and a folder with the Llama 3
# tokenizer files (tokenizer.json, tokenizer_config.json): TOKENIZER_DIR=... OUT=... bash
# scripts/bench_sampling.sh
# Environment: SHAPES (llama1b llama8b; default llama1b), CONCURRENCY (default 1,64),
# REQUESTS (per level, default 128), PROMPT (512), GEN (128), TEST_FILTER, TESTS=0 / SERVE=0 /
# GENERATE=0 skip a part, OSPREY_BIN (a prebuilt binary: skips the build).
set -uo pipefail
OUT=${OUT:-./device-out}
TOK=${TOKENIZER_DIR:?TOKENIZER_DIR: a folder with the Llama 3 tokenizer.json}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if [ -z "${OSPREY_BIN:-}" ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSPREY_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
  targets="osprey"
  [ "${TESTS:-1}" = 1 ] && targets="osprey osprey_tests"
  time cmake --build build -j"$(nproc)" --target $targets >"$OUT/build.log" 2>&1 ||
    { grep -E 'error' "$OUT/build.log" | head -30; exit 1; }
fi
BIN=${OSPREY_BIN:-build/osprey}
if [ "${TESTS:-1}" = 1 ]; then
  build/osprey_tests --gtest_filter="${TEST_FILTER:-CudaSample*:Sampler*:PagedBackend*:Scheduler*}" \
    >"$OUT/tests.log" 2>&1
  echo "tests exit $?"; grep -E '^\[  (PASSED|FAILED) |^\[  FAILED  \]' "$OUT/tests.log" | head -40
  build/osprey_tests --gtest_also_run_disabled_tests \
    --gtest_filter='CudaSampleRows.DISABLED_Speed:CudaSample.DISABLED_SampleSpeed' 2>&1 | grep -E 'Speed ' |
    tee "$OUT/sampler-speed.txt"
fi

shape_args() {
  case $1 in
    llama1b) echo "--preset llama-3.1-8b --hidden 2048 --layers 16 --heads 32 --kv-heads 8 --intermediate 8192 --head-dim 64 --tie" ;;
    llama8b) echo "--preset llama-3.1-8b" ;;
    *) echo "unknown shape $1" >&2; return 1 ;;
  esac
}

wait_health() {
  for _ in $(seq 1 240); do
    python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=2)" \
      2>/dev/null && return 0
    sleep 0.5
  done
  return 1
}

for shape in ${SHAPES:-llama1b}; do
  ck=/tmp/ck-$shape
  [ -f $ck/config.json ] || python3 tools/make_random_checkpoint.py $(shape_args $shape) --dtype float16 \
    --tokenizer-dir "$TOK" --out $ck >"$OUT/mkckpt-$shape.log" 2>&1 || { tail -5 "$OUT/mkckpt-$shape.log"; continue; }
  if [ "${GENERATE:-1}" = 1 ]; then
    for mode in greedy sampled; do
      flags="--temp 0"
      [ $mode = sampled ] && flags="--temp 0.8 --top-p 0.95 --seed 7"
      for r in 1 2 3; do
        $BIN generate -m $ck --device cuda --token-ids 128000,791,4062,14198,39935 -n 256 --ignore-eos $flags \
          2>&1 >/dev/null | grep -E '^prompt:' | sed "s/^/$shape $mode round $r: /"
      done
    done | tee "$OUT/generate-$shape.txt"
  fi
  if [ "${SERVE:-1}" = 1 ]; then
    port=8090
    $BIN serve -m $ck --device cuda -np 64 --port $port --no-webui >"$OUT/serve-$shape.log" 2>&1 &
    pid=$!
    if wait_health $port; then
      timeout 900 python3 scripts/bench_serving.py --url http://127.0.0.1:$port --concurrency "${CONCURRENCY:-1,64}" \
        --requests "${REQUESTS:-128}" --prompt-tokens "${PROMPT:-512}" --max-tokens "${GEN:-128}" --timeout 120 \
        --out "$OUT/serving-$shape.json" >"$OUT/serving-$shape.md" 2>"$OUT/serving-$shape.err"
      echo "bench_serving exit $?"; cat "$OUT/serving-$shape.md"
    else
      echo "serve did not start"; tail -20 "$OUT/serve-$shape.log"
    fi
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
  fi
  [ "${KEEP:-0}" = 1 ] || rm -rf $ck
done
