#!/usr/bin/env python3
"""Perplexity of a checkpoint on a text, computed by HF transformers and tokenizers as
`osprey perplexity` defines it (src/cli/perplexity_cmd.cpp): the text tokenized once by the
model's tokenizer.json (its post-processor adds the BOS), cut into non-overlapping chunks of
CTX tokens (a last partial chunk dropped), each chunk one forward pass with its first token
replaced by BOS when the tokenizer adds one, the logits at positions [CTX/2, CTX-1) scored
against the tokens after them; PPL = exp(mean NLL).

Usage (on a machine with torch, transformers and tokenizers):
  python3 tools/perplexity_reference.py --model models/demo --text tests/fixtures/perplexity/austen.txt \
      --ctx 32 --out tests/fixtures/perplexity/demo_reference.json
Writes the token count, the per-chunk NLL sums, the mean NLL and the PPL, with the versions used.
"""
import argparse
import json
import math
import os

import tokenizers
import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--ctx", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()

    tok = tokenizers.Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    text = open(a.text, encoding="utf-8").read()
    ids = tok.encode(text).ids
    bare = tok.encode(text, add_special_tokens=False).ids
    bos = ids[0] if len(ids) == len(bare) + 1 and ids[1:] == bare else None

    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32).to(a.device)
    model.eval()
    ctx = a.ctx
    first = ctx // 2
    chunks = len(ids) // ctx
    nll_sums = []
    with torch.no_grad():
        for c in range(chunks):
            chunk = list(ids[c * ctx:(c + 1) * ctx])
            if bos is not None:
                chunk[0] = bos
            x = torch.tensor([chunk], device=a.device)
            logp = torch.log_softmax(model(x).logits[0].double(), dim=-1)
            s = 0.0
            for i in range(first, ctx - 1):
                s -= logp[i, chunk[i + 1]].item()
            nll_sums.append(s)
    n_scored = chunks * (ctx - 1 - first)
    mean = sum(nll_sums) / n_scored
    out = {
        "model": os.path.basename(os.path.normpath(a.model)),
        "text": os.path.basename(a.text),
        "ctx": ctx,
        "n_tokens": len(ids),
        "bos": bos,
        "n_chunks": chunks,
        "n_scored": n_scored,
        "chunk_nll_sums": nll_sums,
        "mean_nll": mean,
        "ppl": math.exp(mean),
        "computed_by": f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}, "
                       f"torch {torch.__version__}, float32 on {a.device}",
    }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({k: out[k] for k in ("n_tokens", "n_chunks", "n_scored", "ppl")}))


if __name__ == "__main__":
    main()
