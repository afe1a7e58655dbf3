#!/usr/bin/env bash
# Thread scaling of CPU decode and prefill, and the pool's cost per parallel_for call
# (core/thread_pool.h; docs/benchmarks.md).
#
# Usage: scripts/bench_cpu_threads.sh OUT_DIR
#
# From the repository root, after `cmake --build build` (osprey and osprey_thread_pool_bench).
# REPS rounds; each round runs, for each thread count T of THREADS (those above the physical
# cores are dropped) and each model of MODELS, `osprey bench --device cpu -p PROMPT -n GEN -r 1
# -t T` and then, where BASE_BIN is given, the same with that binary (an earlier build: the two
# alternate within each round and share the machine's drifts), and `osprey_thread_pool_bench T
# 3`; everything is pinned (taskset) to the first T physical cores. Writes OUT_DIR/summary.md
# (per model and thread count: median prefill and decode t/s with the min-max spread over the
# rounds, and the pool's ns per call: back-to-back empty calls, calls of 5 us per thread, and
# a call after 5 ms idle, when the workers sleep) and the raw outputs under OUT_DIR/raw/.
#
# Environment:
#   OSPREY_BIN        the osprey binary (default: build/osprey)
#   POOL_BENCH_BIN    the pool benchmark (default: build/osprey_thread_pool_bench)
#   BASE_BIN          an earlier osprey binary to alternate with (default: none)
#   BASE_POOL_BENCH   an earlier osprey_thread_pool_bench to alternate with (default: none)
#   MODELS            model folders (default: models/demo; for the 1B figures, the llama1b
#                     fp16 and q4g64 folders that scripts/bench_cpu.sh makes)
#   THREADS           thread counts (default "1 4 8 16")
#   PROMPT, GEN       prefill and decode lengths (default 128 and 32)
#   REPS              rounds (default 5)
#   PIN               1: pin to the first T physical cores with taskset (default 1)
#   PYTHON            a python3 (default python3)
set -euo pipefail

if [[ $# -ne 1 || $1 == -h || $1 == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit $(( $# != 1 ? 2 : 0 ))
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT_DIR=$1
OSPREY_BIN=${OSPREY_BIN:-$ROOT/build/osprey}
POOL_BENCH_BIN=${POOL_BENCH_BIN:-$ROOT/build/osprey_thread_pool_bench}
BASE_BIN=${BASE_BIN:-}
BASE_POOL_BENCH=${BASE_POOL_BENCH:-}
MODELS=${MODELS:-$ROOT/models/demo}
THREADS=${THREADS:-1 4 8 16}
PROMPT=${PROMPT:-128}
GEN=${GEN:-32}
REPS=${REPS:-5}
PIN=${PIN:-1}
PYTHON=${PYTHON:-python3}

for b in "$OSPREY_BIN" "$POOL_BENCH_BIN" ${BASE_BIN:+"$BASE_BIN"} ${BASE_POOL_BENCH:+"$BASE_POOL_BENCH"}; do
  [[ -x $b ]] || { echo "bench_cpu_threads.sh: no executable at $b (cmake --build build, or set the *_BIN variables)" >&2; exit 1; }
done
for m in $MODELS; do
  [[ -f $m/config.json || -f $m ]] || { echo "bench_cpu_threads.sh: MODELS holds '$m': not a model folder or file" >&2; exit 1; }
done
for v in $THREADS $PROMPT $GEN $REPS; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "bench_cpu_threads.sh: '$v' (THREADS, PROMPT, GEN or REPS) is not a non-negative integer" >&2; exit 1; }
done
[[ $PIN == 0 ]] || command -v taskset >/dev/null || { echo "bench_cpu_threads.sh: PIN=1 needs taskset (util-linux), or set PIN=0" >&2; exit 1; }

# shellcheck source=lib/physical_cpus.sh
source "$ROOT/scripts/lib/physical_cpus.sh"
N_PHYS=$(physical_cpus 100000 | tr ',' '\n' | wc -l)
COUNTS=""
for t in $THREADS; do
  if (( t >= 1 && t <= N_PHYS )); then COUNTS+="$t "; else echo "bench_cpu_threads.sh: skipping $t threads ($N_PHYS physical cores)" >&2; fi
done
[[ -n $COUNTS ]] || { echo "bench_cpu_threads.sh: no count of THREADS='$THREADS' fits $N_PHYS physical cores" >&2; exit 1; }
pinned() {  # pinned T CMD...: CMD on the first T physical cores (PIN=1)
  local t=$1; shift
  if [[ $PIN == 0 ]]; then "$@"; else taskset -c "$(physical_cpus "$t")" "$@"; fi
}

mkdir -p "$OUT_DIR/raw"
lscpu >"$OUT_DIR/lscpu.txt"
{
  echo "osprey: $OSPREY_BIN ($("$OSPREY_BIN" --version 2>/dev/null | head -1))"
  [[ -z $BASE_BIN ]] || echo "base: $BASE_BIN ($("$BASE_BIN" --version 2>/dev/null | head -1))"
  echo "models: $MODELS"
  echo "threads: $COUNTS; -p $PROMPT -n $GEN; $REPS rounds; pinned: $PIN"
} >"$OUT_DIR/setup.txt"

for r in $(seq 1 "$REPS"); do
  for t in $COUNTS; do
    i=0
    for m in $MODELS; do
      i=$((i + 1))
      for arm in new base; do
        bin=$OSPREY_BIN
        if [[ $arm == base ]]; then [[ -n $BASE_BIN ]] || continue; bin=$BASE_BIN; fi
        echo "bench_cpu_threads.sh: round $r/$REPS, $t threads, model $i ($m), $arm" >&2
        pinned "$t" "$bin" bench -m "$m" --device cpu -p "$PROMPT" -n "$GEN" -r 1 -t "$t" -o json \
          >"$OUT_DIR/raw/bench-$arm-m$i-t$t-r$r.json"
      done
    done
    pinned "$t" "$POOL_BENCH_BIN" "$t" 3 >"$OUT_DIR/raw/pool-new-t$t-r$r.txt"
    [[ -z $BASE_POOL_BENCH ]] || pinned "$t" "$BASE_POOL_BENCH" "$t" 3 >"$OUT_DIR/raw/pool-base-t$t-r$r.txt"
  done
done

"$PYTHON" - "$OUT_DIR" "$REPS" "$MODELS" $COUNTS <<'EOF' | tee "$OUT_DIR/summary.md"
import json, os, re, statistics, sys

out_dir, reps, models = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
counts = [int(t) for t in sys.argv[4:]]
raw = os.path.join(out_dir, "raw")

def fmt(v, digits=1):
    if not v:
        return "-"
    return f"{statistics.median(v):.{digits}f} ({min(v):.{digits}f}-{max(v):.{digits}f})"

def bench(arm, i, t):
    out = {}
    for r in range(1, reps + 1):
        path = os.path.join(raw, f"bench-{arm}-m{i}-t{t}-r{r}.json")
        if os.path.exists(path):
            for test in json.load(open(path))["tests"]:
                out.setdefault(test["name"][:2], []).append(test["avg_ts"])
    return out

def pool(arm, t):
    out = {}
    for r in range(1, reps + 1):
        path = os.path.join(raw, f"pool-{arm}-t{t}-r{r}.txt")
        if os.path.exists(path):
            for line in open(path):
                m = re.match(r"threads \d+\s+(.+?)\s+ns/call median\s+(\d+)", line)
                if m:
                    out.setdefault(m.group(1), []).append(float(m.group(2)))
    return out

arms = ["new"] + (["base"] if any(f.startswith("bench-base") for f in os.listdir(raw)) else [])
print(f"Medians over {reps} rounds (min-max).\n")
print("| model | threads | arm | prefill t/s | decode t/s |")
print("|---|---|---|---|---|")
for i, m in enumerate(models, 1):
    for t in counts:
        for arm in arms:
            b = bench(arm, i, t)
            print(f"| {os.path.basename(m.rstrip('/'))} | {t} | {arm} | {fmt(b.get('pp'))} | {fmt(b.get('tg'))} |")
pool_arms = ["new"] + (["base"] if any(f.startswith("pool-base") for f in os.listdir(raw)) else [])
print("\nThe pool's ns per parallel_for call (osprey_thread_pool_bench; each round's figure a median of 3):\n")
print("| threads | arm | empty, n=1024 | empty, n=T | 5 us per thread | after 5 ms idle |")
print("|---|---|---|---|---|---|")
for t in counts:
    for arm in pool_arms:
        p = pool(arm, t)
        print(f"| {t} | {arm} | {fmt(p.get('hot n=1024'), 0)} | {fmt(p.get('hot n=T'), 0)} | {fmt(p.get('hot 5us'), 0)} | "
              f"{fmt(p.get('cold n=T'), 0)} |")
EOF
