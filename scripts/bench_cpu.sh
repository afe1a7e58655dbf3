#!/usr/bin/env bash
# CPU benchmark of the Llama-3.2-1B shape, fp16 and 4-bit, against the memory read bandwidth
# (docs/benchmarks.md, "CPU decode and prefill").
#
# Usage: scripts/bench_cpu.sh OUT_DIR
#
# From the repository root, after `cmake --build build` (osprey and osprey_stream_read):
#  1. makes the fp16 checkpoint (tools/make_random_checkpoint.py: llama, hidden 2048, 16
#     layers, 32 heads, 8 kv heads, intermediate 8192, vocab 128256, the tool's defaults
#     otherwise: the command of issue #17, 1.24 B parameters) and its
#     4-bit g64 conversion (osprey convert --q-bits 4 --q-group-size 64), unless they exist;
#  2. measures the read bandwidth with osprey_stream_read at each thread count;
#  3. runs `osprey bench --device cpu -p 128 -n 32 -r $REPS -t T` for both models and each T;
# and writes OUT_DIR/summary.md (the table, each decode figure as GB/s of weights streamed per
# token and as a share of the read bandwidth, beside the llama.cpp figures of issue #17),
# OUT_DIR/raw/*.json and OUT_DIR/stream.json.
#
# Environment:
#   OSPREY_BIN    the osprey binary (default: build/osprey)
#   STREAM_BIN    the bandwidth tool (default: build/osprey_stream_read)
#   MODELS_DIR    where the checkpoints are made or found (default: OUT_DIR/models)
#   THREADS       thread counts (default "4 16")
#   REPS          measured runs per test (default 3)
#   LAYERS        layers of the checkpoint (default 16; fewer for a quick run on a small machine)
#   PYTHON        a python3 with numpy (default python3)
set -euo pipefail

if [[ $# -ne 1 || $1 == -h || $1 == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit $(( $# != 1 ? 2 : 0 ))
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT_DIR=$1
OSPREY_BIN=${OSPREY_BIN:-$ROOT/build/osprey}
STREAM_BIN=${STREAM_BIN:-$ROOT/build/osprey_stream_read}
MODELS_DIR=${MODELS_DIR:-$OUT_DIR/models}
THREADS=${THREADS:-4 16}
REPS=${REPS:-3}
LAYERS=${LAYERS:-16}
PYTHON=${PYTHON:-python3}

[[ -x $OSPREY_BIN ]] || { echo "bench_cpu.sh: no osprey binary at $OSPREY_BIN (cmake --build build, or set OSPREY_BIN)" >&2; exit 1; }
[[ -x $STREAM_BIN ]] || { echo "bench_cpu.sh: no osprey_stream_read at $STREAM_BIN (cmake --build build, or set STREAM_BIN)" >&2; exit 1; }
for t in $THREADS; do
  [[ $t =~ ^[1-9][0-9]*$ ]] || { echo "bench_cpu.sh: THREADS='$THREADS' holds '$t', not a positive integer" >&2; exit 1; }
done
[[ $REPS =~ ^[1-9][0-9]*$ ]] || { echo "bench_cpu.sh: REPS=$REPS is not a positive integer" >&2; exit 1; }
[[ $LAYERS =~ ^[1-9][0-9]*$ ]] || { echo "bench_cpu.sh: LAYERS=$LAYERS is not a positive integer" >&2; exit 1; }
"$PYTHON" -c 'import numpy' 2>/dev/null || { echo "bench_cpu.sh: $PYTHON has no numpy (set PYTHON)" >&2; exit 1; }

mkdir -p "$OUT_DIR/raw" "$MODELS_DIR"
F16=$MODELS_DIR/llama1b-shape-l$LAYERS-f16
Q4=$MODELS_DIR/llama1b-shape-l$LAYERS-q4g64
start=$SECONDS

if [[ ! -f $F16/model.safetensors ]]; then
  echo "bench_cpu.sh: making $F16" >&2
  "$PYTHON" "$ROOT/tools/make_random_checkpoint.py" --model-type llama --hidden 2048 --layers "$LAYERS" --heads 32 \
    --kv-heads 8 --intermediate 8192 --vocab 128256 --dtype float16 --out "$F16" >&2
fi
if [[ ! -f $Q4/config.json ]]; then
  echo "bench_cpu.sh: converting to $Q4" >&2
  rm -rf "$Q4"
  "$OSPREY_BIN" convert -m "$F16" -o "$Q4" --q-bits 4 --q-group-size 64 >&2
fi

echo "bench_cpu.sh: read bandwidth at threads: $THREADS" >&2
# shellcheck disable=SC2086
"$STREAM_BIN" -t "$(echo $THREADS | tr ' ' ',')" --mib 2048 -r 10 --json >"$OUT_DIR/stream.json"

for t in $THREADS; do
  for m in "$F16" "$Q4"; do
    name=$(basename "$m")
    echo "bench_cpu.sh: $name, $t threads" >&2
    "$OSPREY_BIN" bench -m "$m" --device cpu -p 128 -n 32 -r "$REPS" -t "$t" -o json >"$OUT_DIR/raw/$name-t$t.json"
  done
done

"$PYTHON" - "$OUT_DIR" "$F16" "$Q4" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')" $THREADS <<'EOF' | tee "$OUT_DIR/summary.md"
import json, os, struct, sys

out_dir, f16, q4, cpu = sys.argv[1:5]
threads = [int(t) for t in sys.argv[5:]]
# llama.cpp on the 16-core Xeon, from issue #17 (fp16; Q4_0 beside Osprey's MLX 4-bit g64).
LLAMA_CPP = {("f16", "pp128", 4): 124, ("f16", "tg32", 4): 13.3, ("q4", "pp128", 4): 260, ("q4", "tg32", 4): 30.1,
             ("f16", "pp128", 16): 300, ("f16", "tg32", 16): 30.1, ("q4", "pp128", 16): 854, ("q4", "tg32", 16): 87.1}

def streamed_bytes(model_dir):
    """Bytes of weights one decode step reads: all of them, but for an untied head the input
    embedding only once per row used (left out)."""
    sizes = {}
    for name in os.listdir(model_dir):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(model_dir, name), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        for key, v in header.items():
            if key != "__metadata__":
                sizes[key] = v["data_offsets"][1] - v["data_offsets"][0]
    untied = any(k.startswith("lm_head.") for k in sizes)
    return sum(v for k, v in sizes.items() if not (untied and "embed_tokens" in k))

stream = {r["threads"]: r for r in json.load(open(os.path.join(out_dir, "stream.json")))}
rows, summary = [], {"cpu": cpu, "stream": list(stream.values()), "results": []}
for kind, model in (("f16", f16), ("q4", q4)):
    per_token = streamed_bytes(model)
    for t in threads:
        d = json.load(open(os.path.join(out_dir, "raw", f"{os.path.basename(model)}-t{t}.json")))
        for test in d["tests"]:
            name = test["name"]
            ts = test["avg_ts"]
            ref = LLAMA_CPP.get((kind, name, t))
            rec = {"model": kind, "test": name, "threads": t, "tokens_per_s": ts, "stddev": test["stddev_ts"],
                   "llama_cpp": ref, "ratio": ts / ref if ref else None}
            share = ""
            if name.startswith("tg"):
                gbs = ts * per_token / 1e9
                rec["weight_gbs"] = gbs
                bw = stream.get(t, {}).get("read_gbs_best")
                if bw:
                    rec["share_of_read_bw"] = gbs / bw
                    share = f"{gbs:.1f} GB/s = {100 * gbs / bw:.0f}% of {bw:.1f}"
                else:
                    share = f"{gbs:.1f} GB/s"
            summary["results"].append(rec)
            label = "fp16" if kind == "f16" else "4-bit (MLX g64 / Q4_0)"
            rows.append(f"| {label} {name} | {t} | {ts:.1f} ± {test['stddev_ts']:.1f} | "
                        f"{ref if ref else '-'} | {rec['ratio']:.2f} | {share} |" if ref else
                        f"| {label} {name} | {t} | {ts:.1f} ± {test['stddev_ts']:.1f} | - | - | {share} |")
        summary.setdefault("streamed_bytes_per_token", {})[kind] = per_token
json.dump(summary, open(os.path.join(out_dir, "summary.json"), "w"), indent=2)
print(f"CPU: {cpu}\n")
print("| threads | read GB/s (best) | read GB/s (median) |\n|---|---|---|")
for t in threads:
    s = stream.get(t)
    if s:
        print(f"| {t} | {s['read_gbs_best']:.1f} | {s['read_gbs_median']:.1f} |")
print("\n| test | threads | Osprey t/s | llama.cpp t/s (issue #17) | Osprey / llama.cpp | decode weight stream, share of read bandwidth |")
print("|---|---|---|---|---|---|")
print("\n".join(rows))
print(f"\nWeights streamed per decoded token (with a tied head, the embedding is the head): "
      f"fp16 {summary['streamed_bytes_per_token']['f16'] / 1e9:.3f} GB, "
      f"4-bit {summary['streamed_bytes_per_token']['q4'] / 1e9:.3f} GB.")
EOF
echo "bench_cpu.sh: done in $((SECONDS - start)) s; $OUT_DIR/summary.md" >&2
