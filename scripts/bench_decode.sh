#!/usr/bin/env bash
# Decode benchmark of the two KV write arms (docs/benchmarks.md).
#
# Usage: scripts/bench_decode.sh MODEL_DIR...
#
# For each model, each round runs every configuration below once per arm, in separate
# processes, the arms alternating (in place, copying, in place, copying, ...):
#   prompt  -p 512,2048 -n 0              pp512, pp2048
#   decode  -p 0 -n 128 -d $DEPTHS        tg128, tg128 @ d2048, tg128 @ d8192
#   memory  -p 0 -n 512 -d 2048           tg512 @ d2048: a 2048-token context plus 512
#                                         generated tokens; its peaks are the memory table
# each with `-r 1 -o json`, so every round gives one sample per test and arm. It prints a
# markdown summary (medians, min-max ranges, in-place/copying ratios), writes it to
# $OUT_DIR/summary.md with the raw json under $OUT_DIR/raw/, and plots decode t/s against
# depth for both arms as $OUT_DIR/<model>-decode-vs-depth.png (gnuplot).
#
# Environment:
#   OSPREY_BIN  the osprey binary (default: build/osprey in the repository)
#   ROUNDS      rounds (default 6)
#   DEPTHS      depths of the decode sweep, comma-separated (default 0,2048,8192)
#   OUT_DIR     output folder (default ./bench-out)
#   WARMUP      unmeasured runs per test in each process (default 1)
#   THREADS     passed as -t when set
#   CONFIGS     the configurations to run (default "prompt decode memory")
#   SKIP_RUN    when 1, runs nothing and summarises the json already in $OUT_DIR/raw
set -euo pipefail

if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit $(( $# < 1 ? 2 : 0 ))
fi

OSPREY_BIN=${OSPREY_BIN:-$(cd "$(dirname "$0")/.." && pwd)/build/osprey}
ROUNDS=${ROUNDS:-6}
DEPTHS=${DEPTHS:-0,2048,8192}
OUT_DIR=${OUT_DIR:-./bench-out}
WARMUP=${WARMUP:-1}
CONFIGS=${CONFIGS:-prompt decode memory}
SKIP_RUN=${SKIP_RUN:-0}
PYTHON=${PYTHON:-python3}

[[ $SKIP_RUN == 1 || -x $OSPREY_BIN ]] || { echo "bench_decode.sh: no osprey binary at $OSPREY_BIN (set OSPREY_BIN)" >&2; exit 1; }
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "bench_decode.sh: ROUNDS=$ROUNDS is not a positive integer" >&2; exit 1; }
[[ $DEPTHS =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "bench_decode.sh: DEPTHS=$DEPTHS is not a comma-separated list" >&2; exit 1; }
for model in "$@"; do
  [[ -f $model/config.json ]] || { echo "bench_decode.sh: $model has no config.json" >&2; exit 1; }
done

mkdir -p "$OUT_DIR/raw"
common=(-r 1 --warmup "$WARMUP" -o json)
[[ -n ${THREADS:-} ]] && common+=(-t "$THREADS")
declare -A CONFIG=(
  [prompt]="-p 512,2048 -n 0"
  [decode]="-p 0 -n 128 -d $DEPTHS"
  [memory]="-p 0 -n 512 -d 2048"
)
ARMS=(1 0)  # OSPREY_KV_INPLACE_WRITE: in place, copying

for cfg in $CONFIGS; do
  [[ -n ${CONFIG[$cfg]:-} ]] || { echo "bench_decode.sh: unknown configuration $cfg in CONFIGS" >&2; exit 1; }
done

for model in "$@"; do
  [[ $SKIP_RUN == 1 ]] && break
  name=$(basename "$(cd "$model" && pwd)")
  rm -f "$OUT_DIR/raw/$name"-r[0-9]*-{prompt,decode,memory}-kv[01].json
  for ((round = 1; round <= ROUNDS; ++round)); do
    for cfg in $CONFIGS; do
      for arm in "${ARMS[@]}"; do
        out="$OUT_DIR/raw/$name-r$round-$cfg-kv$arm.json"
        echo "bench_decode.sh: $name round $round/$ROUNDS $cfg OSPREY_KV_INPLACE_WRITE=$arm" >&2
        # shellcheck disable=SC2086
        OSPREY_KV_INPLACE_WRITE=$arm "$OSPREY_BIN" bench -m "$model" ${CONFIG[$cfg]} "${common[@]}" >"$out.tmp"
        mv "$out.tmp" "$out"
      done
    done
  done
done

"$PYTHON" - "$OUT_DIR" "$@" <<'EOF'
import json, os, re, statistics, subprocess, sys

out_dir, models = sys.argv[1], sys.argv[2:]
ARMS = {"1": "in place", "0": "copying"}

def rng(xs):
    return f"{min(xs):.2f}–{max(xs):.2f}"

def threads(n):
    return f"{n} thread" + ("" if n == 1 else "s")

def mib(b):
    return f"{b / 2**20:.2f} MiB"

lines = []
plots = []
for model in models:
    name = os.path.basename(os.path.realpath(model))
    runs = {}  # (cfg, arm) -> [(round, json)]
    pattern = re.compile(re.escape(name) + r"-r(\d+)-(prompt|decode|memory)-kv([01])\.json")
    for file in sorted(os.listdir(os.path.join(out_dir, "raw"))):
        match = pattern.fullmatch(file)
        if not match:
            continue
        rnd, cfg, arm = match.groups()
        with open(os.path.join(out_dir, "raw", file)) as f:
            runs.setdefault((cfg, arm), []).append((int(rnd), json.load(f)))
    if not runs:
        continue
    first = next(iter(runs.values()))[0][1]
    m, mach = first["model"], first["machine"]
    n_rounds = max(r for v in runs.values() for r, _ in v)
    lines.append(f"### {name}")
    lines.append("")
    lines.append(f"- osprey {first['osprey']['version']} ({first['osprey']['commit']}); "
                 f"{mach['backend']}: {mach['cpu']}, {threads(mach['n_threads'])}")
    lines.append(f"- model: {m['model_type']}, {m['weight_dtype']}, {m['weight_bytes']} weight bytes "
                 f"({mib(m['weight_bytes'])}), {m['n_params']} params")
    lines.append(f"- {n_rounds} rounds, arms interleaved in separate processes, one sample per test, "
                 f"process and round; t/s as median (min–max); ratio = in-place median / copying median, "
                 f"and in brackets the range of the per-round ratios (each round's in-place sample over "
                 f"its copying sample)")
    lines.append("")
    lines.append("| test | in place t/s | copying t/s | in place / copying | rounds in place faster |")
    lines.append("| --- | ---: | ---: | ---: | ---: |")
    # samples[(test, arm)] = {round: tps}
    samples, order = {}, []
    for cfg in ("prompt", "decode", "memory"):
        for arm in ARMS:
            for rnd, j in sorted(runs.get((cfg, arm), []), key=lambda x: x[0]):
                for t in j["tests"]:
                    if t["name"] not in order:
                        order.append(t["name"])
                    samples.setdefault((t["name"], arm), {})[rnd] = t["samples_ts"][0]
    for test in order:
        a, b = samples.get((test, "1"), {}), samples.get((test, "0"), {})
        if not a or not b:
            continue
        ma, mb = statistics.median(a.values()), statistics.median(b.values())
        paired = [a[r] / b[r] for r in a if r in b and b[r] > 0]
        ratio = f"{ma / mb:.3f} [{min(paired):.3f}–{max(paired):.3f}]" if paired and mb > 0 else "n/a"
        wins = f"{sum(x > 1 for x in paired)}/{len(paired)}"
        lines.append(f"| {test} | {ma:.2f} ({rng(a.values())}) | {mb:.2f} ({rng(b.values())}) | {ratio} | {wins} |")
    lines.append("")

    mem = {arm: [j for _, j in sorted(runs.get(("memory", arm), []), key=lambda x: x[0])] for arm in ARMS}
    if all(mem.values()):
        lines.append("Peak memory at 2048 + 512 (tg512 @ d2048: a 2048-token context, then 512 generated "
                     "tokens; medians over rounds, min–max in brackets):")
        lines.append("")
        lines.append("| arm | decode t/s | peak RSS | peak alloc | peak reserved | kv writes in place / copying | kv bytes copied |")
        lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for arm, label in ARMS.items():
            ts = [j["tests"][0] for j in mem[arm]]
            def col(key):
                xs = [t["memory"][key] for t in ts]
                return f"{mib(statistics.median(xs))} ({min(xs) / 2**20:.2f}–{max(xs) / 2**20:.2f})"
            tps = [t["samples_ts"][0] for t in ts]
            kv = ts[0]["kv"]
            scope = "" if all(t["memory"]["rss_scope"] == "test" for t in ts) else " (process)"
            lines.append(f"| {label} | {statistics.median(tps):.2f} ({rng(tps)}) | {col('peak_rss_bytes')}{scope} | "
                         f"{col('peak_alloc_bytes')} | {col('peak_reserved_bytes')} | "
                         f"{kv['inplace_writes']} / {kv['copying_writes']} | {kv['bytes_copied']} |")
        lines.append("")

    # Decode t/s against depth: median and range per arm.
    rows = []
    for test in order:
        if not test.startswith("tg128"):
            continue
        depth = int(test.split(" @ d")[1]) if " @ d" in test else 0
        row = [depth]
        for arm in ARMS:
            xs = list(samples.get((test, arm), {}).values())
            row += [statistics.median(xs), min(xs), max(xs)] if xs else [float("nan")] * 3
        rows.append(row)
    if rows:
        dat = os.path.join(out_dir, f"{name}-decode-vs-depth.dat")
        with open(dat, "w") as f:
            f.write("# depth inplace_median inplace_min inplace_max copying_median copying_min copying_max\n")
            for row in sorted(rows):
                f.write(" ".join(f"{x:g}" for x in row) + "\n")
        plots.append((name, dat, os.path.join(out_dir, f"{name}-decode-vs-depth.png"), mach, m))

summary = "\n".join(lines)
print(summary)
with open(os.path.join(out_dir, "summary.md"), "w") as f:
    f.write(summary + "\n")

for name, dat, png, mach, m in plots:
    script = f"""
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {{ set terminal pngcairo size 900,540 }} else {{ set terminal png size 900,540 }}
set output "{png}"
set termoption noenhanced
set offsets graph 0.03, graph 0.03, graph 0.05, graph 0.05
set autoscale xfix
set autoscale yfix
set title "{name} ({m['model_type']} {m['weight_dtype']}): tg128 decode vs depth\\n{mach['cpu']}, {threads(mach['n_threads'])}"
set xlabel "depth (tokens in the cache)"
set ylabel "tokens/s, log scale (median, bars: min-max)"
set logscale y
set key outside bottom center horizontal
set grid
plot "{dat}" using 1:2:3:4 with yerrorlines lw 2 pt 7 title "in place (OSPREY_KV_INPLACE_WRITE=1)", \\
     "{dat}" using 1:5:6:7 with yerrorlines lw 2 pt 5 title "copying (OSPREY_KV_INPLACE_WRITE=0)"
"""
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
        print(f"\nplot: {png}", file=sys.stderr)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"bench_decode.sh: no plot for {name} ({e}); install gnuplot-nox", file=sys.stderr)
EOF
