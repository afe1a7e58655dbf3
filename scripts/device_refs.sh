#!/usr/bin/env bash
# On the GPU machine (torch, transformers and sentence-transformers there): the references that
# need them, each part under OUT as an archive to unpack at the repository root or to copy.
#   EMBED=1     tests/fixtures/models/{qwen3,llama}-embedding/reference_st.json
#               (tools/st_embedding_reference.py) -> OUT/st-refs.tar.gz
#   FAMILIES=.. tools/make_fixtures.py for these families (default the mixtures of experts and
#               Gemma 3 with images) -> OUT/fixtures.tar.gz (one folder per family)
#   DRAFT=1     the draft model of models/demo (tools/train_demo_model.py --arch draft; needs
#               .demo_data/text from tools/demo_data.py, carried) -> OUT/demo_draft_model.tar
set -uo pipefail
OUT=${OUT:-./device-out}
mkdir -p "$OUT"
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name(0))" |
  tee "$OUT/versions.txt"
if [ "${EMBED:-1}" = 1 ]; then
  PYTHONUNBUFFERED=1 timeout 120 python3 tools/st_embedding_reference.py tests/fixtures/models/qwen3-embedding \
    tests/fixtures/models/llama-embedding >"$OUT/st.log" 2>&1
  echo "st_embedding_reference exit $?"; tail -4 "$OUT/st.log"
  tar -czf "$OUT/st-refs.tar.gz" tests/fixtures/models/*/reference_st.json 2>/dev/null
fi
families=${FAMILIES-qwen3-moe,qwen3-moe-128,mixtral,gemma3,gemma3-mm}
if [ -n "$families" ]; then
  (cd tools && PYTHONUNBUFFERED=1 timeout "${FIXTURE_TIMEOUT:-400}" python3 make_fixtures.py --out /tmp/fx \
    --families "$families") >"$OUT/fixtures.log" 2>&1
  echo "make_fixtures exit $?"; tail -20 "$OUT/fixtures.log"
  tar -czf "$OUT/fixtures.tar.gz" -C /tmp/fx .
fi
if [ "${DRAFT:-0}" = 1 ]; then
  PYTHONUNBUFFERED=1 python3 tools/train_demo_model.py --data .demo_data/text --out /tmp/draft --arch draft \
    --tokenizer models/demo --work /tmp/demo_draft_work --train-until "${TRAIN_UNTIL:-245}" >"$OUT/draft.log" 2>&1
  echo "train_demo_model exit $?"; tail -25 "$OUT/draft.log"
  cp /tmp/draft/demo_draft_model.tar /tmp/draft/report.json /tmp/draft/reference.json "$OUT/" 2>/dev/null
fi
