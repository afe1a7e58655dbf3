#!/usr/bin/env python3
"""Writes a checkpoint cut to its first N decoder layers: an early-exit draft model of the same
tokenizer, for speculative decoding (osprey --model-draft) where no trained draft exists.

The embeddings, the final norm, the head and layers 0 .. N-1 are copied byte for byte from
model.safetensors (a single file; no torch or numpy needed); config.json gets
num_hidden_layers = N (and layer_types cut to N, when present); the tokenizer and generation
config files are copied as they are. Such a draft is a weak one (the final norm and head read
layer N-1's hidden state, which they were not trained on), but it shares every token id.

Usage: python3 tools/truncate_layers.py models/demo /tmp/demo-l2 --layers 2
"""

import argparse
import json
import os
import re
import shutil
import struct
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="model folder with config.json and one model.safetensors")
    ap.add_argument("dst", help="output folder (created)")
    ap.add_argument("--layers", type=int, required=True, help="decoder layers kept (the first N)")
    args = ap.parse_args()

    config = json.load(open(os.path.join(args.src, "config.json")))
    n = config.get("num_hidden_layers")
    if not isinstance(n, int) or not 1 <= args.layers <= n:
        sys.exit("--layers must be in [1, %s] (num_hidden_layers of %s)" % (n, args.src))
    path = os.path.join(args.src, "model.safetensors")
    if not os.path.exists(path):
        sys.exit("%s: no model.safetensors (a sharded checkpoint is not supported)" % args.src)
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        data_start = 8 + header_len
        layer = re.compile(r"(^|\.)layers\.(\d+)\.")
        kept, blobs, offset = {}, [], 0
        for name, info in sorted(header.items(), key=lambda kv: (kv[0] == "__metadata__", kv[1].get("data_offsets", [0])[0] if isinstance(kv[1], dict) else 0)):
            if name == "__metadata__":
                kept[name] = info
                continue
            m = layer.search(name)
            if m and int(m.group(2)) >= args.layers:
                continue
            begin, end = info["data_offsets"]
            f.seek(data_start + begin)
            blob = f.read(end - begin)
            kept[name] = dict(info, data_offsets=[offset, offset + len(blob)])
            blobs.append(blob)
            offset += len(blob)
    os.makedirs(args.dst, exist_ok=True)
    head = json.dumps(kept, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(os.path.join(args.dst, "model.safetensors"), "wb") as out:
        out.write(struct.pack("<Q", len(head)))
        out.write(head)
        for b in blobs:
            out.write(b)
    config["num_hidden_layers"] = args.layers
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = config["layer_types"][: args.layers]
    with open(os.path.join(args.dst, "config.json"), "w") as out:
        json.dump(config, out, indent=2)
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if os.path.exists(os.path.join(args.src, name)):
            shutil.copy(os.path.join(args.src, name), os.path.join(args.dst, name))
    print("%s: %d of %d layers, %d tensors" % (args.dst, args.layers, n, len(kept) - ("__metadata__" in kept)))


if __name__ == "__main__":
    main()
