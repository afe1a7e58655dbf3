#!/usr/bin/env bash
# Perplexity, KL divergence and same-top-1 of GGUF files of the demo model, by llama.cpp's
# llama-perplexity and by `osprey perplexity`, side by side, on the held-out test text of
# tools/demo_data.py. The base of the KL divergence is the F16 file `osprey convert --to gguf`
# writes (each tool writes its own base file from it, then reads it back with --kl-divergence).
# The files compared: Osprey's q8_0, q4_0 and q4_k conversions, and llama-quantize's Q4_K_M,
# Q5_K_M, Q6_K, Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 made from the F16 file.
#
# Both tools tokenize the whole text once with a BOS in front, cut it into 512-token chunks
# (54 here), evaluate each chunk from an empty cache with its first token replaced by BOS, and
# score the second half: the logits at positions [256, 511) predict the tokens after them
# (13,770 scored positions). The scored tokens are the same (checked here: the token arrays
# of the two base files are compared).
#
# Usage: scripts/gguf_perplexity_llamacpp.sh LLAMA_BUILD_DIR [OSPREY] [WORKDIR]
#   LLAMA_BUILD_DIR: a built llama.cpp (CPU) build folder holding bin/llama-perplexity and
#                    bin/llama-quantize.
# Prints a markdown table. THREADS (environment) sets both tools' threads (default: nproc).
set -euo pipefail
BIN=${1:?usage: $0 LLAMA_BUILD_DIR [OSPREY] [WORKDIR]}/bin
OSPREY=$(realpath "${2:-build/osprey}")
WORK=${3:-.gguf-perplexity}
THREADS=${THREADS:-$(nproc)}
CTX=512
mkdir -p "$WORK"
[ -f "$WORK/text/test.txt" ] || python3 tools/demo_data.py --out "$WORK/text" >/dev/null
TEXT="$WORK/text/test.txt"

for q in f16 q8_0 q4_0 q4_k; do
  [ -f "$WORK/demo-$q.gguf" ] || "$OSPREY" convert -m models/demo -o "$WORK/demo-$q.gguf" --to gguf --outtype "$q" >/dev/null
done
names=(q8_0 q4_0 q4_k)
for t in Q4_K_M Q5_K_M Q6_K Q8_0 Q4_0 Q4_1 Q5_0 Q5_1; do
  f="$WORK/demo-lq-$t.gguf"
  [ -f "$f" ] || "$BIN/llama-quantize" "$WORK/demo-f16.gguf" "$f" "$t" >"$WORK/quantize-$t.log" 2>&1
  names+=("lq-$t")
done

lp() { "$BIN/llama-perplexity" -c "$CTX" -t "$THREADS" -f "$TEXT" "$@"; }
op() { "$OSPREY" perplexity --device cpu -c "$CTX" -t "$THREADS" -f "$TEXT" -o json "$@"; }

# A run whose output is already complete in WORKDIR is not repeated (delete WORKDIR to redo all).
# llama-perplexity's output is checked for its closing line and the run repeated once if it
# is missing (an output once came back cut short, with status 0).
llama_run() {  # OUT FINAL_LINE ARGS...
  local out=$1 final=$2; shift 2
  grep -q "$final" "$out" 2>/dev/null && return 0
  lp "$@" > "$out" 2>&1; grep -q "$final" "$out" && return 0
  echo "llama-perplexity output $out incomplete, running it again" >&2
  lp "$@" > "$out" 2>&1; grep -q "$final" "$out" || { echo "llama-perplexity failed: $out" >&2; exit 1; }
}
osprey_run() {  # OUT ARGS...
  local out=$1; shift
  [ -s "$out" ] && python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$out" 2>/dev/null && return 0
  op "$@" > "$out"
}
[ -f "$WORK/osprey-base.kld" ] || rm -f "$WORK/osprey-f16.json"
[ -f "$WORK/llama-base.kld" ] || rm -f "$WORK/llama-f16.out"
llama_run "$WORK/llama-f16.out" "Final estimate: PPL" -m "$WORK/demo-f16.gguf" --kl-divergence-base "$WORK/llama-base.kld"
osprey_run "$WORK/osprey-f16.json" -m "$WORK/demo-f16.gguf" --kl-divergence-base "$WORK/osprey-base.kld"
for n in "${names[@]}"; do
  llama_run "$WORK/llama-$n.out" "^Same top p:" -m "$WORK/demo-$n.gguf" --kl-divergence-base "$WORK/llama-base.kld" --kl-divergence
  osprey_run "$WORK/osprey-$n.json" -m "$WORK/demo-$n.gguf" --kl-divergence-base "$WORK/osprey-base.kld" --kl-divergence
done

# Cross check, the two tools on the same file: Osprey writes its log-probs of the file as a base
# file, which is rewritten in llama.cpp's base layout (the same u16 levels: Osprey's rows span the
# row's whole range, llama.cpp's only the 16 nats below the maximum), and llama-perplexity
# --kl-divergence of the same file reads it: the KLD between llama.cpp's and Osprey's
# distributions on one file.
to_llama_base() {
  python3 - "$1" "$2" <<'PY'
import struct, sys
with open(sys.argv[1], "rb") as f, open(sys.argv[2], "wb") as o:
    h = f.read(24); assert h[:8] == b"OSPKLD01"
    c, v, n, k = struct.unpack("<IIII", h[8:24])
    o.write(b"_logits_" + struct.pack("<iii", c, v, n) + f.read(4 * k))
    pad = b"\0" * (2 * (2 * ((v + 1) // 2) - v))  # llama.cpp's row: 4 u16 (f32 step, f32 min), levels, even
    for _ in range(n * (c - 1 - c // 2)):
        mn, step = struct.unpack("<ff", f.read(8))
        o.write(struct.pack("<ff", step, mn) + f.read(2 * v) + pad)
    assert f.read(1) == b""
PY
}
for n in f16 "${names[@]}"; do
  out="$WORK/cross-$n.out"
  grep -q "^Same top p:" "$out" 2>/dev/null && continue
  op -m "$WORK/demo-$n.gguf" --kl-divergence-base "$WORK/cross-osprey.kld" > /dev/null
  to_llama_base "$WORK/cross-osprey.kld" "$WORK/cross-llama.kld"
  llama_run "$out" "^Same top p:" -m "$WORK/demo-$n.gguf" --kl-divergence-base "$WORK/cross-llama.kld" --kl-divergence
  rm -f "$WORK/cross-osprey.kld" "$WORK/cross-llama.kld"
done

python3 - "$WORK" "${names[@]}" <<'PY'
import json, re, struct, sys
w, names = sys.argv[1], sys.argv[2:]

# The tokens of both base files: llama.cpp's '_logits_', i32 n_ctx, n_vocab, n_chunk, then the
# i32 tokens; Osprey's 'OSPKLD01', u32 chunk length, vocab, chunks, tokens, then the i32 tokens.
def tokens(path, llama):
    with open(path, "rb") as f:
        h = f.read(24)
        if llama:
            assert h[:8] == b"_logits_"; c, v, n = struct.unpack("<iii", h[8:20]); f.seek(20); k = c * n
        else:
            assert h[:8] == b"OSPKLD01"; c, v, n, k = struct.unpack("<IIII", h[8:24])
        return c, n, struct.unpack(f"<{k}i", f.read(4 * k))
lc, ln, lt = tokens(f"{w}/llama-base.kld", True)
oc, on, ot = tokens(f"{w}/osprey-base.kld", False)
same = (lc, ln) == (oc, on) and lt == ot[:len(lt)]
print(f"chunks: llama.cpp {ln} x {lc}, osprey {on} x {oc}; tokens of the chunks identical: {'yes' if same else 'NO'}")

def llama(n):
    t = open(f"{w}/llama-{n}.out", encoding="utf-8", errors="replace").read()
    num = r"([0-9.]+)\s*±\s*([0-9.]+)"
    if n == "f16":
        m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", t)
        return dict(ppl=float(m[1]), ppl_err=float(m[2]))
    ppl = re.search(r"Mean PPL\(Q\)\s*:\s*" + num, t); base = re.search(r"Mean PPL\(base\)\s*:\s*" + num, t)
    kld = re.search(r"Mean\s+KLD:\s*" + num, t); top = re.search(r"Same top p:\s*" + num, t)
    return dict(ppl=float(ppl[1]), ppl_err=float(ppl[2]), base=float(base[1]), kld=float(kld[1]),
                kld_err=float(kld[2]), top=float(top[1]), top_err=float(top[2]))

def osprey(n):
    j = json.load(open(f"{w}/osprey-{n}.json"))
    r = dict(ppl=j["ppl"], ppl_err=j["ppl_err"])
    if "kl_divergence" in j:
        k = j["kl_divergence"]
        r.update(base=k["base_ppl"], kld=k["mean"], kld_err=k["mean_err"], top=100 * k["same_top_p"],
                 top_err=100 * k["same_top_p_err"])
    return r

def within(o, l):
    return "yes" if abs(o - l) <= 0.10 * abs(l) else "NO"

print()
print("| file | made by | PPL llama.cpp | PPL osprey | mean KLD llama.cpp | mean KLD osprey | same top-1 llama.cpp | same top-1 osprey | osprey within 10% (PPL / KLD / top-1) |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
for n in ["f16"] + names:
    l, o = llama(n), osprey(n)
    by = "llama-quantize" if n.startswith("lq-") else "osprey convert"
    label = n[3:] if n.startswith("lq-") else n
    if n == "f16":
        print(f"| {label} (base) | {by} | {l['ppl']:.4f} ± {l['ppl_err']:.4f} | {o['ppl']:.4f} ± {o['ppl_err']:.4f} | - | - | - | - | {within(o['ppl'], l['ppl'])} / - / - |")
        continue
    print(f"| {label} | {by} | {l['ppl']:.4f} ± {l['ppl_err']:.4f} | {o['ppl']:.4f} ± {o['ppl_err']:.4f} "
          f"| {l['kld']:.6f} ± {l['kld_err']:.6f} | {o['kld']:.6f} ± {o['kld_err']:.6f} "
          f"| {l['top']:.2f} ± {l['top_err']:.2f} % | {o['top']:.2f} ± {o['top_err']:.2f} % "
          f"| {within(o['ppl'], l['ppl'])} / {within(o['kld'], l['kld'])} / {within(o['top'], l['top'])} |")
l, o = llama(names[0]), osprey(names[0])
print(f"\nPPL(base) as each tool's --kl-divergence run reads it back from its base file: llama.cpp {l['base']:.4f}, osprey {o['base']:.4f}")
print()
print("Cross check: llama.cpp's distribution on each file against Osprey's on the same file")
print()
print("| file | made by | mean KLD | max KLD | same top-1 |")
print("| --- | --- | ---: | ---: | ---: |")
for n in ["f16"] + names:
    t = open(f"{w}/cross-{n}.out", encoding="utf-8", errors="replace").read()
    kld = re.search(r"Mean\s+KLD:\s*([0-9.]+)\s*±\s*([0-9.]+)", t); mx = re.search(r"Maximum KLD:\s*([0-9.]+)", t)
    top = re.search(r"Same top p:\s*([0-9.]+)\s*±\s*([0-9.]+)", t)
    by = "llama-quantize" if n.startswith("lq-") else "osprey convert"
    print(f"| {n[3:] if n.startswith('lq-') else n} | {by} | {float(kld[1]):.6f} ± {float(kld[2]):.6f} | {float(mx[1]):.6f} | {float(top[1]):.2f} ± {float(top[2]):.2f} % |")
PY
