#!/usr/bin/env bash
# Checks that llama.cpp loads the GGUF files `osprey convert --to gguf` writes and decodes
# them greedily as Osprey does: the demo model (models/demo) converted to f16, q8_0, q4_0 and
# q4_k, and (with llama-quantize) llama.cpp's own quantizations of the f16 file, each run by
# llama.cpp and by `osprey generate --temp 0` on several prompts.
#
# Token ids are compared, not text: llama.cpp's ids are those its llama-completion evaluated,
# read back from the session file it saves with --prompt-cache FILE --prompt-cache-all (a u32
# magic 'ggsn', a u32 version, a u32 count, then the int32 ids: prompt with BOS, then every
# generated token). llama-simple (greedy) is also run on each file as a plain load check, and
# its text compared with Osprey's.
#
# Usage: scripts/gguf_llamacpp_check.sh [LLAMA_CPP_DIR] [OSPREY] [WORKDIR]
#   LLAMA_CPP_DIR: a llama.cpp checkout, built here CPU-only (targets llama-simple,
#                  llama-completion, llama-quantize). Not needed when LLAMA_BUILD is set.
#   LLAMA_BUILD:   (environment) an already built llama.cpp build folder (holding bin/);
#                  nothing is built then.
#   QUANTS:        (environment) llama-quantize types made from the f16 file and checked too
#                  (default "Q4_K_M Q5_K_M Q6_K Q8_0 Q4_0 Q4_1 Q5_0 Q5_1"; "" for none).
#   N:             (environment) tokens generated per prompt (default 32).
# Prints one line per file and prompt, then a table; exits 1 when a file fails to load or
# Osprey's ids differ from llama.cpp's on an Osprey-written file.
set -euo pipefail
LLAMA=${1:-}
OSPREY=$(realpath "${2:-build/osprey}")
WORK=${3:-.gguf-check}
N=${N:-32}
QUANTS=${QUANTS-"Q4_K_M Q5_K_M Q6_K Q8_0 Q4_0 Q4_1 Q5_0 Q5_1"}
PROMPTS=("Once upon a time" "It is a truth universally acknowledged" "Mr. Darcy said that"
         "The weather was" "Elizabeth could not help")
mkdir -p "$WORK"
if [ -n "${LLAMA_BUILD:-}" ]; then
  BIN="$LLAMA_BUILD/bin"
else
  [ -n "$LLAMA" ] || { echo "usage: $0 LLAMA_CPP_DIR [OSPREY] [WORKDIR] (or LLAMA_BUILD=DIR $0 '' ...)" >&2; exit 2; }
  cmake -S "$LLAMA" -B "$WORK/llama-build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DLLAMA_CURL=OFF >/dev/null
  cmake --build "$WORK/llama-build" -j"$(nproc)" --target llama-simple llama-completion llama-quantize >/dev/null
  BIN="$WORK/llama-build/bin"
fi
THREADS=${THREADS:-$(nproc)}

files=()
for q in f16 q8_0 q4_0 q4_k; do
  f="$WORK/demo-$q.gguf"
  [ -f "$f" ] || "$OSPREY" convert -m models/demo -o "$f" --to gguf --outtype "$q" >/dev/null
  files+=("osprey:$q:$f")
done
for t in $QUANTS; do
  f="$WORK/demo-lq-$t.gguf"
  [ -f "$f" ] || "$BIN/llama-quantize" "$WORK/demo-f16.gguf" "$f" "$t" >"$WORK/quantize-$t.log" 2>&1
  files+=("llama-quantize:$t:$f")
done

# llama.cpp's ids: prompt (with BOS) and generated, from llama-completion's session file.
llama_ids() {
  local f=$1 p=$2 s="$WORK/session.bin"
  rm -f "$s"
  "$BIN/llama-completion" -m "$f" -p "$p" -n "$N" --temp 0 --top-k 1 -no-cnv --ignore-eos -t "$THREADS" \
    --prompt-cache "$s" --prompt-cache-all >/dev/null 2>"$WORK/completion.log" || { cat "$WORK/completion.log" >&2; return 1; }
  python3 - "$s" <<'PY'
import json, struct, sys
d = open(sys.argv[1], "rb").read()
magic, version, n = struct.unpack("<III", d[:12])
assert magic == 0x6767736E, hex(magic)
print(json.dumps(list(struct.unpack(f"<{n}i", d[12:12 + 4 * n]))))
PY
}

status=0
: > "$WORK/results.tsv"
for entry in "${files[@]}"; do
  IFS=: read -r src q f <<<"$entry"
  for p in "${PROMPTS[@]}"; do
    ours=$("$OSPREY" generate -m "$f" --device cpu -t "$THREADS" -p "$p" -n "$N" --temp 0 --ignore-eos --json 2>"$WORK/osprey.log") \
      || { echo "$src $q: OSPREY FAILED"; cat "$WORK/osprey.log"; status=1; continue; }
    if ! theirs=$(llama_ids "$f" "$p"); then echo "$src $q: LLAMA.CPP FAILED"; status=1; continue; fi
    text=$("$BIN/llama-simple" -m "$f" -n "$N" "$p" 2>"$WORK/simple.log") || { echo "$src $q: llama-simple FAILED"; status=1; }
    line=$(python3 - "$ours" "$theirs" "$text" "$p" <<'PY'
import json, sys
o = json.loads(sys.argv[1]); t = json.loads(sys.argv[2]); text, prompt = sys.argv[3], sys.argv[4]
op, og = o["prompt_tokens"], o["tokens"]
tp, tg = t[:len(op)], t[len(op):]
same = 0
while same < min(len(og), len(tg)) and og[same] == tg[same]: same += 1
# llama-simple prints the prompt's tokens (BOS's text included) then the continuation.
stext = text.endswith(prompt + o["text"]) or text.endswith(o["text"])
print(f"{'yes' if op == tp else 'no'}\t{same}\t{len(og)}\t{'yes' if stext else 'no'}\t{json.dumps(og)}\t{json.dumps(tg)}")
PY
)
    IFS=$'\t' read -r psame same n stext og tg <<<"$line"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$src" "$q" "$p" "$psame" "$same" "$n" "$stext" >> "$WORK/results.tsv"
    echo "$src $q \"$p\": prompt ids same: $psame, generated ids same: $same/$n, llama-simple text same: $stext"
    if [ "$same" != "$n" ]; then
      echo "  osprey:    $og"; echo "  llama.cpp: $tg"
      [ "$src" = osprey ] && status=1
    fi
  done
done
echo
echo "| file | made by | prompts with all $N ids the same | first differing step (per prompt) | llama-simple text same |"
echo "| --- | --- | ---: | --- | ---: |"
python3 - "$WORK/results.tsv" <<'PY'
import sys, collections
rows = collections.OrderedDict()
for l in open(sys.argv[1]):
    src, q, p, psame, same, n, stext = l.rstrip("\n").split("\t")
    rows.setdefault((src, q), []).append((int(same), int(n), stext == "yes", psame == "yes"))
for (src, q), r in rows.items():
    full = sum(s == n for s, n, _, _ in r)
    first = ", ".join("-" if s == n else str(s) for s, n, _, _ in r)
    print(f"| {q} | {src} | {full}/{len(r)} | {first} | {sum(t for *_, t, _ in r)}/{len(r)} |")
PY
exit $status
