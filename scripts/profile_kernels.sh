#!/usr/bin/env bash
# Per-kernel GPU time of one prefill and a few decode steps, from Nsight Compute
# (gpu__time_duration only, clocks left alone), summed by kernel name.
# Usage (GPU machine): scripts/profile_kernels.sh MODEL_DIR PROMPT_TOKENS DECODE_TOKENS OUT_PREFIX
set -euo pipefail
model=$1 n_prompt=$2 n_decode=$3 out=$4
ids=$(python3 -c "import random; random.seed(1); print(','.join(str(random.randrange(1000, 30000)) for _ in range($n_prompt)))")
ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
  build/osprey generate -m "$model" --device cuda --token-ids "$ids" -n "$n_decode" --ignore-eos \
  >"$out.csv" 2>"$out.err" || { tail -5 "$out.err"; exit 1; }
python3 - "$out.csv" <<'PY' | tee "$out.txt"
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]; rows = rows[1:]
ki, vi = head.index("Kernel Name"), head.index("Metric Value")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows:
    name = r[ki].split("(")[0][:90]
    tot[name] += float(r[vi].replace(",", "")) / 1e3; cnt[name] += 1
s = sum(tot.values())
print(f"{len(rows)} kernels, {s:.1f} us total")
for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:40]:
    print(f"{v:12.1f} us {100*v/s:5.1f}% {cnt[k]:6d}x {v/cnt[k]:9.2f} us/call  {k}")
PY
