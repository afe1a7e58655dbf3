#!/usr/bin/env bash
# Time to first token of a long prompt restored from a prompt-cache file against recomputed,
# beside the disk's sequential read rate, and the file's bytes per cached token
# (docs/benchmarks.md, "Persistent prompt cache"; issue 53, point 4).
#
# Usage: scripts/bench_prompt_cache.sh MODEL_DIR OUT_DIR
#
# From the repository root, after `cmake --build build`. For each length L of LENGTHS, with a
# prompt of L random token ids, REPS rounds of:
#  1. recompute: `osprey generate -n 1 --json` without a file; its TTFT is timings.prompt_ms;
#  2. write:     the same with --prompt-cache F (F removed first): computes, then saves F;
#  3. cold:      F dropped from the page cache (posix_fadvise DONTNEED: its pages are clean after
#                the writer's fsync), then the same run: it restores L - 1 tokens from F and
#                computes one; its TTFT is timings.cache_restore_ms + timings.prompt_ms, and the
#                restore reads F at cache_read_bytes / cache_restore_ms;
#  4. warm:      the same again, F in the page cache.
# The disk's sequential read rate is `dd iflag=direct bs=16M` of a file of DISK_TEST_MIB (or the
# largest F's size, if larger) written beside the files and dropped from the page cache first
# (without O_DIRECT, a plain dd after the drop). Medians over the rounds go to
# OUT_DIR/summary.md and summary.json, each run's JSON to OUT_DIR/raw/.
#
# Environment:
#   OSPREY_BIN  the osprey binary (default: build/osprey)
#   DEVICE      cpu, cuda or cuda:N (default: cpu)
#   LENGTHS     prompt lengths in tokens (default "1024 4096 16384"; each at most the model's context)
#   REPS        rounds (default 3)
#   FILES_DIR   where the cache files go: the disk being measured (default OUT_DIR/files)
#   DISK_TEST_MIB  size of the file the disk's read rate is measured on (default 1024)
#   THREADS     osprey's -t (default: osprey's own choice)
#   PYTHON      python3 (default python3; the standard library only)
set -euo pipefail

if [[ $# -ne 2 || $1 == -h || $1 == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit $([[ $# -eq 2 ]] && echo 0 || echo 2)
fi
MODEL=$1
OUT=$2
OSPREY_BIN=${OSPREY_BIN:-build/osprey}
DEVICE=${DEVICE:-cpu}
LENGTHS=${LENGTHS:-"1024 4096 16384"}
REPS=${REPS:-3}
FILES_DIR=${FILES_DIR:-$OUT/files}
PYTHON=${PYTHON:-python3}
DISK_TEST_MIB=${DISK_TEST_MIB:-1024}
THREADS_FLAG=${THREADS:+-t $THREADS}
mkdir -p "$OUT/raw" "$FILES_DIR"

vocab=$("$PYTHON" -c 'import json,sys; c=json.load(open(sys.argv[1]+"/config.json")); print(c.get("vocab_size") or c["text_config"]["vocab_size"])' "$MODEL")

drop_from_page_cache() {
  "$PYTHON" - "$1" <<'PY'
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
os.fsync(fd)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
os.close(fd)
PY
}

run() {  # run NAME ARGS...: one generate, its JSON to raw/NAME.json
  local name=$1
  shift
  "$OSPREY_BIN" generate -m "$MODEL" --device "$DEVICE" $THREADS_FLAG -q --json -n 1 --ignore-eos "$@" \
    >"$OUT/raw/$name.json"
}

largest=""
for L in $LENGTHS; do
  ids=$("$PYTHON" -c 'import random,sys; r=random.Random(int(sys.argv[1])); print(",".join(str(r.randrange(3, int(sys.argv[2]))) for _ in range(int(sys.argv[1]))))' "$L" "$vocab")
  F="$FILES_DIR/prompt-$L.oskv"
  for rep in $(seq 1 "$REPS"); do
    echo "bench_prompt_cache: L=$L round $rep" >&2
    run "L$L-r$rep-recompute" --token-ids "$ids"
    rm -f "$F"
    run "L$L-r$rep-write" --token-ids "$ids" --prompt-cache "$F"
    drop_from_page_cache "$F"
    run "L$L-r$rep-cold" --token-ids "$ids" --prompt-cache "$F"
    run "L$L-r$rep-warm" --token-ids "$ids" --prompt-cache "$F"
  done
  largest=$F
done

# The disk's sequential read rate: a file of DISK_TEST_MIB (at least the largest cache file)
# written beside the cache files, dropped from the page cache, read back in 16 MiB blocks.
probe="$FILES_DIR/disk-probe.bin"
mib=$(( $(stat -c %s "$largest") >> 20 ))
(( mib < DISK_TEST_MIB )) && mib=$DISK_TEST_MIB
dd if=/dev/urandom of="$probe" bs=16M count=$(( (mib + 15) / 16 )) iflag=fullblock status=none
drop_from_page_cache "$probe"
if ! dd if="$probe" of=/dev/null bs=16M iflag=direct 2>"$OUT/raw/dd.txt"; then
  drop_from_page_cache "$probe"
  dd if="$probe" of=/dev/null bs=16M 2>"$OUT/raw/dd.txt"
fi
rm -f "$probe"

"$PYTHON" - "$OUT" "$LENGTHS" "$REPS" "$FILES_DIR" "$DEVICE" <<'PY'
import json, os, re, statistics, sys
out, lengths, reps, files, device = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4], sys.argv[5]
def load(name):
    with open(os.path.join(out, "raw", name + ".json")) as f:
        return json.loads(f.read().strip().splitlines()[-1])
dd = open(os.path.join(out, "raw", "dd.txt")).read()
m = re.search(r"(\d+) bytes.*copied, ([\d.]+) s", dd)
disk = int(m.group(1)) / float(m.group(2)) / 1e9 if m else float("nan")
rows = []
for L in lengths:
    med = lambda xs: statistics.median(xs)
    rec = [load(f"L{L}-r{r}-recompute")["timings"]["prompt_ms"] for r in range(1, reps + 1)]
    cold = [load(f"L{L}-r{r}-cold") for r in range(1, reps + 1)]
    warm = [load(f"L{L}-r{r}-warm") for r in range(1, reps + 1)]
    ttft = lambda j: j["timings"]["cache_restore_ms"] + j["timings"]["prompt_ms"]
    size = os.path.getsize(os.path.join(files, f"prompt-{L}.oskv"))
    row = {
        "tokens": int(L),
        "cached_tokens": cold[0]["cached_tokens"],
        "recompute_ttft_ms": med(rec),
        "cold_ttft_ms": med([ttft(j) for j in cold]),
        "cold_restore_ms": med([j["timings"]["cache_restore_ms"] for j in cold]),
        "warm_ttft_ms": med([ttft(j) for j in warm]),
        "warm_restore_ms": med([j["timings"]["cache_restore_ms"] for j in warm]),
        "file_bytes": size,
        "bytes_per_token": size / int(L),
    }
    row["cold_read_gbps"] = size / (row["cold_restore_ms"] / 1e3) / 1e9
    row["cold_share_of_disk"] = row["cold_read_gbps"] / disk if disk == disk else None
    rows.append(row)
summary = {"device": device, "disk_sequential_read_gbps": disk, "rows": rows}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
with open(os.path.join(out, "summary.md"), "w") as f:
    f.write(f"Device: {device}. Disk sequential read (dd, O_DIRECT where it works): {disk:.2f} GB/s. "
            f"Medians of {reps} rounds.\n\n")
    f.write("| prompt tokens | recompute TTFT ms | restored cold TTFT ms (restore ms) | restored warm TTFT ms (restore ms) "
            "| speed-up cold | file MiB | bytes / token | cold restore read GB/s | share of disk rate |\n")
    f.write("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for r in rows:
        share = f"{100 * r['cold_share_of_disk']:.0f}%" if r["cold_share_of_disk"] is not None else "n/a"
        f.write(f"| {r['tokens']} | {r['recompute_ttft_ms']:.1f} | {r['cold_ttft_ms']:.1f} ({r['cold_restore_ms']:.1f}) "
                f"| {r['warm_ttft_ms']:.1f} ({r['warm_restore_ms']:.1f}) | {r['recompute_ttft_ms'] / r['cold_ttft_ms']:.1f}x "
                f"| {r['file_bytes'] / 2**20:.1f} | {r['bytes_per_token']:.0f} | {r['cold_read_gbps']:.2f} | {share} |\n")
print(open(os.path.join(out, "summary.md")).read())
PY
