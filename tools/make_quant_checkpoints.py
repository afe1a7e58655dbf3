#!/usr/bin/python3
"""Quantized checkpoints in the hub formats Osprey reads, made from a test checkpoint with numpy
alone, each written following its published layout:

  awq            quant_method "awq", version "gemm": qweight int32 [in, out/8] with the column
                 order [0, 2, 4, 6, 1, 3, 5, 7] within each word, qzeros int32 [in/g, out/8] in
                 the same order, scales float16 [in/g, out]; w = (q - z) * s.
  gptq           quant_method "gptq", 4-bit, desc_act with a shuffled g_idx, checkpoint_format
                 "gptq" (AutoGPTQ's: the stored zero points are z - 1): qweight int32 [in/8, out]
                 (input 8w + j in bits 4j of word w), qzeros int32 [in/g, out/8], scales [in/g,
                 out], g_idx int32 [in]; w[:, i] = (q[:, i] - z[g_idx[i]]) * s[g_idx[i]].
  gptq-v2-8bit   quant_method "gptq", 8-bit, no desc_act, checkpoint_format "gptq_v2" (zero
                 points stored as they are).
  fp8-channel    compressed-tensors "float-quantized", FP8 e4m3 weights with a per-channel
                 weight_scale [out, 1] (bfloat16) and dynamic per-token activations; lm_head
                 in "ignore" and kept in its dtype.
  fp8-tensor     compressed-tensors, per-tensor weight_scale [1] and static input_scale [1].
  fp8-block      quant_method "fp8" (DeepSeek's): weight_scale_inv float32 [ceil(out/128),
                 ceil(in/128)], one per 128x128 block; w = q * scale_inv.
  fbgemm-fp8     quant_method "fbgemm_fp8": weight_scale float32 [out, 1].
  modelopt-fp8   hf_quant_config.json {"quantization": {"quant_algo": "FP8"}}: scalar float32
                 weight_scale and input_scale, k_scale and v_scale for an FP8 KV cache.

FP8 e4m3 (float8_e4m3fn) is encoded from the format's definition: 1 sign bit, 4 exponent bits
with bias 7, 3 mantissa bits, subnormals below 2^-6, no infinities, S.1111.111 is NaN, largest
finite 448; values round to the nearest code, ties to the even code, and saturate at 448.

Every quantized module of layers q/k/v/o/gate/up/down is written; embeddings, norms and
lm_head keep their dtype. Each format folder OUT/<format>/ holds config.json,
generation_config.json, model.safetensors (and hf_quant_config.json for modelopt), and
  dequant.safetensors   this script's float32 dequantization of each quantized weight, named
                        <module>.weight, computed from the codes and scales it wrote;
  dense/                the same model with those float32 weights: a plain checkpoint to
                        compare the quantized one against.

Usage: /usr/bin/python3 tools/make_quant_checkpoints.py --src tests/fixtures/models/llama --out DIR
       [--formats awq,gptq,...] [--group-size 32]
"""

import argparse
import json
import os
import shutil
import struct

import numpy as np

# ---------------------------------------------------------------- safetensors

_DTYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "U32": np.uint32, "U8": np.uint8,
           "F8_E4M3": np.uint8, "I64": np.int64}


def read_safetensors(path):
    """name -> (dtype string, numpy array); BF16 is returned as float32."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[base + b:base + end]
        if e["dtype"] == "BF16":
            a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, _DTYPES[e["dtype"]]).copy()
        out[name] = (e["dtype"], a.reshape(e["shape"]))
    return out


def bf16_bits(a):
    """float32 -> bfloat16 bit patterns, round to nearest even."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors):
    """tensors: name -> (dtype string, numpy array holding that dtype's bytes)."""
    header, blobs, off = {}, [], 0
    for name, (dt, a) in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------- FP8 e4m3

def e4m3_values():
    """The value of each of the 256 codes (NaN for the two NaN codes)."""
    v = np.zeros(256, np.float64)
    for c in range(256):
        s, e, m = c >> 7, (c >> 3) & 15, c & 7
        if e == 15 and m == 7:
            v[c] = np.nan
        elif e == 0:
            v[c] = (m / 8.0) * 2.0 ** -6
        else:
            v[c] = (1 + m / 8.0) * 2.0 ** (e - 7)
        if s:
            v[c] = -v[c]
    return v


E4M3 = e4m3_values()
_POS = E4M3[:127]  # codes 0..126: the non-negative finite values, increasing


def encode_e4m3(x):
    """float array -> uint8 codes: nearest, ties to the even code, saturating at 448."""
    x = np.asarray(x, np.float64)
    a = np.minimum(np.abs(x), 448.0)
    hi = np.clip(np.searchsorted(_POS, a, side="left"), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    dlo, dhi = a - _POS[lo], _POS[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = pick.astype(np.uint8)
    return np.where((x < 0) & (code != 0), code | 0x80, code).astype(np.uint8)


def decode_e4m3(codes):
    return E4M3[codes]


# ---------------------------------------------------------------- int4 / int8 (asymmetric, min-max)

def quantize_int(w, group, bits):
    """w [out, in] -> codes [out, in], scales [in/g, out] (float16), zeros [in/g, out] (int)."""
    out, inn = w.shape
    maxq = 2 ** bits - 1
    wg = w.reshape(out, inn // group, group)
    lo = np.minimum(wg.min(axis=2), 0.0)
    hi = np.maximum(wg.max(axis=2), 0.0)
    scale = np.maximum((hi - lo) / maxq, 1e-8).astype(np.float16)
    s = scale.astype(np.float64)
    zero = np.clip(np.round(-lo / s), 0, maxq).astype(np.int64)
    q = np.clip(np.round(wg / s[:, :, None]) + zero[:, :, None], 0, maxq).astype(np.int64)
    return q.reshape(out, inn), scale.T.copy(), zero.T.copy()


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def pack_awq_cols(m):
    """[rows, cols] 4-bit values -> int32 [rows, cols/8]: word c holds column 8c + AWQ_ORDER[j] in bits 4j."""
    rows, cols = m.shape
    out = np.zeros((rows, cols // 8), np.uint32)
    for j in range(8):
        out |= (m[:, AWQ_ORDER[j]::8].astype(np.uint32) & 15) << np.uint32(4 * j)
    return out.view(np.int32)


def pack_rows(m, bits):
    """[rows, cols] -> int32 [rows * bits / 32, cols]: row per*w + j in bits `bits*j` of word row w."""
    per = 32 // bits
    rows, cols = m.shape
    out = np.zeros((rows // per, cols), np.uint32)
    for j in range(per):
        out |= (m[j::per, :].astype(np.uint32) & (2 ** bits - 1)) << np.uint32(bits * j)
    return out.view(np.int32)


def pack_cols(m, bits):
    """[rows, cols] -> int32 [rows, cols * bits / 32]: column per*c + j in bits `bits*j` of word c."""
    return pack_rows(m.T, bits).T.copy()


# ---------------------------------------------------------------- formats

LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def quantized_modules(src):
    mods = []
    for name in src:
        for l in LINEARS:
            if name.endswith("." + l + ".weight"):
                mods.append(name[: -len(".weight")])
    return sorted(mods)


def make_awq(w, group, rng):
    q, s, z = quantize_int(w, group, 4)  # q [out, in], s/z [in/g, out]
    tensors = {"qweight": ("I32", pack_awq_cols(q.T)), "qzeros": ("I32", pack_awq_cols(z)),
               "scales": ("F16", s)}
    deq = (q - np.repeat(z.T, group, axis=1)) * np.repeat(s.T.astype(np.float64), group, axis=1)
    return tensors, deq


def make_gptq(w, group, bits, desc_act, v1, rng):
    out, inn = w.shape
    ng = inn // group
    if desc_act:
        order = rng.permutation(inn)  # the order the inputs were quantized in
        g_idx = np.empty(inn, np.int32)
        g_idx[order] = np.arange(inn) // group
    else:
        g_idx = (np.arange(inn) // group).astype(np.int32)
    # quantize each group's inputs together, wherever they sit
    q = np.zeros((out, inn), np.int64)
    s = np.zeros((ng, out), np.float16)
    z = np.zeros((ng, out), np.int64)
    for k in range(ng):
        cols = np.nonzero(g_idx == k)[0]
        qk, sk, zk = quantize_int(w[:, cols], group, bits)
        if v1:
            zk = np.maximum(zk, 1)  # the stored z - 1 must fit the code
            qk = np.clip(np.round(w[:, cols] / sk.T.astype(np.float64)) + zk.T, 0, 2 ** bits - 1).astype(np.int64)
        q[:, cols], s[k], z[k] = qk, sk[0], zk[0]
    stored_z = z - 1 if v1 else z
    tensors = {"qweight": ("I32", pack_rows(q.T, bits)), "qzeros": ("I32", pack_cols(stored_z, bits)),
               "scales": ("F16", s), "g_idx": ("I32", g_idx)}
    deq = (q - z[g_idx].T) * s[g_idx].T.astype(np.float64)
    return tensors, deq


def make_fp8(w, kind, scale_dtype):
    out, inn = w.shape
    if kind == "tensor":
        scale = np.array([np.abs(w).max() / 448.0], np.float32)
        full = np.full_like(w, scale[0])
    elif kind == "channel":
        # max |w| / 448 in float32 (1 for a zero row), as `osprey convert --to fp8` writes it
        amax = np.abs(w).max(axis=1, keepdims=True).astype(np.float32)
        scale = np.where(amax > 0, amax / np.float32(448.0), np.float32(1.0)).astype(np.float32)
        full = np.broadcast_to(scale, w.shape)
    else:  # 128x128 blocks
        br, bc = -(-out // 128), -(-inn // 128)
        scale = np.zeros((br, bc), np.float32)
        for i in range(br):
            for j in range(bc):
                scale[i, j] = np.abs(w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]).max() / 448.0
        full = np.repeat(np.repeat(scale, 128, axis=0), 128, axis=1)[:out, :inn]
    if scale_dtype == "BF16":
        scale_bits = bf16_bits(scale)
        scale = from_bf16_bits(scale_bits).reshape(scale.shape)
        full = np.broadcast_to(scale, w.shape) if kind == "channel" else full
        stored = ("BF16", scale_bits)
    else:
        stored = ("F32", scale)
    codes = encode_e4m3(w / full)
    deq = decode_e4m3(codes) * np.asarray(full, np.float64)
    return codes, stored, deq


def write_format(name, src_dir, src, out_dir, group, rng):
    config = json.load(open(os.path.join(src_dir, "config.json")))
    config.pop("quantization", None)
    config.pop("quantization_config", None)
    fmt_dir = os.path.join(out_dir, name)
    os.makedirs(os.path.join(fmt_dir, "dense"), exist_ok=True)
    mods = quantized_modules(src)
    int_formats = name in ("awq", "gptq", "gptq-v2-8bit")
    # AWQ and GPTQ checkpoints are float16; the FP8 ones keep the source's bfloat16.
    keep = "F16" if int_formats else "BF16"
    tensors, deqs = {}, {}
    for tname, (dt, a) in src.items():
        mod = tname[: -len(".weight")] if tname.endswith(".weight") else None
        if mod in mods:
            w = a.astype(np.float64)
            if name == "awq":
                t, deq = make_awq(w, group, rng)
            elif name == "gptq":
                t, deq = make_gptq(w, group, 4, True, True, rng)
            elif name == "gptq-v2-8bit":
                t, deq = make_gptq(w, group, 8, False, False, rng)
            else:
                kind = {"fp8-channel": "channel", "fp8-tensor": "tensor", "fp8-block": "block",
                        "fbgemm-fp8": "channel", "modelopt-fp8": "tensor"}[name]
                codes, scale, deq = make_fp8(w, kind, "BF16" if name == "fp8-channel" else "F32")
                if name == "modelopt-fp8":
                    scale = ("F32", scale[1].reshape(()))
                t = {"weight": ("F8_E4M3", codes),
                     ("weight_scale_inv" if name == "fp8-block" else "weight_scale"): scale}
                if name in ("fp8-tensor", "modelopt-fp8"):
                    t["input_scale"] = ("F32", np.array([0.05], np.float32).reshape((1,) if name == "fp8-tensor" else ()))
            for k, v in t.items():
                tensors[mod + "." + k] = v
            deqs[tname] = deq.astype(np.float32)
        else:
            tensors[tname] = (keep, a.astype(np.float16)) if keep == "F16" else ("BF16", bf16_bits(a))
    if name == "modelopt-fp8":
        for l in range(config["num_hidden_layers"]):
            for kv in ("k", "v"):
                tensors[f"model.layers.{l}.self_attn.{kv}_proj.{kv}_scale"] = ("F32", np.array(1.0, np.float32).reshape(()))
    if keep == "F16":
        config["torch_dtype"] = "float16"
        config.pop("dtype", None)
    if name == "awq":
        config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group, "version": "gemm",
                                         "zero_point": True, "modules_to_not_convert": None}
    elif name == "gptq":
        config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": True,
                                         "sym": False, "checkpoint_format": "gptq", "true_sequential": True}
    elif name == "gptq-v2-8bit":
        config["quantization_config"] = {"quant_method": "gptq", "bits": 8, "group_size": group, "desc_act": False,
                                         "sym": False, "checkpoint_format": "gptq_v2"}
    elif name in ("fp8-channel", "fp8-tensor"):
        channel = name == "fp8-channel"
        config["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"], "kv_cache_scheme": None,
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "symmetric": True,
                            "strategy": "channel" if channel else "tensor", "dynamic": False},
                "input_activations": {"num_bits": 8, "type": "float", "symmetric": True,
                                      "strategy": "token" if channel else "tensor", "dynamic": channel}}}}
    elif name == "fp8-block":
        config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                         "weight_block_size": [128, 128]}
    elif name == "fbgemm-fp8":
        config["quantization_config"] = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                                         "modules_to_not_convert": ["lm_head"]}
    elif name == "modelopt-fp8":
        json.dump({"producer": {"name": "modelopt"},
                   "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}},
                  open(os.path.join(fmt_dir, "hf_quant_config.json"), "w"), indent=2)
    json.dump(config, open(os.path.join(fmt_dir, "config.json"), "w"), indent=2)
    write_safetensors(os.path.join(fmt_dir, "model.safetensors"), tensors)
    write_safetensors(os.path.join(fmt_dir, "dequant.safetensors"), {k: ("F32", v) for k, v in deqs.items()})
    # the dense twin: float32 everywhere, the dequantized weights in place of the quantized ones
    dense_cfg = dict(config)
    dense_cfg.pop("quantization_config", None)
    dense_cfg["torch_dtype"] = "float32"
    dense_cfg.pop("dtype", None)
    dense = {}
    for tname, (dt, a) in src.items():
        if tname in deqs:
            dense[tname] = ("F32", deqs[tname])
        else:
            v = a.astype(np.float16).astype(np.float32) if keep == "F16" else a.astype(np.float32)
            dense[tname] = ("F32", v)
    json.dump(dense_cfg, open(os.path.join(fmt_dir, "dense", "config.json"), "w"), indent=2)
    write_safetensors(os.path.join(fmt_dir, "dense", "model.safetensors"), dense)
    for extra in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        p = os.path.join(src_dir, extra)
        if os.path.exists(p):
            shutil.copy(p, fmt_dir)
            shutil.copy(p, os.path.join(fmt_dir, "dense"))


FORMATS = ["awq", "gptq", "gptq-v2-8bit", "fp8-channel", "fp8-tensor", "fp8-block", "fbgemm-fp8", "modelopt-fp8"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--group-size", type=int, default=32)
    args = ap.parse_args()
    src = {k: v[1].astype(np.float32) if v[1].dtype != np.float32 else v[1]
           for k, v in read_safetensors(os.path.join(args.src, "model.safetensors")).items()}
    src = {k: (None, v) for k, v in src.items()}
    for name in args.formats.split(","):
        if name not in FORMATS:
            raise SystemExit("unknown format " + name + " (" + ", ".join(FORMATS) + ")")
        write_format(name, args.src, src, args.out, args.group_size, np.random.default_rng(1234))


if __name__ == "__main__":
    main()
