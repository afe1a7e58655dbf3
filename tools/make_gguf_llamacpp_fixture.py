#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/llamacpp/demo_greedy.json: llama.cpp's greedy token ids on the
GGUF files `osprey convert --to gguf` writes of the demo model (f16, q8_0, q4_0, q4_k).

The ids are llama.cpp's own: llama-completion runs each file greedily (--temp 0 --top-k 1,
--ignore-eos, no chat template) with --prompt-cache FILE --prompt-cache-all, and the session
file it saves holds every token it evaluated (a u32 magic 'ggsn', a u32 version, a u32 count,
then the int32 ids: the prompt as llama.cpp tokenized it, BOS first, then the generated ids).
Nothing is re-tokenized.

Usage: tools/make_gguf_llamacpp_fixture.py LLAMA_BUILD_DIR [--osprey build/osprey] [--out FILE]
  LLAMA_BUILD_DIR: a built llama.cpp build folder holding bin/llama-completion.
Only the standard library is needed; run from the repository root.
"""
import argparse
import json
import os
import struct
import subprocess
import tempfile

PROMPTS = ["Once upon a time", "It is a truth universally acknowledged", "Mr. Darcy said that",
           "The weather was", "Elizabeth could not help"]
OUTTYPES = ["f16", "q8_0", "q4_0", "q4_k"]
N_PREDICT = 32


def session_ids(path):
    with open(path, "rb") as f:
        magic, version, n = struct.unpack("<III", f.read(12))
        if magic != 0x6767736E:
            raise SystemExit(f"{path}: not a llama.cpp session file (magic {magic:#x})")
        return version, list(struct.unpack(f"<{n}i", f.read(4 * n)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("llama_build")
    ap.add_argument("--osprey", default="build/osprey")
    ap.add_argument("--out", default="tests/fixtures/gguf/llamacpp/demo_greedy.json")
    ap.add_argument("--label", default="", help="which llama.cpp (its --version is often 'unknown')")
    a = ap.parse_args()
    completion = os.path.join(a.llama_build, "bin", "llama-completion")
    version = subprocess.run([completion, "--version"], capture_output=True, text=True)
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for q in OUTTYPES:
            gguf = os.path.join(tmp, f"demo-{q}.gguf")
            subprocess.run([a.osprey, "convert", "-m", "models/demo", "-o", gguf, "--to", "gguf",
                            "--outtype", q], check=True, capture_output=True)
            for p in PROMPTS:
                session = os.path.join(tmp, "session.bin")
                if os.path.exists(session):
                    os.remove(session)
                subprocess.run([completion, "-m", gguf, "-p", p, "-n", str(N_PREDICT), "--temp", "0",
                                "--top-k", "1", "-no-cnv", "--ignore-eos", "-t", "1", "--prompt-cache",
                                session, "--prompt-cache-all"], check=True, capture_output=True)
                _, ids = session_ids(session)
                n_prompt = len(ids) - N_PREDICT
                cases.append({"outtype": q, "prompt": p, "prompt_ids": ids[:n_prompt],
                              "generated_ids": ids[n_prompt:]})
    out = {
        "made_by": "tools/make_gguf_llamacpp_fixture.py",
        "llama_cpp": (a.label or (version.stdout + version.stderr).strip().splitlines()[0]),
        "ids_from": "llama-completion --prompt-cache FILE --prompt-cache-all (the session file's tokens)",
        "model": "models/demo, converted by osprey convert --to gguf --outtype OUTTYPE",
        "n_predict": N_PREDICT,
        "cases": cases,
    }
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    head = json.dumps({k: v for k, v in out.items() if k != "cases"}, indent=1)[:-2]
    with open(a.out, "w") as f:  # one case a line
        f.write(head + ',\n "cases": [\n  ' + ",\n  ".join(json.dumps(c) for c in cases) + "\n ]\n}\n")
    print(f"{len(cases)} cases -> {a.out}")


if __name__ == "__main__":
    main()
