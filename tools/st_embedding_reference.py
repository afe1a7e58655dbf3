#!/usr/bin/env python3
"""Writes reference_st.json beside reference.json in each embedding fixture folder: what
sentence-transformers itself computes for the fixture's inputs, as a second reference that
shares nothing with the numpy forward of make_embedding_fixtures.py.

For every input of the folder's reference.json:
  text inputs   SentenceTransformer(folder).encode(text): its own tokenizer (HF tokenizers
                over tokenizer.json), Transformer -> Pooling -> Normalize as modules.json
                declares; the ids it tokenized to are stored as `tokens`
  token inputs  the same modules over {"input_ids", "attention_mask"} built from the ids
float32 weights and activations, TF32 off, on CUDA when present (else the CPU).

Output per folder (reference_st.json):
  generator     versions of sentence-transformers, transformers and torch, and the device
  inputs        [{"text" (or null), "tokens", "embedding"}] in reference.json's order

Usage (needs torch, transformers and sentence-transformers):
  python3 tools/st_embedding_reference.py tests/fixtures/models/qwen3-embedding \
      tests/fixtures/models/llama-embedding
"""

import json
import os
import sys

import sentence_transformers
import torch
import transformers
from sentence_transformers import SentenceTransformer


def reference_for(folder, device):
    model = SentenceTransformer(folder, device=device, model_kwargs={"torch_dtype": torch.float32})
    model.eval()
    inputs = json.load(open(os.path.join(folder, "reference.json")))["inputs"]
    out = []
    for item in inputs:
        if item["text"] is not None:
            ids = model.tokenize([item["text"]])["input_ids"][0].tolist()
            emb = model.encode([item["text"]], convert_to_numpy=True, batch_size=1)[0]
        else:
            ids = list(item["tokens"])
            t = torch.tensor([ids], dtype=torch.long, device=device)
            with torch.no_grad():
                feats = model({"input_ids": t, "attention_mask": torch.ones_like(t)})
            emb = feats["sentence_embedding"][0].float().cpu().numpy()
        out.append({"text": item["text"], "tokens": ids, "embedding": [float(v) for v in emb]})
    return out


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for folder in sys.argv[1:]:
        doc = {
            "generator": (f"sentence-transformers {sentence_transformers.__version__}, transformers "
                          f"{transformers.__version__}, torch {torch.__version__}, {device}, float32, TF32 off"),
            "inputs": reference_for(folder, device),
        }
        with open(os.path.join(folder, "reference_st.json"), "w") as f:
            json.dump(doc, f)
        print(folder, len(doc["inputs"]), "inputs:", doc["generator"])


if __name__ == "__main__":
    main()
