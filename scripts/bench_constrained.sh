#!/usr/bin/env bash
# Constrained vs unconstrained batched decoding (docs/benchmarks.md, "Constrained decoding"),
# and the token-mask times of a new grammar on this host's CPU.
#
# Usage: scripts/bench_constrained.sh MODEL_DIR [BATCHES]
#   MODEL_DIR needs its tokenizer.json (make_random_checkpoint.py --tokenizer-dir ...).
#   BATCHES   batch sizes, comma-separated (default 1,16)
# Runs ROUNDS rounds (default 3), each the unconstrained `osprey bench --batch` followed by the
# same command with --json-schema tests/fixtures/bench_orders.schema.json, -p 512 -n 128, and
# prints the markdown tables; then osprey_grammar_mask_bench once.
#
# Environment: OSPREY_BIN (default build/osprey), MASK_BENCH (default
# build/osprey_grammar_mask_bench), ROUNDS.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: scripts/bench_constrained.sh MODEL_DIR [BATCHES]}
batches=${2:-1,16}
bin=${OSPREY_BIN:-build/osprey}
mask_bench=${MASK_BENCH:-build/osprey_grammar_mask_bench}
schema=tests/fixtures/bench_orders.schema.json
for round in $(seq "${ROUNDS:-3}"); do
  echo "## round $round: unconstrained"
  "$bin" bench -m "$model" --batch "$batches" -p 512 -n 128
  echo "## round $round: --json-schema $schema"
  "$bin" bench -m "$model" --batch "$batches" -p 512 -n 128 --json-schema "@$schema"
done
echo "## token masks of a new grammar (CPU)"
"$mask_bench"
