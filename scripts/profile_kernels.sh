#!/usr/bin/env bash
# Per-kernel GPU time and DRAM traffic of a decode run, from Nsight Compute (clocks left
# alone), summed by kernel name, with each kernel's achieved read bandwidth.
#
# Usage (GPU machine): scripts/profile_kernels.sh MODEL_DIR PROMPT_TOKENS DECODE_TOKENS OUT_PREFIX
#
# Environment:
#   OSPREY_BIN    the osprey binary (default: build/osprey)
#   LAUNCH_SKIP   kernels to skip before profiling (default 0): skip the load and the prefill
#                 to profile decode steps alone
#   LAUNCH_COUNT  kernels to profile (default: all)
# Writes OUT_PREFIX.csv (ncu's raw rows) and OUT_PREFIX.txt (the summary).
set -euo pipefail
if [[ $# -lt 4 ]]; then sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2; fi
model=$1 n_prompt=$2 n_decode=$3 out=$4
bin=${OSPREY_BIN:-build/osprey}
range=(--launch-skip "${LAUNCH_SKIP:-0}")
[[ -n ${LAUNCH_COUNT:-} ]] && range+=(--launch-count "$LAUNCH_COUNT")
ids=$(python3 -c "import random; random.seed(1); print(','.join(str(random.randrange(1000, 30000)) for _ in range($n_prompt)))")
ncu --clock-control none "${range[@]}" --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --print-units base \
  --log-file "$out.csv" \
  "$bin" generate -m "$model" --device cuda --token-ids "$ids" -n "$n_decode" --ignore-eos \
  >"$out.out" 2>"$out.err" || { tail -5 "$out.err"; exit 1; }
python3 - "$out.csv" <<'PY' | tee "$out.txt"
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]; rows = rows[1:]
ki, mi, vi = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
ii = head.index("ID")
per = collections.defaultdict(dict)  # launch id -> metric -> value
name = {}
for r in rows:
    per[r[ii]][r[mi]] = float(r[vi].replace(",", ""))
    name[r[ii]] = r[ki].split("(")[0][:80]
tot = collections.defaultdict(float); byt = collections.defaultdict(float); cnt = collections.Counter()
for i, m in per.items():
    k = name[i]
    tot[k] += m.get("gpu__time_duration.sum", 0.0) / 1e3
    byt[k] += m.get("dram__bytes_read.sum", 0.0)
    cnt[k] += 1
s = sum(tot.values()); b = sum(byt.values())
print(f"{len(per)} kernels, {s:.1f} us, {b / 1e9:.3f} GB read, {b / (s * 1e3) if s else 0:.0f} GB/s overall")
print(f"{'us':>10} {'share':>6} {'calls':>6} {'us/call':>9} {'GB/s':>6}  kernel")
for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:40]:
    print(f"{v:10.1f} {100 * v / s:5.1f}% {cnt[k]:6d} {v / cnt[k]:9.2f} {byt[k] / (v * 1e3) if v else 0:6.0f}  {k}")
PY
