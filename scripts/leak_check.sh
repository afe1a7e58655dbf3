#!/usr/bin/env bash
# Every device allocation is released at a clean exit: runs osprey on CUDA under
# compute-sanitizer's memcheck with its full leak check, twice (docs/server.md, "A failed
# device"):
#  1. `osprey generate --device cuda` on the embedded demo model;
#  2. `osprey serve --device cuda --port 0` on the embedded demo model: once it serves, one
#     completion through python3's urllib, then SIGTERM to the osprey process itself (the
#     sanitizer's child), and a bounded wait for both to end.
# Prints each run's LEAK SUMMARY and ERROR SUMMARY and exits 1 when a run reports a leak or an
# error, lacks either summary, or osprey exits non-zero; 0 when both are clean.
#
# Usage: scripts/leak_check.sh [OUT_DIR]    (from the repository root, on a machine with a GPU,
#        after a CUDA build: OSPREY_CMAKE_ARGS=-DOSPREY_CUDA=ON bash scripts/setup.sh)
# OUT_DIR (default: a temporary folder) keeps the sanitizer's and osprey's logs.
#
# Environment:
#   OSPREY_BIN          the osprey binary (default: build/osprey)
#   COMPUTE_SANITIZER   the sanitizer (default: compute-sanitizer on PATH, else
#                       /usr/local/cuda/bin/compute-sanitizer)
#   LEAK_CHECK_TIMEOUT  seconds each step may take under the sanitizer (default: 900)
set -euo pipefail

OSPREY_BIN=${OSPREY_BIN:-build/osprey}
TIMEOUT=${LEAK_CHECK_TIMEOUT:-900}
OUT=${1:-$(mktemp -d -t osprey-leak-check.XXXXXX)}
mkdir -p "$OUT"

SANITIZER=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
[[ -x $SANITIZER ]] || { echo "leak_check: compute-sanitizer not found (set COMPUTE_SANITIZER)" >&2; exit 1; }
[[ -x $OSPREY_BIN ]] || { echo "leak_check: $OSPREY_BIN not found (build osprey with CUDA first)" >&2; exit 1; }
SAN_ARGS=(--tool memcheck --leak-check full)

failed=0

# Prints a sanitizer log's summaries; fails the run unless both are present and clean.
check_log() {
  local name=$1 log=$2
  local leak err
  leak=$(grep -E '^=+ LEAK SUMMARY:' "$log" || true)
  err=$(grep -E '^=+ ERROR SUMMARY:' "$log" || true)
  echo "$name: ${leak:-no LEAK SUMMARY}"
  echo "$name: ${err:-no ERROR SUMMARY}"
  if [[ -z $leak || -z $err ]]; then
    echo "$name: FAILED: the sanitizer's summary is missing (log: $log)"
    failed=1
  elif ! grep -qE '^=+ LEAK SUMMARY: 0 bytes leaked in 0 allocations' "$log" ||
       ! grep -qE '^=+ ERROR SUMMARY: 0 errors' "$log"; then
    echo "$name: FAILED: leaks or errors reported (log: $log)"
    grep -E '^=+ (Leaked|Invalid|Program hit|Saved host backtrace)' "$log" | head -20 || true
    failed=1
  fi
}

# 1. generate.
echo "== osprey generate --device cuda under memcheck"
status=0
timeout "$TIMEOUT" "$SANITIZER" "${SAN_ARGS[@]}" --log-file "$OUT/generate.sanitizer.log" \
  "$OSPREY_BIN" generate --device cuda -p "Once upon a time" -n 32 >"$OUT/generate.out" 2>"$OUT/generate.err" ||
  status=$?
if [[ $status -ne 0 ]]; then
  echo "generate: FAILED: exit $status (stderr: $OUT/generate.err)"
  tail -5 "$OUT/generate.err" || true
  failed=1
fi
check_log generate "$OUT/generate.sanitizer.log"

# 2. serve: one request, then SIGTERM to osprey itself.
echo "== osprey serve --device cuda under memcheck"
"$SANITIZER" "${SAN_ARGS[@]}" --log-file "$OUT/serve.sanitizer.log" \
  "$OSPREY_BIN" serve --device cuda --port 0 >"$OUT/serve.out" 2>"$OUT/serve.err" &
san_pid=$!
# Never leaves the sanitizer or osprey behind, whatever happens below.
cleanup() { kill -KILL "$san_pid" 2>/dev/null || true; }
trap cleanup EXIT

port=""
for ((i = 0; i < TIMEOUT * 10; ++i)); do
  if grep -q 'serving ' "$OUT/serve.err" 2>/dev/null; then
    port=$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9]*\).*|\1|p' "$OUT/serve.err" | head -1)
    break
  fi
  kill -0 "$san_pid" 2>/dev/null || break
  sleep 0.1
done
serve_status=0
if [[ -z $port ]]; then
  echo "serve: FAILED: not serving within ${TIMEOUT}s (stderr: $OUT/serve.err)"
  tail -5 "$OUT/serve.err" || true
  failed=1
else
  if ! python3 - "$port" <<'PY'
import json, sys, urllib.request
port = int(sys.argv[1])
req = urllib.request.Request(
    f"http://127.0.0.1:{port}/v1/completions",
    data=json.dumps({"prompt": "Once upon a time", "max_tokens": 16}).encode(),
    headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=600) as r:
    body = json.load(r)
    text = body["choices"][0]["text"]
    print(f"serve: completion of {len(text)} characters, status {r.status}")
PY
  then
    echo "serve: FAILED: the completion request failed"
    failed=1
  fi
fi
# The osprey process itself (the sanitizer may start helpers of its own): the one running the
# osprey binary among the processes of this command line.
osprey_pid=""
osprey_exe=$(readlink -f "$OSPREY_BIN")
for p in $(pgrep -f -- "serve --device cuda --port 0" || true); do
  [[ $(readlink -f "/proc/$p/exe" 2>/dev/null) == "$osprey_exe" ]] && osprey_pid=$p
done
if [[ -z $osprey_pid ]]; then
  echo "serve: FAILED: no osprey process under the sanitizer ($san_pid)"
  failed=1
else
  kill -TERM "$osprey_pid"
fi
for ((i = 0; i < TIMEOUT * 10; ++i)); do
  kill -0 "$san_pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$san_pid" 2>/dev/null; then
  echo "serve: FAILED: still running ${TIMEOUT}s after SIGTERM"
  failed=1
  cleanup
fi
wait "$san_pid" || serve_status=$?
trap - EXIT
if [[ $serve_status -ne 0 ]]; then
  echo "serve: FAILED: exit $serve_status (stderr: $OUT/serve.err)"
  tail -5 "$OUT/serve.err" || true
  tail -5 "$OUT/serve.sanitizer.log" || true
  failed=1
fi
check_log serve "$OUT/serve.sanitizer.log"

echo "logs: $OUT"
if [[ $failed -ne 0 ]]; then
  echo "leak_check: FAILED"
  exit 1
fi
echo "leak_check: clean"
