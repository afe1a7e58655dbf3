#!/usr/bin/env bash
# CPU benchmark of 1B-class shapes, fp16 and 4-bit, against the memory read bandwidth and, where
# it is built, llama.cpp (docs/benchmarks.md, "CPU decode and prefill").
#
# Usage: scripts/bench_cpu.sh OUT_DIR
#
# From the repository root, after `cmake --build build` (osprey and osprey_stream_read):
#  1. per shape of SHAPES, makes the fp16 checkpoint (tools/make_random_checkpoint.py) and its
#     4-bit g64 conversion (osprey convert --q-bits 4 --q-group-size 64), unless they exist;
#  2. measures the read bandwidth with osprey_stream_read at 1, 4, every physical core and each
#     count of THREADS;
#  3. runs REPS rounds; each round runs, for each thread count and model, `osprey bench --device
#     cpu -p 128 -n 32 -r 1 -t T` and then (where LLAMA_BENCH and the GGUF file are given)
#     `llama-bench -p 128 -n 32 -r 1 -t T -ngl 0` on the same shape, so the two engines
#     alternate and share the machine's drifts; both are pinned (taskset) to the first T
#     physical cores;
# and writes OUT_DIR/summary.md and summary.json (per test: each engine's median t/s with its
# min-max spread over the rounds, their ratio, and each decode figure as GB/s of weights
# streamed per token and as a share of the read bandwidth at the same thread count) and the raw
# json under OUT_DIR/raw/.
#
# Environment:
#   OSPREY_BIN    the osprey binary (default: build/osprey)
#   STREAM_BIN    the bandwidth tool (default: build/osprey_stream_read)
#   MODELS_DIR    where the checkpoints are made or found (default: OUT_DIR/models)
#   SHAPES        any of llama1b (Llama-3.2-1B), qwen05b (Qwen2.5-0.5B), gemma1b (Gemma 3 1B)
#                 (default "llama1b qwen05b gemma1b")
#   THREADS       thread counts (default "4 16")
#   REPS          rounds (default 5)
#   LAYERS        layers of every checkpoint (default: the shape's; fewer for a quick run)
#   PIN           1: pin both engines to the first T physical cores with taskset (default 1)
#   LLAMA_BENCH   llama.cpp's llama-bench binary (default: none, Osprey only)
#   GGUF_DIR      llama.cpp's files of the same checkpoints: SHAPE-f16.gguf and SHAPE-q4_0.gguf
#                 (made with llama.cpp's convert_hf_to_gguf.py --outtype f16 from MODELS_DIR's
#                 fp16 folder, then llama-quantize ... Q4_0); a missing one skips that row
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
SHAPES=${SHAPES:-llama1b qwen05b gemma1b}
THREADS=${THREADS:-4 16}
REPS=${REPS:-5}
LAYERS=${LAYERS:-}
PIN=${PIN:-1}
LLAMA_BENCH=${LLAMA_BENCH:-}
GGUF_DIR=${GGUF_DIR:-}
PYTHON=${PYTHON:-python3}

[[ -x $OSPREY_BIN ]] || { echo "bench_cpu.sh: no osprey binary at $OSPREY_BIN (cmake --build build, or set OSPREY_BIN)" >&2; exit 1; }
[[ -x $STREAM_BIN ]] || { echo "bench_cpu.sh: no osprey_stream_read at $STREAM_BIN (cmake --build build, or set STREAM_BIN)" >&2; exit 1; }
for t in $THREADS; do
  [[ $t =~ ^[1-9][0-9]*$ ]] || { echo "bench_cpu.sh: THREADS='$THREADS' holds '$t', not a positive integer" >&2; exit 1; }
done
[[ $REPS =~ ^[1-9][0-9]*$ ]] || { echo "bench_cpu.sh: REPS=$REPS is not a positive integer" >&2; exit 1; }
[[ -z $LAYERS || $LAYERS =~ ^[1-9][0-9]*$ ]] || { echo "bench_cpu.sh: LAYERS=$LAYERS is not a positive integer" >&2; exit 1; }
[[ -z $LLAMA_BENCH || -x $LLAMA_BENCH ]] || { echo "bench_cpu.sh: LLAMA_BENCH=$LLAMA_BENCH is not an executable" >&2; exit 1; }
[[ -z $LLAMA_BENCH || -d $GGUF_DIR ]] || { echo "bench_cpu.sh: LLAMA_BENCH needs GGUF_DIR (a folder of SHAPE-f16.gguf, SHAPE-q4_0.gguf)" >&2; exit 1; }
[[ $PIN == 0 ]] || command -v taskset >/dev/null || { echo "bench_cpu.sh: PIN=1 needs taskset (util-linux), or set PIN=0" >&2; exit 1; }
"$PYTHON" -c 'import numpy' 2>/dev/null || { echo "bench_cpu.sh: $PYTHON has no numpy (set PYTHON)" >&2; exit 1; }

# The make_random_checkpoint.py arguments of each shape (the published configs' sizes; heads
# tied to the embedding, as all three are).
shape_args() {
  case $1 in
    llama1b) echo "--model-type llama --hidden 2048 --layers ${LAYERS:-16} --heads 32 --kv-heads 8 --intermediate 8192 --vocab 128256" ;;
    qwen05b) echo "--model-type qwen2 --hidden 896 --layers ${LAYERS:-24} --heads 14 --kv-heads 2 --intermediate 4864 --vocab 151936" ;;
    gemma1b) echo "--model-type gemma3_text --hidden 1152 --layers ${LAYERS:-26} --heads 4 --kv-heads 1 --head-dim 256 --intermediate 6912 --vocab 262144" ;;
    *) echo "bench_cpu.sh: unknown shape '$1' in SHAPES (llama1b, qwen05b, gemma1b)" >&2; exit 1 ;;
  esac
}
for s in $SHAPES; do shape_args "$s" >/dev/null; done

# shellcheck source=lib/physical_cpus.sh
source "$ROOT/scripts/lib/physical_cpus.sh"
N_PHYS=$(physical_cpus 100000 | tr ',' '\n' | wc -l)
pinned() {  # pinned T CMD...: CMD on the first T physical cores (PIN=1)
  local t=$1; shift
  if [[ $PIN == 0 ]]; then "$@"; else taskset -c "$(physical_cpus "$t")" "$@"; fi
}

mkdir -p "$OUT_DIR/raw" "$MODELS_DIR"
start=$SECONDS
for s in $SHAPES; do
  F16=$MODELS_DIR/$s${LAYERS:+-l$LAYERS}-f16
  Q4=$MODELS_DIR/$s${LAYERS:+-l$LAYERS}-q4g64
  if [[ ! -f $F16/config.json ]]; then
    echo "bench_cpu.sh: making $F16" >&2
    # shellcheck disable=SC2046
    "$PYTHON" "$ROOT/tools/make_random_checkpoint.py" $(shape_args "$s") --dtype float16 --out "$F16" >&2
  fi
  if [[ ! -f $Q4/config.json ]]; then
    echo "bench_cpu.sh: converting to $Q4" >&2
    rm -rf "$Q4"
    "$OSPREY_BIN" convert -m "$F16" -o "$Q4" --q-bits 4 --q-group-size 64 >&2
  fi
done

PROBE=$(printf '%s\n' 1 4 "$N_PHYS" $THREADS | sort -n -u | tr '\n' ',' | sed 's/,$//')
echo "bench_cpu.sh: read bandwidth at threads: $PROBE" >&2
"$STREAM_BIN" -t "$PROBE" --mib 2048 -r 10 --json >"$OUT_DIR/stream.json"
lscpu >"$OUT_DIR/lscpu.txt"

for r in $(seq 1 "$REPS"); do
  for t in $THREADS; do
    for s in $SHAPES; do
      for kind in f16 q4; do
        if [[ $kind == f16 ]]; then m=$MODELS_DIR/$s${LAYERS:+-l$LAYERS}-f16; g=$GGUF_DIR/$s-f16.gguf
        else m=$MODELS_DIR/$s${LAYERS:+-l$LAYERS}-q4g64; g=$GGUF_DIR/$s-q4_0.gguf; fi
        echo "bench_cpu.sh: round $r/$REPS, $s $kind, $t threads" >&2
        pinned "$t" "$OSPREY_BIN" bench -m "$m" --device cpu -p 128 -n 32 -r 1 -t "$t" -o json \
          >"$OUT_DIR/raw/osprey-$s-$kind-t$t-r$r.json"
        if [[ -n $LLAMA_BENCH && -f $g ]]; then
          pinned "$t" "$LLAMA_BENCH" -m "$g" -p 128 -n 32 -r 1 -t "$t" -ngl 0 -o json \
            >"$OUT_DIR/raw/llamacpp-$s-$kind-t$t-r$r.json"
        fi
      done
    done
  done
done

"$PYTHON" - "$OUT_DIR" "$MODELS_DIR" "${LAYERS:-}" "$REPS" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')" \
  "$SHAPES" $THREADS <<'EOF' | tee "$OUT_DIR/summary.md"
import json, os, statistics, struct, sys

out_dir, models_dir, layers, reps, cpu, shapes = sys.argv[1:7]
shapes = shapes.split()
threads = [int(t) for t in sys.argv[7:]]
reps = int(reps)
suffix = f"-l{layers}" if layers else ""

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

def samples(engine, shape, kind, t):
    """{test name: [t/s per round]} of one engine's raw files."""
    out = {}
    for r in range(1, reps + 1):
        path = os.path.join(out_dir, "raw", f"{engine}-{shape}-{kind}-t{t}-r{r}.json")
        if not os.path.exists(path):
            continue
        d = json.load(open(path))
        tests = d["tests"] if isinstance(d, dict) else d
        for test in tests:
            if engine == "osprey":
                name = test["name"]
            else:  # llama-bench: one record per test
                name = f"pp{test['n_prompt']}" if test["n_gen"] == 0 else f"tg{test['n_gen']}"
            out.setdefault(name, []).append(test["avg_ts"])
    return out

def fmt(v):
    if not v:
        return "-"
    return f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"

stream = {r["threads"]: r for r in json.load(open(os.path.join(out_dir, "stream.json")))}
summary = {"cpu": cpu, "stream": list(stream.values()), "rounds": reps, "results": []}
rows = []
for shape in shapes:
    for kind in ("f16", "q4"):
        model = os.path.join(models_dir, f"{shape}{suffix}-{'f16' if kind == 'f16' else 'q4g64'}")
        per_token = streamed_bytes(model)
        summary.setdefault("streamed_bytes_per_token", {})[f"{shape}-{kind}"] = per_token
        for t in threads:
            ours, theirs = samples("osprey", shape, kind, t), samples("llamacpp", shape, kind, t)
            for name in sorted(ours):
                o, l = ours[name], theirs.get(name, [])
                ratio = statistics.median(o) / statistics.median(l) if l else None
                rec = {"shape": shape, "model": kind, "test": name, "threads": t, "osprey_ts": o, "llama_cpp_ts": l,
                       "ratio_of_medians": ratio}
                share = ""
                if name.startswith("tg"):
                    gbs = statistics.median(o) * per_token / 1e9
                    rec["weight_gbs"] = gbs
                    bw = stream.get(t, {}).get("read_gbs_best")
                    share = f"{gbs:.1f} GB/s" + (f" = {100 * gbs / bw:.0f}% of {bw:.1f}" if bw else "")
                    if bw:
                        rec["share_of_read_bw"] = gbs / bw
                summary["results"].append(rec)
                label = "fp16" if kind == "f16" else "4-bit (MLX g64 / Q4_0)"
                rows.append(f"| {shape} | {label} {name} | {t} | {fmt(o)} | {fmt(l)} | "
                            f"{f'{ratio:.2f}' if ratio else '-'} | {share} |")
json.dump(summary, open(os.path.join(out_dir, "summary.json"), "w"), indent=2)
print(f"CPU: {cpu} (lscpu.txt beside this file)\n")
print("| threads | read GB/s (best) | read GB/s (median) |\n|---|---|---|")
for t in sorted(stream):
    s = stream[t]
    print(f"| {t} | {s['read_gbs_best']:.1f} | {s['read_gbs_median']:.1f} |")
print(f"\nt/s: median (min-max) of {reps} rounds, the engines alternating within each round.\n")
print("| shape | test | threads | Osprey t/s | llama.cpp t/s | Osprey / llama.cpp (medians) | decode weight stream, share of read bandwidth |")
print("|---|---|---|---|---|---|---|")
print("\n".join(rows))
print("\nWeights streamed per decoded token (a tied head counts once, as the head): " +
      ", ".join(f"{k} {v / 1e9:.3f} GB" for k, v in summary["streamed_bytes_per_token"].items()) + ".")
EOF
echo "bench_cpu.sh: done in $((SECONDS - start)) s; $OUT_DIR/summary.md" >&2
