#!/usr/bin/env python3
"""Writes the GGUF fixtures (tests/fixtures/gguf/<family>.gguf) from the safetensors fixtures.

Usage: tools/make_gguf_fixtures.py [OUT_DIR]      (default tests/fixtures/gguf)

Each tiny checkpoint of tests/fixtures/models/<family>/ (config.json, model.safetensors, bf16)
becomes the GGUF file llama.cpp's convert_hf_to_gguf.py would write for it, done here in plain
Python from the GGUF specification (no Osprey code, no third-party package):
  - the <arch>.* hyperparameters and tokenizer.ggml.{bos,eos}_token_id;
  - tensors renamed (model.layers.N.self_attn.q_proj.weight -> blk.N.attn_q.weight, ...),
    matrices kept bf16, 1-D tensors (norms, biases) as float32, as the converter stores them;
  - Llama's q/k rows permuted per head to interleaved rotary pairs (the converter's permute());
  - Gemma's norm weights stored as 1 + w (computed in float32);
  - Llama 3's rope scaling as the rope_freqs.weight tensor of per-frequency factors.
The llama fixture also carries a byte-level BPE tokenizer (tokenizer.ggml.*, pre "default")
trained here on a short text to fill its 512 ids, and a chat template, so that the commands
can be run on it end to end (its ids are not a model's: tokenizer correctness is tested
against Hugging Face's ids in tests/formats/gguf_tokenizer_test.cpp).
Keys the converter does not write but a fixture needs (the fixtures are not shaped like any
released model) are written under names llama.cpp defines for other architectures:
gemma3.attention.scale (query_pre_attn_scalar ** -0.5), gemma3.final_logit_softcapping, the
per-layer <arch>.attention.sliding_window_pattern, and llama.attention.sliding_window.
"""

import json
import math
import os
import struct
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FAMILIES = ["llama", "qwen2", "qwen3", "gemma3", "cohere2", "mistral"]
ALIGNMENT = 32

# GGUF value types and ggml tensor types (the specification's numbering).
U32, I32, F32, BOOL, STRING, ARRAY, U64, F64 = 4, 5, 6, 7, 8, 9, 10, 12
GGML_F32, GGML_Q4_0, GGML_Q8_0, GGML_BF16 = 0, 2, 8, 30


def f16(x):
    """x rounded to float16 (round to nearest even), as its bits."""
    return struct.unpack("<H", struct.pack("<e", x))[0]


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def quantize_q8_0(values):
    """ggml's quantize_row_q8_0_ref: per 32 values d = max|x| / 127, q = round(x / d)."""
    out = bytearray()
    for b in range(0, len(values), 32):
        xs = values[b:b + 32]
        amax = max(abs(x) for x in xs)
        d = f32(amax / 127.0)
        inv = f32(1.0 / d) if d else 0.0
        out += struct.pack("<H", f16(d))
        # roundf: half away from zero
        out += bytes((int(math.copysign(math.floor(abs(f32(x * inv)) + 0.5), x)) & 0xFF) for x in xs)
    return bytes(out)


def quantize_q4_0(values):
    """ggml's quantize_row_q4_0_ref: d = (the value of largest magnitude) / -8,
    q = min(15, trunc(x / d + 8.5)), low nibbles the first 16 values, high the last 16."""
    out = bytearray()
    for b in range(0, len(values), 32):
        xs = values[b:b + 32]
        mx = max(xs, key=abs)
        d = f32(mx / -8.0)
        inv = f32(1.0 / d) if d else 0.0
        q = [min(15, int(f32(f32(x * inv) + 8.5))) for x in xs]
        out += struct.pack("<H", f16(d))
        out += bytes(q[j] | (q[j + 16] << 4) for j in range(16))
    return bytes(out)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], e["shape"], raw[8 + n + b:8 + n + end])
    return out


def bf16_to_floats(data):
    return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for (h,) in struct.iter_unpack("<H", data)]


def f32_bytes(values):
    return b"".join(struct.pack("<f", v) for v in values)


def pack_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def pack_value(vtype, value):
    if vtype == STRING:
        return pack_string(value)
    if vtype == ARRAY:
        etype, items = value
        return struct.pack("<IQ", etype, len(items)) + b"".join(pack_value(etype, v) for v in items)
    fmt = {U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q", F64: "<d"}[vtype]
    return struct.pack(fmt, value)


def write_gguf(path, kvs, tensors):
    """kvs: [(key, type, value)]; tensors: [(name, ggml_type, row-major shape, bytes)]."""
    out = bytearray(b"GGUF")
    out += struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, vtype, value in kvs:
        out += pack_string(key) + struct.pack("<I", vtype) + pack_value(vtype, value)
    offset = 0
    for name, ttype, shape, data in tensors:
        out += pack_string(name) + struct.pack("<I", len(shape))
        for d in reversed(shape):  # ne[0] is the innermost dimension
            out += struct.pack("<Q", d)
        out += struct.pack("<IQ", ttype, offset)
        offset += (len(data) + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
    out += b"\0" * (-len(out) % ALIGNMENT)
    for _, _, _, data in tensors:
        out += data + b"\0" * (-len(data) % ALIGNMENT)
    with open(path, "wb") as f:
        f.write(out)


def permute_rows(data, shape, n_head):
    """convert_hf_to_gguf's permute(): per head, rows [halves] -> interleaved pairs."""
    rows, cols = shape
    row_bytes = len(data) // rows
    d = rows // n_head
    out = []
    for h in range(n_head):
        for j in range(d // 2):
            for s in range(2):
                r = h * d + s * (d // 2) + j
                out.append(data[r * row_bytes:(r + 1) * row_bytes])
    return b"".join(out)


LAYER_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "post_feedforward_layernorm": "post_ffw_norm",
}


def gguf_name(name, arch):
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    parts = name.split(".")
    layer, module, suffix = parts[2], ".".join(parts[3:-1]), parts[-1]
    if module == "post_attention_layernorm":
        g = "post_attention_norm" if arch == "gemma3" else "ffn_norm"
    elif module == "pre_feedforward_layernorm":
        g = "ffn_norm"
    else:
        g = LAYER_NAMES[module]
    return "blk.%s.%s.%s" % (layer, g, suffix)


def llama3_rope_factors(cfg, rope, head_dim):
    """convert_hf_to_gguf's LlamaModel rope_freqs for rope_type llama3."""
    base = rope["rope_theta"]
    freqs = [struct.unpack("<f", struct.pack("<f", 1.0 / (base ** (struct.unpack("<f", struct.pack("<f", i / head_dim))[0]))))[0]
             for i in range(0, head_dim, 2)]
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


TRAINING_TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in "
    "want of a wife. However little known the feelings or views of such a man may be on his first entering "
    "a neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is "
    "considered the rightful property of some one or other of their daughters. Hello, world! 0123456789")
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def byte_level_chars():
    """GPT-2's byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tiny_bpe(n_tokens, specials):
    """A byte-level BPE vocabulary of n_tokens: specials, the 256 bytes, then merges learnt on
    TRAINING_TEXT's words (most frequent pair first, ties by first appearance)."""
    table = byte_level_chars()
    tokens = list(specials) + [table[b] for b in range(256)]
    words = [[table[b] for b in w.encode()] for w in
             [(" " if i else "") + w for i, w in enumerate(TRAINING_TEXT.split(" "))]]
    merges = []
    while len(tokens) < n_tokens:
        counts = {}
        for w in words:
            for a, b in zip(w, w[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + 1
        if not counts:
            tokens.append("<unused%d>" % len(tokens))
            continue
        best = max(counts, key=lambda p: counts[p])
        merges.append(best[0] + " " + best[1])
        tokens.append(best[0] + best[1])
        for w in words:
            i = 0
            while i < len(w) - 1:
                if (w[i], w[i + 1]) == best:
                    w[i:i + 2] = [w[i] + w[i + 1]]
                i += 1
    types = [3 if t in specials else 5 if t.startswith("<unused") else 1 for t in tokens]
    return tokens, types, merges


def convert(family, out_dir, qtype=None):
    src = os.path.join(ROOT, "tests/fixtures/models", family)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    weights = read_safetensors(os.path.join(src, "model.safetensors"))
    mt = cfg["model_type"]
    arch = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3",
            "cohere2": "cohere2"}[mt]
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    rope = cfg.get("rope_parameters", {})
    if "full_attention" in rope:
        local, rope = rope["sliding_attention"], rope["full_attention"]
    A = arch + "."
    kvs = [
        ("general.architecture", STRING, arch),
        ("general.name", STRING, "osprey-fixture-" + family),
        ("general.file_type", U32, {None: 32, GGML_Q8_0: 7, GGML_Q4_0: 2}[qtype]),  # MOSTLY_BF16, Q8_0, Q4_0
        (A + "vocab_size", U32, cfg["vocab_size"]),
        (A + "context_length", U32, cfg["max_position_embeddings"]),
        (A + "embedding_length", U32, cfg["hidden_size"]),
        (A + "feed_forward_length", U32, cfg["intermediate_size"]),
        (A + "block_count", U32, cfg["num_hidden_layers"]),
        (A + "attention.head_count", U32, n_head),
        (A + "attention.head_count_kv", U32, n_kv),
        (A + "attention.key_length", U32, head_dim),
        (A + "attention.value_length", U32, head_dim),
        (A + "rope.dimension_count", U32, head_dim),
        (A + "rope.freq_base", F32, rope.get("rope_theta", 10000.0)),
    ]
    if arch == "cohere2":
        kvs.append((A + "attention.layer_norm_epsilon", F32, cfg["layer_norm_eps"]))
        kvs.append((A + "logit_scale", F32, cfg["logit_scale"]))
    else:
        kvs.append((A + "attention.layer_norm_rms_epsilon", F32, cfg["rms_norm_eps"]))
    if rope.get("rope_type") == "linear":
        kvs.append((A + "rope.scaling.type", STRING, "linear"))
        kvs.append((A + "rope.scaling.factor", F32, rope["factor"]))
    if cfg.get("sliding_window") and (arch in ("gemma3", "cohere2") or mt == "mistral"):
        kvs.append((A + "attention.sliding_window", U32, cfg["sliding_window"]))
    if "layer_types" in cfg and arch in ("gemma3", "cohere2"):
        kvs.append((A + "attention.sliding_window_pattern", ARRAY,
                    (BOOL, [t == "sliding_attention" for t in cfg["layer_types"]])))
    if arch == "gemma3":
        kvs.append((A + "attention.scale", F32, cfg["query_pre_attn_scalar"] ** -0.5))
        kvs.append((A + "rope.freq_base_swa", F32, local.get("rope_theta", 10000.0)))
        if cfg.get("final_logit_softcapping"):
            kvs.append((A + "final_logit_softcapping", F32, cfg["final_logit_softcapping"]))
    if family == "llama":
        tokens, types, merges = tiny_bpe(cfg["vocab_size"], ["<pad>", "<|begin_of_text|>", "<|end_of_text|>"])
        kvs += [("tokenizer.ggml.model", STRING, "gpt2"), ("tokenizer.ggml.pre", STRING, "default"),
                ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)), ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
                ("tokenizer.ggml.merges", ARRAY, (STRING, merges)), ("tokenizer.ggml.add_bos_token", BOOL, True),
                ("tokenizer.chat_template", STRING, CHAT_TEMPLATE)]
    kvs.append(("tokenizer.ggml.bos_token_id", U32, cfg["bos_token_id"]))
    kvs.append(("tokenizer.ggml.eos_token_id", U32, cfg["eos_token_id"]))

    tensors = []
    if rope.get("rope_type") == "llama3":
        tensors.append(("rope_freqs.weight", GGML_F32, [head_dim // 2], f32_bytes(llama3_rope_factors(cfg, rope, head_dim))))
    for name in weights:
        dtype, shape, data = weights[name]
        assert dtype == "BF16", (name, dtype)
        g = gguf_name(name, arch)
        if arch == "llama" and g.endswith("attn_q.weight"):
            data = permute_rows(data, shape, n_head)
        elif arch == "llama" and g.endswith("attn_k.weight"):
            data = permute_rows(data, shape, n_kv)
        if qtype is not None and len(shape) == 2:
            values = bf16_to_floats(data)
            tensors.append((g, qtype, shape, quantize_q8_0(values) if qtype == GGML_Q8_0 else quantize_q4_0(values)))
        elif len(shape) == 1:
            values = bf16_to_floats(data)
            if arch == "gemma3" and name.endswith("norm.weight"):
                values = [v + 1.0 for v in values]  # rounded once, to float32, by f32_bytes
            tensors.append((g, GGML_F32, shape, f32_bytes(values)))
        else:
            tensors.append((g, GGML_BF16, shape, data))
    os.makedirs(out_dir, exist_ok=True)
    suffix = {None: "", GGML_Q8_0: "-q8_0", GGML_Q4_0: "-q4_0"}[qtype]
    path = os.path.join(out_dir, family + suffix + ".gguf")
    write_gguf(path, kvs, tensors)
    print(path, os.path.getsize(path), "bytes")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests/fixtures/gguf")
    for family in FAMILIES:
        convert(family, out_dir)
    # Quantized as llama.cpp's reference quantizers do (every matrix; norms stay float32).
    convert("llama", out_dir, GGML_Q8_0)
    convert("llama", out_dir, GGML_Q4_0)


if __name__ == "__main__":
    main()
