#!/usr/bin/env bash
# Checks that llama.cpp loads the GGUF files `osprey convert --to gguf` writes and decodes
# them greedily as Osprey does: the demo model (models/demo) converted to f16, q8_0, q4_0 and
# q4_k, each run by llama.cpp's llama-simple (greedy) and by `osprey generate --temp 0`.
# Usage: scripts/gguf_llamacpp_check.sh LLAMA_CPP_DIR [OSPREY] [WORKDIR]
#   LLAMA_CPP_DIR: a llama.cpp checkout (built here CPU-only, target llama-simple).
set -euo pipefail
LLAMA=${1:?usage: $0 LLAMA_CPP_DIR [OSPREY] [WORKDIR]}
OSPREY=${2:-build/osprey}
WORK=${3:-.gguf-check}
PROMPT="Once upon a time"
N=24
mkdir -p "$WORK"
cmake -S "$LLAMA" -B "$WORK/llama-build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DLLAMA_CURL=OFF >/dev/null
cmake --build "$WORK/llama-build" -j"$(nproc)" --target llama-simple >/dev/null
SIMPLE=$(find "$WORK/llama-build" -name llama-simple -type f | head -1)
status=0
for q in f16 q8_0 q4_0 q4_k; do
  f="$WORK/demo-$q.gguf"
  [ -f "$f" ] || "$OSPREY" convert -m models/demo -o "$f" --to gguf --outtype "$q"
  # llama-simple prints the prompt and its greedy continuation.
  ours=$("$OSPREY" generate -m "$f" --device cpu -p "$PROMPT" -n "$N" --temp 0 --ignore-eos 2>/dev/null)
  theirs=$("$SIMPLE" -m "$f" -n "$N" "$PROMPT" 2>"$WORK/llama-$q.log")
  if [ "$PROMPT$ours" == "$theirs" ] || [ "$ours" == "${theirs#"$PROMPT"}" ]; then
    echo "$q: same text"
  else
    echo "$q: DIFFERENT"; echo "  osprey:    $ours"; echo "  llama.cpp: $theirs"; status=1
  fi
done
exit $status
