#!/usr/bin/env bash
# Perplexity and KL divergence of the demo model's conversions against the bf16 model on the
# held-out test text of tools/demo_data.py. Usage: scripts/perplexity_demo.sh [OSPREY] [WORKDIR] [extra flags]
set -euo pipefail
OSPREY=${1:-build/osprey}
WORK=${2:-.perplexity-demo}
shift $(( $# > 2 ? 2 : $# )) || true
mkdir -p "$WORK"
[ -f "$WORK/text/test.txt" ] || python3 tools/demo_data.py --out "$WORK/text"
TEXT="$WORK/text/test.txt"
"$OSPREY" perplexity -m models/demo -f "$TEXT" --kl-divergence-base "$WORK/base.kld" -o json "$@" > "$WORK/base.json"
for q in "mlx 4 64" "mlx 8 64"; do
  set -- $q
  out="$WORK/demo-q$2-g$3"
  [ -d "$out" ] || "$OSPREY" convert -m models/demo -o "$out" --to "$1" --q-bits "$2" --q-group-size "$3"
  "$OSPREY" perplexity -m "$out" -f "$TEXT" --kl-divergence-base "$WORK/base.kld" --kl-divergence -o json \
    > "$WORK/q$2-g$3.json"
done
out="$WORK/demo-fp8"
[ -d "$out" ] || "$OSPREY" convert -m models/demo -o "$out" --to fp8
"$OSPREY" perplexity -m "$out" -f "$TEXT" --kl-divergence-base "$WORK/base.kld" --kl-divergence -o json > "$WORK/fp8.json"
python3 - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]
b = json.load(open(f"{w}/base.json"))
print("| model | PPL | mean KLD vs bf16 | same top-1 vs bf16 |")
print("| --- | ---: | ---: | ---: |")
print(f"| bf16 | {b['ppl']:.4f} +/- {b['ppl_err']:.4f} | - | - |")
for n in ("q8-g64", "q4-g64", "fp8"):
    j = json.load(open(f"{w}/{n}.json")); k = j["kl_divergence"]
    print(f"| {n} | {j['ppl']:.4f} +/- {j['ppl_err']:.4f} | {k['mean']:.6f} +/- {k['mean_err']:.6f} | "
          f"{100*k['same_top_p']:.2f} +/- {100*k['same_top_p_err']:.2f} % |")
PY
