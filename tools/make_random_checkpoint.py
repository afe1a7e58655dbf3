#!/usr/bin/env python3
"""Writes a Hugging Face-layout checkpoint folder with random weights (numpy only).

The folder holds config.json and generation_config.json in the form of the real models'
Hub files (rope_theta / rope_scaling / torch_dtype), the weights as safetensors (one
model.safetensors, or model-0000i-of-0000N.safetensors shards plus
model.safetensors.index.json once the weights pass --max-shard-size), and, with
--tokenizer-dir, copies of tokenizer.json / tokenizer_config.json.

Values: projections, embeddings and biases are random with std about 0.02 (sign, mantissa
and the lowest exponent bit drawn uniformly: magnitudes in [2^-7, 2^-5)); norm weights
are 1 (Gemma 3's, which scale by 1 + w, are 0). They carry no meaning; they are finite and in a range where activations stay sane.
Weights are generated and written in chunks, so memory stays small and an 8B model takes
about as long as the disk needs to take 16 GB. Each 16 MiB part of a tensor draws from its
own stream (seeded by --seed, the tensor's index and the part's index), so the values
depend neither on the sharding nor on the number of threads.

Examples:
  make_random_checkpoint.py --preset llama-3.1-8b --tokenizer-dir TOK --out models/llama-8b-random
  make_random_checkpoint.py --preset qwen2.5-7b --dtype float16 --out /tmp/qwen
  make_random_checkpoint.py --preset gemma-3-4b --out /tmp/gemma3-4b
  make_random_checkpoint.py --preset command-r7b --out /tmp/command-r7b
  make_random_checkpoint.py --model-type gemma3_text --out /tmp/tiny-gemma3   (tiny-gemma3)
  make_random_checkpoint.py --preset tiny-llama --tokenizer-dir TOK --out models/default
  make_random_checkpoint.py --model-type llama --hidden 256 --layers 4 --heads 8 --kv-heads 2 \\
      --intermediate 512 --vocab 1024 --out /tmp/small
"""

import argparse
import collections
import concurrent.futures
import json
import os
import re
import shutil
import sys
import time

import numpy as np

LLAMA3_EOS = [128001, 128008, 128009]

PRESETS = {
    "llama-3.1-8b": {
        "model_type": "llama",
        "hidden": 4096,
        "layers": 32,
        "heads": 32,
        "kv_heads": 8,
        "intermediate": 14336,
        "vocab": 128256,
        "head_dim": 128,
        "tie": False,
        "dtype": "bfloat16",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "bos_token_id": 128000,
        "eos_token_id": LLAMA3_EOS,
        "generation": {"do_sample": True, "temperature": 0.6, "top_p": 0.9},
    },
    "qwen2.5-7b": {
        "model_type": "qwen2",
        "hidden": 3584,
        "layers": 28,
        "heads": 28,
        "kv_heads": 4,
        "intermediate": 18944,
        "vocab": 152064,
        "head_dim": 128,
        "tie": False,
        "dtype": "bfloat16",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "pad_token_id": 151643,
        "generation_eos_token_id": [151645, 151643],
        "generation": {
            "do_sample": True,
            "repetition_penalty": 1.05,
            "temperature": 0.7,
            "top_p": 0.8,
            "top_k": 20,
        },
    },
    # Llama 3.2-shaped (rope factor 32) at toy size; vocab follows the tokenizer.
    "tiny-llama": {
        "model_type": "llama",
        "hidden": 64,
        "layers": 2,
        "heads": 4,
        "kv_heads": 2,
        "intermediate": 128,
        "vocab": None,
        "default_vocab": 128256,
        "head_dim": 16,
        "tie": True,
        "dtype": "bfloat16",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "bos_token_id": 128000,
        "eos_token_id": LLAMA3_EOS,
        "generation": {"do_sample": True, "temperature": 0.6, "top_p": 0.9},
    },
    # Qwen2.5-0.5B-shaped fields (tied, biases) at toy size; vocab follows the tokenizer.
    "tiny-qwen2": {
        "model_type": "qwen2",
        "hidden": 64,
        "layers": 2,
        "heads": 4,
        "kv_heads": 2,
        "intermediate": 128,
        "vocab": None,
        "default_vocab": 151936,
        "head_dim": 16,
        "tie": True,
        "dtype": "bfloat16",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "pad_token_id": 151643,
        "generation_eos_token_id": [151645, 151643],
        "generation": {
            "do_sample": True,
            "repetition_penalty": 1.1,
            "temperature": 0.7,
            "top_p": 0.8,
            "top_k": 20,
        },
    },
}

# Gemma 3 4B's language model (the text_config of google/gemma-3-4b-it) as a Gemma3ForCausalLM
# (model_type gemma3_text): the Hub file gives hidden, layers, intermediate, sliding_window and
# rope_scaling; the other fields are the transformers defaults it relies on. Five sliding
# layers, then one full layer; full layers use theta 1e6 with linear factor 8, sliding
# layers theta 10000 (rope_local_base_freq) unscaled.
PRESETS["gemma-3-4b"] = {
    "model_type": "gemma3_text",
    "hidden": 2560,
    "layers": 34,
    "heads": 8,
    "kv_heads": 4,
    "intermediate": 10240,
    "vocab": 262208,
    "head_dim": 256,
    "tie": True,
    "dtype": "bfloat16",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "sliding_window": 1024,
    "sliding_window_pattern": 6,
    "query_pre_attn_scalar": 256,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "bos_token_id": 2,
    "eos_token_id": [1, 106],
    "pad_token_id": 0,
    "generation": {"do_sample": True, "top_k": 64, "top_p": 0.95},
}
# Command R7B (CohereForAI/c4ai-command-r7b-12-2024, Cohere2ForCausalLM): three sliding layers
# (window 4096, interleaved RoPE) then one full layer without position encoding.
PRESETS["command-r7b"] = {
    "model_type": "cohere2",
    "hidden": 4096,
    "layers": 32,
    "heads": 32,
    "kv_heads": 8,
    "intermediate": 14336,
    "vocab": 256000,
    "head_dim": 128,
    "tie": True,
    "dtype": "bfloat16",
    "max_position_embeddings": 132096,
    "layer_norm_eps": 1e-5,
    "rope_theta": 50000.0,
    "rope_scaling": None,
    "sliding_window": 4096,
    "sliding_window_pattern": 4,
    "logit_scale": 0.25,
    "bos_token_id": 5,
    "eos_token_id": 255001,
    "pad_token_id": 0,
    "generation": {},
}
# The same fields at toy size (6 layers: five sliding, one full; 4 layers: three sliding, one
# full); vocab follows the tokenizer.
PRESETS["tiny-gemma3"] = dict(PRESETS["gemma-3-4b"], hidden=64, layers=6, heads=4, kv_heads=2,
                              intermediate=160, vocab=None, default_vocab=262208, head_dim=64,
                              sliding_window=16)
PRESETS["tiny-cohere2"] = dict(PRESETS["command-r7b"], hidden=64, layers=4, heads=4, kv_heads=2,
                               intermediate=160, vocab=None, default_vocab=256000, head_dim=16,
                               sliding_window=16)
DEFAULT_PRESET = {"llama": "tiny-llama", "qwen2": "tiny-qwen2", "gemma3_text": "tiny-gemma3",
                  "cohere2": "tiny-cohere2"}

# bit patterns: one, and the random-value masks (keep sign, mantissa and the lowest
# exponent bit; OR in the exponent of 2^-7, whose field is even)
DTYPES = {
    "bfloat16": {"st": "BF16", "one": 0x3F80, "keep": 0x80FF, "exp": (127 - 7) << 7},
    "float16": {"st": "F16", "one": 0x3C00, "keep": 0x87FF, "exp": (15 - 7) << 10},
}
PART_ELEMENTS = 1 << 23  # 16 MiB of 2-byte values: the unit of generation and of writing


def parse_size(text):
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?i?B?)\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 4GB, 500MB, 1000000)")
    unit = m.group(2).upper().rstrip("B")
    scale = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
             "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}[unit]
    return int(float(m.group(1)) * scale)


def tokenizer_info(tok_dir):
    """(n_tokens, {token text: id}) for the special/added tokens of tokenizer.json."""
    path = os.path.join(tok_dir, "tokenizer.json")
    if not os.path.isfile(path):
        raise SystemExit(f"error: {path} not found (--tokenizer-dir)")
    with open(path, encoding="utf-8") as f:
        tok = json.load(f)
    ids = list(tok.get("model", {}).get("vocab", {}).values())
    added = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    ids.extend(added.values())
    if not ids:
        raise SystemExit(f"error: {path} has no vocab")
    return max(ids) + 1, added


def tensor_specs(c):
    """[(name, shape, kind)] in HF names and [out, in] layout; kind: random | ones | zeros.
    Gemma 3 norms scale by (1 + w), so theirs are zeros (a scale of 1)."""
    h, hd = c["hidden"], c["head_dim"]
    q_out, kv_out = c["heads"] * hd, c["kv_heads"] * hd
    bias = c["model_type"] == "qwen2"
    gemma = c["model_type"] == "gemma3_text"
    cohere = c["model_type"] == "cohere2"
    norm = "zeros" if gemma else "ones"
    specs = [("model.embed_tokens.weight", (c["vocab"], h), "random")]
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        specs.append((p + "input_layernorm.weight", (h,), norm))
        specs.append((p + "self_attn.q_proj.weight", (q_out, h), "random"))
        if bias:
            specs.append((p + "self_attn.q_proj.bias", (q_out,), "random"))
        specs.append((p + "self_attn.k_proj.weight", (kv_out, h), "random"))
        if bias:
            specs.append((p + "self_attn.k_proj.bias", (kv_out,), "random"))
        specs.append((p + "self_attn.v_proj.weight", (kv_out, h), "random"))
        if bias:
            specs.append((p + "self_attn.v_proj.bias", (kv_out,), "random"))
        specs.append((p + "self_attn.o_proj.weight", (h, q_out), "random"))
        if gemma:
            specs.append((p + "self_attn.q_norm.weight", (hd,), norm))
            specs.append((p + "self_attn.k_norm.weight", (hd,), norm))
            specs.append((p + "pre_feedforward_layernorm.weight", (h,), norm))
        if not cohere:  # cohere2: attention and MLP both read input_layernorm's output
            specs.append((p + "post_attention_layernorm.weight", (h,), norm))
        specs.append((p + "mlp.gate_proj.weight", (c["intermediate"], h), "random"))
        specs.append((p + "mlp.up_proj.weight", (c["intermediate"], h), "random"))
        specs.append((p + "mlp.down_proj.weight", (h, c["intermediate"]), "random"))
        if gemma:
            specs.append((p + "post_feedforward_layernorm.weight", (h,), norm))
    specs.append(("model.norm.weight", (h,), norm))
    if not c["tie"]:
        specs.append(("lm_head.weight", (c["vocab"], h), "random"))
    return specs


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def plan_shards(specs, max_bytes):
    shards, current, size = [], [], 0
    for spec in specs:
        nbytes = numel(spec[1]) * 2
        if current and size + nbytes > max_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(spec)
        size += nbytes
    shards.append(current)
    return shards


def safetensors_header(entries, st_dtype):
    """Header bytes (u64 length + JSON padded with spaces to a multiple of 8)."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _kind in entries:
        nbytes = numel(shape) * 2
        header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    return len(text).to_bytes(8, "little") + text


def random_part(n, dt, seeds):
    """n random 2-byte values (uint16 bit patterns) from the stream `seeds`."""
    bits = np.random.SFC64(np.random.SeedSequence(seeds)).random_raw((n + 3) // 4).view(np.uint16)[:n]
    np.bitwise_and(bits, np.uint16(dt["keep"]), out=bits)
    np.bitwise_or(bits, np.uint16(dt["exp"]), out=bits)
    return bits


def write_shard(f, entries, dt, seed, index_of, pool, depth):
    """Streams the data of `entries` to f; random parts are made `depth` parts ahead on `pool`."""
    pending = collections.deque()

    def drain(limit):
        while len(pending) > limit:
            f.write(memoryview(pending.popleft().result()))

    for name, shape, kind in entries:
        n = numel(shape)
        if kind in ("ones", "zeros"):
            drain(0)
            f.write(np.full(n, dt["one"] if kind == "ones" else 0, dtype=np.uint16).tobytes())
            continue
        for part, start in enumerate(range(0, n, PART_ELEMENTS)):
            m = min(PART_ELEMENTS, n - start)
            pending.append(pool.submit(random_part, m, dt, (seed, index_of[name], part)))
            drain(depth)
    drain(0)


def build_config(args):
    preset_name = args.preset or DEFAULT_PRESET[args.model_type or "llama"]
    p = dict(PRESETS[preset_name])
    if args.model_type and args.model_type != p["model_type"]:
        base = PRESETS[DEFAULT_PRESET[args.model_type]]
        p.update({k: v for k, v in base.items()
                  if k not in ("hidden", "layers", "heads", "kv_heads", "intermediate", "head_dim")})
    for key in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab", "head_dim", "dtype", "tie"):
        value = getattr(args, key)
        if value is not None:
            p[key] = value
    if args.head_dim is None and (args.hidden is not None or args.heads is not None):
        p["head_dim"] = p["hidden"] // p["heads"]
    if p["heads"] % p["kv_heads"] != 0:
        raise SystemExit(f"error: --heads {p['heads']} is not a multiple of --kv-heads {p['kv_heads']}")
    if p["model_type"] == "cohere2" and p["head_dim"] != p["hidden"] // p["heads"]:
        raise SystemExit(f"error: cohere2 has head_dim = hidden / heads ({p['hidden'] // p['heads']}), "
                         f"not {p['head_dim']}")
    if p["model_type"] in ("gemma3_text", "cohere2") and not p["tie"]:
        raise SystemExit(f"error: {p['model_type']} ties lm_head to the embedding (--tie)")

    added = {}
    if args.tokenizer_dir:
        n_tok, added = tokenizer_info(args.tokenizer_dir)
        p["vocab"] = max(p["vocab"] or 0, n_tok)
    elif p["vocab"] is None:
        p["vocab"] = p["default_vocab"]
    p["preset"] = preset_name
    return p, added


def layer_types(p):
    """Hub pattern: every sliding_window_pattern-th layer is full, the others sliding."""
    k = p["sliding_window_pattern"]
    return ["full_attention" if (i + 1) % k == 0 else "sliding_attention" for i in range(p["layers"])]


def gemma3_hub_config(p):
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": p["attn_logit_softcapping"],
        "bos_token_id": p["bos_token_id"],
        "eos_token_id": p["eos_token_id"],
        "final_logit_softcapping": p["final_logit_softcapping"],
        "head_dim": p["head_dim"],
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": p["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": p["intermediate"],
        "layer_types": layer_types(p),
        "max_position_embeddings": p["max_position_embeddings"],
        "model_type": "gemma3_text",
        "num_attention_heads": p["heads"],
        "num_hidden_layers": p["layers"],
        "num_key_value_heads": p["kv_heads"],
        "pad_token_id": p["pad_token_id"],
        "query_pre_attn_scalar": p["query_pre_attn_scalar"],
        "rms_norm_eps": p["rms_norm_eps"],
        "rope_local_base_freq": p["rope_local_base_freq"],
        "rope_scaling": p["rope_scaling"],
        "rope_theta": p["rope_theta"],
        "sliding_window": p["sliding_window"],
        "sliding_window_pattern": p["sliding_window_pattern"],
        "tie_word_embeddings": True,
        "torch_dtype": p["dtype"],
        "use_cache": True,
        "vocab_size": p["vocab"],
    }


def cohere2_hub_config(p):
    return {
        "architectures": ["Cohere2ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": p["bos_token_id"],
        "eos_token_id": p["eos_token_id"],
        "head_dim": p["head_dim"],
        "hidden_act": "silu",
        "hidden_size": p["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": p["intermediate"],
        "layer_norm_eps": p["layer_norm_eps"],
        "layer_types": layer_types(p),
        "logit_scale": p["logit_scale"],
        "max_position_embeddings": p["max_position_embeddings"],
        "model_type": "cohere2",
        "num_attention_heads": p["heads"],
        "num_hidden_layers": p["layers"],
        "num_key_value_heads": p["kv_heads"],
        "pad_token_id": p["pad_token_id"],
        "rope_scaling": p["rope_scaling"],
        "rope_theta": p["rope_theta"],
        "sliding_window": p["sliding_window"],
        "sliding_window_pattern": p["sliding_window_pattern"],
        "tie_word_embeddings": True,
        "torch_dtype": p["dtype"],
        "use_cache": True,
        "vocab_size": p["vocab"],
    }


def hub_config(p):
    if p["model_type"] == "gemma3_text":
        return gemma3_hub_config(p)
    if p["model_type"] == "cohere2":
        return cohere2_hub_config(p)
    qwen = p["model_type"] == "qwen2"
    cfg = {
        "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": p["bos_token_id"],
        "eos_token_id": p["eos_token_id"],
        "hidden_act": "silu",
        "hidden_size": p["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": p["intermediate"],
        "max_position_embeddings": p["max_position_embeddings"],
        "model_type": p["model_type"],
        "num_attention_heads": p["heads"],
        "num_hidden_layers": p["layers"],
        "num_key_value_heads": p["kv_heads"],
        "rms_norm_eps": p["rms_norm_eps"],
        "rope_theta": p["rope_theta"],
        "tie_word_embeddings": p["tie"],
        "torch_dtype": p["dtype"],
        "use_cache": True,
        "vocab_size": p["vocab"],
    }
    if qwen:
        cfg.update({"max_window_layers": p["layers"], "sliding_window": p["max_position_embeddings"],
                    "use_sliding_window": False})
    else:
        cfg.update({"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1,
                    "rope_scaling": p["rope_scaling"]})
    if p["head_dim"] != p["hidden"] // p["heads"]:
        cfg["head_dim"] = p["head_dim"]
    return dict(sorted(cfg.items()))


def generation_config(p):
    gen = {"bos_token_id": p["bos_token_id"],
           "eos_token_id": p.get("generation_eos_token_id", p["eos_token_id"])}
    if "pad_token_id" in p:
        gen["pad_token_id"] = p["pad_token_id"]
    gen.update(p["generation"])
    return gen


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (created; old weight files in it are replaced)")
    ap.add_argument("--preset", choices=sorted(PRESETS), help="base shape and config fields")
    ap.add_argument("--model-type", choices=sorted(DEFAULT_PRESET),
                    help="llama, qwen2, gemma3_text or cohere2 (default: the preset's)")
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--intermediate", type=int)
    ap.add_argument("--vocab", type=int, help="at least the tokenizer's size when --tokenizer-dir is given")
    ap.add_argument("--head-dim", type=int, help="default hidden / heads")
    ap.add_argument("--dtype", choices=sorted(DTYPES))
    ap.add_argument("--tie", action=argparse.BooleanOptionalAction, default=None,
                    help="tie lm_head to the embedding (no lm_head.weight written)")
    ap.add_argument("--tokenizer-dir", help="folder with tokenizer.json and tokenizer_config.json to copy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, help="generator threads (default: cores, at most 8)")
    ap.add_argument("--max-shard-size", type=parse_size, default=parse_size("4GB"),
                    help="shard the weights past this size (default 4GB)")
    args = ap.parse_args()

    p, added = build_config(args)
    dt = DTYPES[p["dtype"]]
    os.makedirs(args.out, exist_ok=True)
    for name in os.listdir(args.out):
        if re.fullmatch(r"model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?", name):
            os.remove(os.path.join(args.out, name))

    if args.tokenizer_dir:
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            src = os.path.join(args.tokenizer_dir, name)
            if os.path.isfile(src):
                shutil.copyfile(src, os.path.join(args.out, name))
        tc_path = os.path.join(args.tokenizer_dir, "tokenizer_config.json")
        if os.path.isfile(tc_path):
            with open(tc_path, encoding="utf-8") as f:
                eos_text = json.load(f).get("eos_token")
            if isinstance(eos_text, dict):
                eos_text = eos_text.get("content")
            eos_ids = p["eos_token_id"] if isinstance(p["eos_token_id"], list) else [p["eos_token_id"]]
            if eos_text in added and added[eos_text] not in eos_ids:
                print(f"warning: the tokenizer's eos {eos_text!r} (id {added[eos_text]}) is not among "
                      f"eos_token_id {p['eos_token_id']}", file=sys.stderr)

    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(hub_config(p), f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump(generation_config(p), f, indent=2)
        f.write("\n")

    specs = tensor_specs(p)
    index_of = {spec[0]: i for i, spec in enumerate(specs)}
    shards = plan_shards(specs, args.max_shard_size)
    n_shards = len(shards)
    total_bytes = sum(numel(s[1]) * 2 for s in specs)
    weight_map = {}
    t0 = time.time()
    n_workers = args.threads or min(8, os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(n_workers) as pool:
        for k, entries in enumerate(shards):
            fname = "model.safetensors" if n_shards == 1 else f"model-{k + 1:05d}-of-{n_shards:05d}.safetensors"
            with open(os.path.join(args.out, fname), "wb") as f:
                f.write(safetensors_header(entries, dt["st"]))
                write_shard(f, entries, dt, args.seed, index_of, pool, depth=2 * n_workers)
            for name, _shape, _kind in entries:
                weight_map[name] = fname
            print(f"wrote {fname} ({sum(numel(e[1]) * 2 for e in entries) / 1e9:.2f} GB)", flush=True)
    if n_shards > 1:
        index = {"metadata": {"total_size": total_bytes,
                              "total_parameters": total_bytes // 2},
                 "weight_map": dict(sorted(weight_map.items()))}
        with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
    dt_s = time.time() - t0
    print(f"{p['preset']} ({p['model_type']}): {total_bytes // 2:,} parameters, {total_bytes / 1e9:.2f} GB "
          f"{p['dtype']} in {n_shards} file(s), {dt_s:.1f} s ({total_bytes / 1e9 / max(dt_s, 1e-9):.2f} GB/s) "
          f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
