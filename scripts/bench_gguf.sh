#!/usr/bin/env bash
# Osprey and llama.cpp on the same GGUF files, side by side (docs/gguf.md, "Speed").
#
# Usage: scripts/bench_gguf.sh OUT_DIR
#
# From the repository root, after `cmake --build build` (osprey):
#  1. makes a random fp16 checkpoint of SHAPE (tools/make_random_checkpoint.py, with the
#     tokenizer of TOKENIZER_DIR), writes it as one F16 GGUF (`osprey convert --to gguf`), and
#     quantizes that with llama.cpp's llama-quantize to each type of TYPES, unless the files
#     exist in FILES_DIR;
#  2. runs REPS rounds; each round runs, per type (and thread count on the CPU), `osprey bench`
#     on the file and then (where LLAMA_BUILD has llama-bench) `llama-bench` on the same file,
#     so the two engines alternate and share the machine's drifts (and OSPREY_BASE_BIN, an
#     earlier build, in the same rounds: a before/after in one visit); on the CPU all are pinned
#     (taskset) to the first T physical cores, and the read bandwidth is measured first at 1, 4,
#     every physical core and each count of THREADS (STREAM_BIN);
# and writes OUT_DIR/summary.md and summary.json (per test: each engine's median t/s with its
# min-max spread over the rounds and their ratio) and the raw json under OUT_DIR/raw/.
#
# Environment:
#   DEVICE         cuda or cpu (default cuda)
#   SHAPE          llama8b (Llama-3.1-8B) or llama1b (Llama-3.2-1B) (default: llama8b on cuda,
#                  llama1b on cpu)
#   TYPES          llama-quantize types and F16 (default "Q4_K_M Q4_0 Q8_0 F16")
#   THREADS        CPU thread counts (default "4 16"; ignored on cuda)
#   REPS           rounds (default 3)
#   PP, TG         prompt and generated tokens (default 512 and 128 on cuda, 128 and 32 on cpu)
#   LLAMA_BUILD    a llama.cpp build folder holding bin/llama-quantize (needed for the quantized
#                  types) and bin/llama-bench (optional: without it only Osprey runs)
#   LLAMA_ARGS     extra llama-bench arguments (default "-ngl 99 -fa 1" on cuda, "-ngl 0" on cpu)
#   TOKENIZER_DIR  a folder with the shape's tokenizer.json and tokenizer_config.json (Llama 3.x)
#   FILES_DIR      where the checkpoint and the GGUF files are made or found (default OUT_DIR/files)
#   OSPREY_BIN     the osprey binary (default build/osprey)
#   OSPREY_BASE_BIN  another osprey binary to time in the same rounds (default: none)
#   STREAM_BIN     the read-bandwidth probe (default build/osprey_stream_read; cpu only, skipped
#                  when absent)
#   PYTHON         a python3 with numpy (default python3)
set -euo pipefail

if [[ $# -ne 1 || $1 == -h || $1 == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit $(( $# != 1 ? 2 : 0 ))
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT_DIR=$1
DEVICE=${DEVICE:-cuda}
case $DEVICE in
  cuda) SHAPE=${SHAPE:-llama8b}; PP=${PP:-512}; TG=${TG:-128}; LLAMA_ARGS=${LLAMA_ARGS:--ngl 99 -fa 1}; THREADS=0 ;;
  cpu) SHAPE=${SHAPE:-llama1b}; PP=${PP:-128}; TG=${TG:-32}; LLAMA_ARGS=${LLAMA_ARGS:--ngl 0}; THREADS=${THREADS:-4 16} ;;
  *) echo "bench_gguf.sh: DEVICE=$DEVICE is not cuda or cpu" >&2; exit 2 ;;
esac
TYPES=${TYPES:-Q4_K_M Q4_0 Q8_0 F16}
REPS=${REPS:-3}
LLAMA_BUILD=${LLAMA_BUILD:-}
TOKENIZER_DIR=${TOKENIZER_DIR:-}
FILES_DIR=${FILES_DIR:-$OUT_DIR/files}
OSPREY_BIN=${OSPREY_BIN:-$ROOT/build/osprey}
OSPREY_BASE_BIN=${OSPREY_BASE_BIN:-}
STREAM_BIN=${STREAM_BIN:-$ROOT/build/osprey_stream_read}
PYTHON=${PYTHON:-python3}

[[ -x $OSPREY_BIN ]] || { echo "bench_gguf.sh: no osprey binary at $OSPREY_BIN (cmake --build build, or set OSPREY_BIN)" >&2; exit 1; }
[[ -z $OSPREY_BASE_BIN || -x $OSPREY_BASE_BIN ]] || { echo "bench_gguf.sh: OSPREY_BASE_BIN=$OSPREY_BASE_BIN is not an executable" >&2; exit 1; }
[[ $REPS =~ ^[1-9][0-9]*$ ]] || { echo "bench_gguf.sh: REPS=$REPS is not a positive integer" >&2; exit 1; }
for t in $THREADS; do
  [[ $t =~ ^[0-9]+$ ]] || { echo "bench_gguf.sh: THREADS='$THREADS' holds '$t', not a thread count" >&2; exit 1; }
done
for ty in $TYPES; do
  [[ $ty =~ ^[A-Z0-9_]+$ ]] || { echo "bench_gguf.sh: TYPES holds '$ty', not a llama-quantize type name" >&2; exit 1; }
done
[[ -z $TOKENIZER_DIR || -f $TOKENIZER_DIR/tokenizer.json ]] || { echo "bench_gguf.sh: no tokenizer.json in TOKENIZER_DIR=$TOKENIZER_DIR" >&2; exit 1; }
"$PYTHON" -c 'import numpy' 2>/dev/null || { echo "bench_gguf.sh: $PYTHON has no numpy (set PYTHON)" >&2; exit 1; }
QUANTIZE=${LLAMA_BUILD:+$LLAMA_BUILD/bin/llama-quantize}
LLAMA_BENCH=${LLAMA_BUILD:+$LLAMA_BUILD/bin/llama-bench}
[[ -n $LLAMA_BENCH && -x $LLAMA_BENCH ]] || LLAMA_BENCH=

case $SHAPE in
  llama8b) SHAPE_ARGS="--preset llama-3.1-8b" ;;
  llama1b) SHAPE_ARGS="--model-type llama --hidden 2048 --layers 16 --heads 32 --kv-heads 8 --intermediate 8192 --vocab 128256" ;;
  *) echo "bench_gguf.sh: unknown SHAPE '$SHAPE' (llama8b, llama1b)" >&2; exit 2 ;;
esac

# shellcheck source=lib/physical_cpus.sh
source "$ROOT/scripts/lib/physical_cpus.sh"
pinned() {  # pinned T CMD...: CMD on the first T physical cores (the CPU only)
  local t=$1; shift
  if [[ $t == 0 ]] || ! command -v taskset >/dev/null; then "$@"; else taskset -c "$(physical_cpus "$t")" "$@"; fi
}

mkdir -p "$OUT_DIR/raw" "$FILES_DIR"
start=$SECONDS
CK=$FILES_DIR/$SHAPE-f16
if [[ ! -f $FILES_DIR/$SHAPE-F16.gguf ]]; then
  if [[ ! -f $CK/config.json ]]; then
    echo "bench_gguf.sh: making $CK" >&2
    # shellcheck disable=SC2086
    "$PYTHON" "$ROOT/tools/make_random_checkpoint.py" $SHAPE_ARGS --dtype float16 \
      ${TOKENIZER_DIR:+--tokenizer-dir "$TOKENIZER_DIR"} --out "$CK" >&2
  fi
  "$OSPREY_BIN" convert -m "$CK" -o "$FILES_DIR/$SHAPE-F16.gguf" --to gguf --outtype f16 >&2
  rm -rf "$CK"
fi
for ty in $TYPES; do
  f=$FILES_DIR/$SHAPE-$ty.gguf
  [[ -f $f ]] && continue
  [[ -n $QUANTIZE && -x $QUANTIZE ]] || { echo "bench_gguf.sh: $ty needs llama-quantize (set LLAMA_BUILD)" >&2; exit 1; }
  "$QUANTIZE" "$FILES_DIR/$SHAPE-F16.gguf" "$f" "$ty" "$(nproc)" >"$OUT_DIR/quantize-$ty.log" 2>&1 ||
    { tail -5 "$OUT_DIR/quantize-$ty.log" >&2; exit 1; }
done
ls -l "$FILES_DIR"/*.gguf >"$OUT_DIR/files.txt"
if [[ $DEVICE == cpu ]]; then
  lscpu >"$OUT_DIR/lscpu.txt"
  if [[ -x $STREAM_BIN ]]; then
    n_phys=$(physical_cpus 100000 | tr ',' '\n' | wc -l)
    probe=$(printf '%s\n' 1 4 "$n_phys" $THREADS | sort -n -u | tr '\n' ',' | sed 's/,$//')
    "$STREAM_BIN" -t "$probe" --mib 2048 -r 10 --json >"$OUT_DIR/stream.json"
  fi
fi
[[ $DEVICE == cuda ]] && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT_DIR/gpu.txt"

for r in $(seq 1 "$REPS"); do
  for t in $THREADS; do
    for ty in $TYPES; do
      f=$FILES_DIR/$SHAPE-$ty.gguf
      targs=(); [[ $t == 0 ]] || targs=(-t "$t")
      echo "bench_gguf.sh: round $r/$REPS, $ty, threads ${t/#0/default}" >&2
      pinned "$t" "$OSPREY_BIN" bench -m "$f" --device "$DEVICE" -p "$PP" -n "$TG" -r 1 --warmup 1 "${targs[@]}" -o json \
        >"$OUT_DIR/raw/osprey-$ty-t$t-r$r.json" 2>"$OUT_DIR/raw/osprey-$ty-t$t-r$r.log" ||
        { echo "bench_gguf.sh: osprey bench failed on $f" >&2; tail -3 "$OUT_DIR/raw/osprey-$ty-t$t-r$r.log" >&2; }
      if [[ -n $OSPREY_BASE_BIN ]]; then
        pinned "$t" "$OSPREY_BASE_BIN" bench -m "$f" --device "$DEVICE" -p "$PP" -n "$TG" -r 1 --warmup 1 "${targs[@]}" -o json \
          >"$OUT_DIR/raw/base-$ty-t$t-r$r.json" 2>"$OUT_DIR/raw/base-$ty-t$t-r$r.log" ||
          { echo "bench_gguf.sh: the base osprey failed on $f" >&2; tail -3 "$OUT_DIR/raw/base-$ty-t$t-r$r.log" >&2; }
      fi
      if [[ -n $LLAMA_BENCH ]]; then
        # shellcheck disable=SC2086
        pinned "$t" "$LLAMA_BENCH" -m "$f" -p "$PP" -n "$TG" -r 1 "${targs[@]}" $LLAMA_ARGS -o json \
          >"$OUT_DIR/raw/llamacpp-$ty-t$t-r$r.json" 2>"$OUT_DIR/raw/llamacpp-$ty-t$t-r$r.log" ||
          { echo "bench_gguf.sh: llama-bench failed on $f" >&2; tail -3 "$OUT_DIR/raw/llamacpp-$ty-t$t-r$r.log" >&2; }
      fi
    done
  done
done

"$PYTHON" - "$OUT_DIR" "$REPS" "$DEVICE" "$SHAPE" "$TYPES" $THREADS <<'EOF' | tee "$OUT_DIR/summary.md"
import json, os, statistics, sys

out_dir, reps, device, shape, types = sys.argv[1:6]
threads = [int(t) for t in sys.argv[6:]]
reps = int(reps)

def samples(engine, ty, t):
    """{test name: [t/s per round]} of one engine's raw files (unreadable ones skipped)."""
    out = {}
    for r in range(1, reps + 1):
        path = os.path.join(out_dir, "raw", f"{engine}-{ty}-t{t}-r{r}.json")
        try:
            d = json.load(open(path))
        except (OSError, ValueError):
            continue
        for test in d["tests"] if isinstance(d, dict) else d:
            if engine != "llamacpp":
                name = test["name"]
            else:  # llama-bench: one record per test
                name = f"pp{test['n_prompt']}" if test["n_gen"] == 0 else f"tg{test['n_gen']}"
            out.setdefault(name, []).append(test["avg_ts"])
    return out

def fmt(v):
    return f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})" if v else "-"

def ratio(a, b):
    return statistics.median(a) / statistics.median(b) if a and b else None

def fmt_ratio(r):
    return f"{r:.2f}" if r else "-"

summary = {"device": device, "shape": shape, "rounds": reps, "results": []}
stream_path = os.path.join(out_dir, "stream.json")
if os.path.exists(stream_path):
    summary["stream"] = json.load(open(stream_path))
    print("Read bandwidth (osprey_stream_read, 2 GiB, 10 repetitions):\n")
    print("| threads | read GB/s (best) | read GB/s (median) |\n|---|---|---|")
    for s in summary["stream"]:
        print(f"| {s['threads']} | {s['read_gbs_best']:.1f} | {s['read_gbs_median']:.1f} |")
    print()
has_base = any(f.startswith("base-") for f in os.listdir(os.path.join(out_dir, "raw")))
print(f"{shape}, {device}; t/s: median (min-max) of {reps} rounds, the engines alternating within each round.\n")
print("| file | threads | test | Osprey t/s | " + ("Osprey base t/s | Osprey / base | " if has_base else "") +
      "llama.cpp t/s | Osprey / llama.cpp (medians) |")
print("|---|---|---|---|" + ("---|---|" if has_base else "") + "---|---|")
for t in threads:
    for ty in types.split():
        ours, base, theirs = samples("osprey", ty, t), samples("base", ty, t), samples("llamacpp", ty, t)
        for name in sorted(set(ours) | set(theirs), key=lambda n: (n[:2] != "pp", n)):
            o, b, l = ours.get(name, []), base.get(name, []), theirs.get(name, [])
            summary["results"].append({"type": ty, "threads": t, "test": name, "osprey_ts": o, "base_ts": b,
                                       "llama_cpp_ts": l, "ratio_of_medians": ratio(o, l),
                                       "ratio_to_base": ratio(o, b)})
            print(f"| {ty} | {t or '-'} | {name} | {fmt(o)} | " +
                  (f"{fmt(b)} | {fmt_ratio(ratio(o, b))} | " if has_base else "") +
                  f"{fmt(l)} | {fmt_ratio(ratio(o, l))} |")
json.dump(summary, open(os.path.join(out_dir, "summary.json"), "w"), indent=2)
EOF
echo "bench_gguf.sh: done in $((SECONDS - start)) s; $OUT_DIR/summary.md" >&2
