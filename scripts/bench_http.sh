#!/usr/bin/env bash
# HTTP load benchmark of `osprey serve` with wrk (Debian's `wrk`): non-streaming completions
# on the CPU demo model at several connection counts, each connection sending its next
# request as soon as the last is answered. Prints a markdown table: requests/s, p50 and p99
# latency, and the non-2xx responses and socket errors wrk counted (a run with any is not a
# result: a fast 429 is not a fast answer).
#
# Usage: scripts/bench_http.sh [OSPREY_BIN] [LABEL]
#
# Environment:
#   CONNECTIONS   connection counts (default "32 64 256")
#   DURATION      each run's length (default 20s)
#   PARALLEL      the server's -np (default 8)
#   MAX_TOKENS    tokens per reply (default 8)
#   SERVE_FLAGS   more flags for osprey serve (default: --max-queue 1024 --threads-http 512, so
#                 that 256 connections are admitted, not refused)
#   PORT          default 18931
set -euo pipefail

if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
fi
bin=${1:-build/osprey}
label=${2:-$(git rev-parse --short HEAD 2>/dev/null || echo osprey)}
connections=${CONNECTIONS:-32 64 256}
duration=${DURATION:-20s}
parallel=${PARALLEL:-8}
max_tokens=${MAX_TOKENS:-8}
serve_flags=${SERVE_FLAGS:---max-queue 1024 --threads-http 512}
port=${PORT:-18931}
command -v wrk >/dev/null || { echo "bench_http: wrk not found (scripts/setup.sh --tests installs it)" >&2; exit 1; }

work=$(mktemp -d)
log=$work/serve.log
# shellcheck disable=SC2086
"$bin" serve --port "$port" -np "$parallel" $serve_flags >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 1 300); do
  python3 -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=1)" \
    "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.1
done

cat >"$work/post.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"prompt": "Once upon a time", "max_tokens": $max_tokens, "temperature": 0, "ignore_eos": true}'
EOF

# A short unmeasured run first: the first requests pay for warming caches and threads.
wrk -t2 -c8 -d3s -s "$work/post.lua" "http://127.0.0.1:$port/v1/completions" >/dev/null

echo "| build | connections | requests/s | p50 | p99 | p99 / p50 | non-2xx | socket errors |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for c in $connections; do
  threads=$(( c < 4 ? c : 4 ))
  out=$(wrk -t"$threads" -c"$c" -d"$duration" --timeout 30s --latency -s "$work/post.lua" \
        "http://127.0.0.1:$port/v1/completions")
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
  p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' <<<"$out")
  errors=$(awk -F'Socket errors: ' '/Socket errors:/ {print $2}' <<<"$out")
  ratio=$(python3 - "$p50" "$p99" <<'PY'
import re, sys
def ms(s):
    v, u = re.fullmatch(r"([0-9.]+)(us|ms|s|m)", s).groups()
    return float(v) * {"us": 1e-3, "ms": 1, "s": 1e3, "m": 6e4}[u]
print("%.2f" % (ms(sys.argv[2]) / ms(sys.argv[1])))
PY
)
  echo "| $label | $c | $rps | $p50 | $p99 | $ratio | ${non2xx:-0} | ${errors:-none} |"
done
