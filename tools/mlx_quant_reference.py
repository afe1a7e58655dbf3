#!/usr/bin/env python3
"""MLX affine quantization: an independent reference quantizer (vectorised torch) and the
quantized model fixtures with their transformers references.

The quantizer follows MLX's algorithm (DESIGN.md §3) in float32 on the CPU, per group of
`group_size` inputs of a row:
  n_bins = 2^bits - 1
  scale  = max((max - min) / n_bins, 1e-7), negated unless |min| > |max|
  edge   = min if |min| > |max| else max
  q0     = round(edge / scale)                      (round half to even)
  scale  = edge / q0 and bias = edge if q0 != 0, else bias = 0
then scale and bias are rounded to the storage dtype (float16 | bfloat16) and the codes come
from the ROUNDED values: q = clamp(round((w - bias) / scale), 0, n_bins). Codes are packed
as one little-endian bit stream per row (code i in stream bits [i*bits, (i+1)*bits), word j
holds stream bits [32j, 32j+32)). Every division is tensor / tensor (no scalar divisor, which
some torch kernels turn into a multiplication by the reciprocal).

Writes, under OUT:
  quant/quantizer.safetensors
      x                      float32 [18, 384]  rows chosen to hit every branch (below)
      b<B>_g<G>_<dt>.packed  uint32 [18, 384*B/32]   for B in 2,3,4,6,8, G in 32,64,128,
      b<B>_g<G>_<dt>.scales  <dt> [18, 384/G]         dt in f16, bf16
      b<B>_g<G>_<dt>.biases  <dt> [18, 384/G]
      x_bf16, x_f16          x rounded to bfloat16 / float16 (the quantizer's upcast path)
      x_bf16.b4_g64_bf16.*, x_f16.b8_g32_f16.*   their quantizations
  quant/quantizer.json       the row recipes, versions
  models/<name>/             MLX-layout checkpoints quantized from tests/fixtures/models/*:
      config.json (source + "quantization" and "quantization_config"), generation_config.json,
      model.safetensors (u32 weights, scales, biases; other tensors in the scale dtype),
      reference.safetensors and reference.json in the format of tools/make_fixtures.py,
      computed by transformers from the DEQUANTIZED weights: they are written as a float32
      Hugging Face checkpoint in a temporary folder and loaded back with from_pretrained.

Usage:
  python3 mlx_quant_reference.py --out DIR                 (torch + transformers; CUDA if present)
  python3 mlx_quant_reference.py --out DIR --no-reference  (quantizer and checkpoints only)
"""

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
import traceback

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as mf  # noqa: E402  (token sequences, numpy float64 forward, margin stats)

SOURCE_MODELS = os.path.join(HERE, "..", "tests", "fixtures", "models")
QUANTIZER_SEED = 4321
COLS = 384  # divisible by every supported group size

# name -> source family, global setting, scale dtype, per-module overrides (dict or False)
MODELS = {
    "llama-q4": {
        "source": "llama",
        "bits": 4,
        "group_size": 64,
        "dtype": "bfloat16",
        # down_proj (160 inputs) is left dense: 64 does not divide 160, as mlx-lm does
        "overrides": {"model.layers.1.mlp.up_proj": {"group_size": 32, "bits": 8}},
    },
    "llama-q8": {"source": "llama", "bits": 8, "group_size": 64, "dtype": "float16", "overrides": {}},
    "qwen2-q4": {
        "source": "qwen2",
        "bits": 4,
        "group_size": 32,
        # bfloat16: with float16 scales the fp16 rounding of the engine's KV cache alone moves
        # sequence 2's logits by 7.3e-4 of their range (float64 numpy estimate), 5.4e-4 here
        "dtype": "bfloat16",
        # down_proj (176 inputs) is left dense; the tied embedding is quantized and is the head
        "overrides": {
            "model.layers.0.mlp.gate_proj": {"group_size": 32, "bits": 6},
            "model.layers.1.self_attn.o_proj": False,
        },
    },
}

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
SHORT = {torch.float16: "f16", torch.bfloat16: "bf16"}


# ----------------------------------------------------------------------------------------
# the quantizer


def quantize(w, bits, group_size, scale_dtype):
    """w float32 [rows, cols] (CPU) -> packed np.uint32 [rows, cols*bits/32], scales and
    biases torch [rows, cols/group_size] in scale_dtype, codes int64 [rows, cols]."""
    assert w.dtype == torch.float32 and w.dim() == 2
    rows, cols = w.shape
    assert cols % group_size == 0
    g = w.reshape(rows, cols // group_size, group_size)
    w_max = g.amax(dim=-1)
    w_min = g.amin(dim=-1)
    n_bins = torch.full_like(w_max, float(2**bits - 1))
    eps = torch.full_like(w_max, 1e-7)
    min_is_edge = w_min.abs() > w_max.abs()
    scale = torch.maximum(torch.div(w_max - w_min, n_bins), eps)
    scale = torch.where(min_is_edge, scale, -scale)
    edge = torch.where(min_is_edge, w_min, w_max)
    q0 = torch.round(torch.div(edge, scale))
    nonzero = q0 != 0
    safe_q0 = torch.where(nonzero, q0, torch.ones_like(q0))
    scale = torch.where(nonzero, torch.div(edge, safe_q0), scale)
    bias = torch.where(nonzero, edge, torch.zeros_like(edge))

    scales = scale.to(scale_dtype)
    biases = bias.to(scale_dtype)
    s = scales.float().unsqueeze(-1).expand(rows, cols // group_size, group_size).contiguous()
    b = biases.float().unsqueeze(-1).expand(rows, cols // group_size, group_size).contiguous()
    q = torch.round(torch.div(g - b, s))
    q = torch.minimum(torch.maximum(q, torch.zeros_like(q)), torch.full_like(q, float(2**bits - 1)))
    codes = q.to(torch.int64).reshape(rows, cols)
    return pack(codes, bits), scales, biases, codes


def pack(codes, bits):
    """codes int64 [rows, cols] -> np.uint32 [rows, cols*bits/32]: the row's bit stream."""
    rows, cols = codes.shape
    assert (cols * bits) % 32 == 0
    planes = (codes.unsqueeze(-1) >> torch.arange(bits)) & 1  # [rows, cols, bits]
    stream = planes.reshape(rows, cols * bits // 32, 32)  # stream bit k of word j
    words = (stream << torch.arange(32)).sum(dim=-1)  # int64 in [0, 2^32)
    return words.numpy().astype(np.uint32)


def unpack(packed, bits, cols):
    """np.uint32 [rows, W] -> int64 codes [rows, cols]."""
    words = torch.from_numpy(packed.astype(np.int64))
    rows = words.shape[0]
    stream = (words.unsqueeze(-1) >> torch.arange(32)) & 1  # [rows, W, 32]
    planes = stream.reshape(rows, cols, bits)
    return (planes << torch.arange(bits)).sum(dim=-1)


def dequantize(packed, scales, biases, bits, group_size, cols):
    """float32 [rows, cols] = scale * q + bias, in float32."""
    codes = unpack(packed, bits, cols).to(torch.float32)
    s = scales.float().repeat_interleave(group_size, dim=-1)
    b = biases.float().repeat_interleave(group_size, dim=-1)
    return s * codes + b


# ----------------------------------------------------------------------------------------
# safetensors files (own reader and writer: u32 and bf16 without depending on library support)

ST_DTYPES = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (np.uint16, 2), "U32": (np.uint32, 4),
             "I32": (np.int32, 4)}


def read_safetensors(path):
    """name -> (dtype string, np array; BF16 as raw uint16)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        np_dtype, _ = ST_DTYPES[e["dtype"]]
        begin, end = e["data_offsets"]
        arr = np.frombuffer(data[base + begin : base + end], dtype=np_dtype).reshape(e["shape"])
        out[name] = (e["dtype"], arr.copy())
    return out


def to_float32(dtype, arr):
    if dtype == "BF16":
        return torch.from_numpy((arr.astype(np.uint32) << 16).view(np.float32).copy())
    return torch.from_numpy(arr.astype(np.float32))


def as_entry(t):
    """torch or numpy array -> (safetensors dtype, bytes, shape)."""
    if isinstance(t, np.ndarray):
        kind = {np.dtype(np.uint32): "U32", np.dtype(np.float32): "F32", np.dtype(np.int32): "I32",
                np.dtype(np.float16): "F16"}[t.dtype]
        return kind, np.ascontiguousarray(t).tobytes(), list(t.shape)
    t = t.contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return "BF16", t.view(torch.int16).numpy().tobytes(), list(t.shape)
    if t.dtype == torch.float16:
        return "F16", t.numpy().tobytes(), list(t.shape)
    if t.dtype == torch.float32:
        return "F32", t.numpy().tobytes(), list(t.shape)
    if t.dtype == torch.int32:
        return "I32", t.numpy().tobytes(), list(t.shape)
    raise TypeError(t.dtype)


def write_safetensors(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        kind, blob, shape = as_entry(tensors[name])
        header[name] = {"dtype": kind, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for blob in blobs:
            f.write(blob)


# ----------------------------------------------------------------------------------------
# (a) the quantizer fixture

ROW_RECIPES = [
    "normal(0, 1)",
    "normal(0, 1) * 1e-3",
    "normal(0, 1) * 50",
    "all equal 0.3",
    "all zeros",
    "all equal -2.5",
    "normal(0, 1) - 1.5 (|min| > |max| in most groups)",
    "normal(0, 1) + 1.5 (|max| > |min| in most groups)",
    "(j mod 31) / 2: half-integers, rounding ties for several bit widths",
    "normal(0, 1) with every third value exactly 0",
    "normal(0, 1) * 1e-6 (scale clamped to 1e-7)",
    "normal(0, 1) * 1e-4 (float16 scales subnormal)",
    "normal(0, 1) * 10^uniform(-3, 2) per element",
    "normal(0, 1) * 10^uniform(-2, 1) per block of 32",
    "one constant per block of 32",
    "uniform(-1, 1) with one outlier of +-20 per block of 32",
    "all equal 3e-8 (q0 == 0: bias 0)",
    "normal(0, 1) * 1e-8",
]


def quantizer_input():
    rng = np.random.default_rng(QUANTIZER_SEED)
    j = np.arange(COLS)
    n = lambda: rng.standard_normal(COLS)  # noqa: E731
    rows = [
        n(),
        n() * 1e-3,
        n() * 50,
        np.full(COLS, 0.3),
        np.zeros(COLS),
        np.full(COLS, -2.5),
        n() - 1.5,
        n() + 1.5,
        (j % 31) / 2.0,
        np.where(j % 3 == 0, 0.0, n()),
        n() * 1e-6,
        n() * 1e-4,
        n() * 10.0 ** rng.uniform(-3, 2, COLS),
        n() * np.repeat(10.0 ** rng.uniform(-2, 1, COLS // 32), 32),
        np.repeat(rng.standard_normal(COLS // 32), 32),
        np.where(j % 32 == 7, 20.0 * np.sign(rng.standard_normal(COLS)), rng.uniform(-1, 1, COLS)),
        np.full(COLS, 3e-8),
        n() * 1e-8,
    ]
    assert len(rows) == len(ROW_RECIPES)
    return torch.from_numpy(np.stack(rows).astype(np.float32))


def check_quantization(x, packed, scales, biases, codes, bits, group_size, what):
    """Self-checks: pack/unpack round trip; codes in range; dequantized error bounded."""
    cols = x.shape[1]
    assert np.array_equal(unpack(packed, bits, cols).numpy(), codes.numpy()), what
    assert int(codes.min()) >= 0 and int(codes.max()) <= 2**bits - 1, what
    deq = dequantize(packed, scales, biases, bits, group_size, cols).double()
    s = scales.double().abs().repeat_interleave(group_size, dim=-1)
    err = (deq - x.double()).abs()
    # inside the representable range the error is at most half a step (plus storage rounding of
    # the bias); report the worst ratio rather than assert, the clamped rows exceed it by design
    return float((err / s.clamp_min(1e-30)).max())


def write_quantizer_fixture(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    x = quantizer_input()
    tensors = {"x": x}
    worst = {}
    for bits in (2, 3, 4, 6, 8):
        for group_size in (32, 64, 128):
            for sdt in (torch.float16, torch.bfloat16):
                key = f"b{bits}_g{group_size}_{SHORT[sdt]}"
                packed, scales, biases, codes = quantize(x, bits, group_size, sdt)
                worst[key] = check_quantization(x, packed, scales, biases, codes, bits, group_size, key)
                tensors[key + ".packed"] = packed
                tensors[key + ".scales"] = scales
                tensors[key + ".biases"] = biases
    for src_dtype, bits, group_size, sdt in ((torch.bfloat16, 4, 64, torch.bfloat16), (torch.float16, 8, 32, torch.float16)):
        xs = x.to(src_dtype)
        name = "x_" + SHORT[src_dtype]
        tensors[name] = xs
        packed, scales, biases, codes = quantize(xs.float(), bits, group_size, sdt)
        key = f"{name}.b{bits}_g{group_size}_{SHORT[sdt]}"
        worst[key] = check_quantization(xs.float(), packed, scales, biases, codes, bits, group_size, key)
        tensors[key + ".packed"] = packed
        tensors[key + ".scales"] = scales
        tensors[key + ".biases"] = biases
    path = os.path.join(out_dir, "quantizer.safetensors")
    write_safetensors(path, tensors, {"format": "pt"})
    report = {
        "torch_version": torch.__version__,
        "seed": QUANTIZER_SEED,
        "rows": ROW_RECIPES,
        "cols": COLS,
        "worst_dequantized_error_in_scale_units": worst,
        "note": "worst over all rows; the all-equal rows exceed half a step by design (scale 1e-7, the bias "
        "rounded to 16 bits)",
    }
    with open(os.path.join(out_dir, "quantizer.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"quantizer fixture: {len(tensors)} tensors, {os.path.getsize(path)} bytes")


# ----------------------------------------------------------------------------------------
# (b) quantized checkpoints


def quantize_checkpoint(name, spec, out_dir):
    """Writes the MLX-layout folder; returns (source config, dequantized float32 weights)."""
    src = os.path.join(SOURCE_MODELS, spec["source"])
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    source = read_safetensors(os.path.join(src, "model.safetensors"))
    sdt = TORCH_DTYPES[spec["dtype"]]
    overrides = spec["overrides"]
    out, deq, quantized = {}, {}, []
    for tname in sorted(source):
        dtype, arr = source[tname]
        w = to_float32(dtype, arr)
        module = tname[: -len(".weight")] if tname.endswith(".weight") else None
        setting = overrides.get(module, {"bits": spec["bits"], "group_size": spec["group_size"]})
        if module and w.dim() == 2 and setting and w.shape[1] % setting["group_size"] == 0:
            bits, group_size = setting["bits"], setting["group_size"]
            packed, scales, biases, codes = quantize(w, bits, group_size, sdt)
            check_quantization(w, packed, scales, biases, codes, bits, group_size, tname)
            out[tname] = packed
            out[module + ".scales"] = scales
            out[module + ".biases"] = biases
            deq[tname] = dequantize(packed, scales, biases, bits, group_size, w.shape[1])
            quantized.append(f"{tname}: {bits}-bit g{group_size}")
        else:
            out[tname] = w.to(sdt)
            deq[tname] = out[tname].float()
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), out, {"format": "mlx"})
    quant = {"group_size": spec["group_size"], "bits": spec["bits"]}
    quant.update(overrides)
    qconfig = dict(config)
    qconfig["quantization"] = quant
    qconfig["quantization_config"] = quant
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(qconfig, f, indent=2, sort_keys=True)
        f.write("\n")
    shutil.copy(os.path.join(src, "generation_config.json"), out_dir)
    print(f"{name}: {len(quantized)} quantized tensors, {os.path.getsize(os.path.join(out_dir, 'model.safetensors'))} bytes")
    for q in quantized:
        print(f"  {q}")
    return config, deq, quantized


def write_reference(name, spec, out_dir, config, deq, quantized, transformers, device):
    family = spec["source"]
    fam_cfg = mf.FAMILIES[family]["config"]
    weights_np = {k: v.numpy() for k, v in deq.items()}
    with tempfile.TemporaryDirectory() as hf_dir:
        hf_config = {k: v for k, v in config.items() if k not in ("quantization", "quantization_config")}
        with open(os.path.join(hf_dir, "config.json"), "w") as f:
            json.dump(hf_config, f, indent=2)
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in deq.items()}, os.path.join(hf_dir, "model.safetensors"),
                  metadata={"format": "pt"})
        shutil.copy(os.path.join(out_dir, "generation_config.json"), hf_dir)
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                                      attn_implementation="eager")
        except TypeError:
            model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32,
                                                                      attn_implementation="eager")
        model = model.to(device).eval()
    loaded = model.state_dict()
    for k, v in deq.items():
        if not torch.equal(loaded[k].detach().float().cpu(), v):
            raise RuntimeError(f"{name}: reloaded {k} differs from the dequantized weights written")
    head = model.get_output_embeddings().weight.detach().float().cpu()
    if not torch.equal(head, deq["lm_head.weight" if "lm_head.weight" in deq else "model.embed_tokens.weight"]):
        raise RuntimeError(f"{name}: the loaded lm head differs from the dequantized head or tied embedding")

    seqs = mf.make_token_sequences(fam_cfg["vocab_size"])
    tensors = {}
    all_margins, greedy_all, numpy_diffs, numpy_greedy_agree = [], [], [], []
    with torch.no_grad():
        for i, s in enumerate(seqs):
            ids = torch.from_numpy(s.astype(np.int64))[None].to(device)
            logits = model(input_ids=ids, use_cache=False).logits[0].float().cpu().numpy()
            if not np.isfinite(logits).all():
                raise RuntimeError(f"{name}: non-finite logits for sequence {i}")
            tensors[f"tokens_{i}"] = torch.from_numpy(s.copy())
            tensors[f"logits_{i}"] = torch.from_numpy(logits.copy())
            all_margins.append(mf.top2_margins(logits))
            numpy_diffs.append(float(np.abs(mf.numpy_forward(fam_cfg, weights_np, s) - logits).max()))

            seq = ids.clone()
            g_tokens, g_margins = [], []
            for _ in range(mf.N_GREEDY):
                last = model(input_ids=seq, use_cache=False).logits[0, -1].float()
                top = torch.topk(last, 2)
                nxt = int(top.indices[0])
                g_tokens.append(nxt)
                g_margins.append(float(top.values[0] - top.values[1]))
                seq = torch.cat([seq, torch.tensor([[nxt]], device=device)], dim=1)
            g_tokens = np.array(g_tokens, dtype=np.int32)
            g_margins = np.array(g_margins, dtype=np.float32)
            tensors[f"greedy_prompt_{i}"] = torch.from_numpy(s.copy())
            tensors[f"greedy_tokens_{i}"] = torch.from_numpy(g_tokens)
            tensors[f"greedy_margins_{i}"] = torch.from_numpy(g_margins)
            greedy_all.append(g_margins)
            np_tokens, _ = mf.numpy_greedy(fam_cfg, weights_np, s, mf.N_GREEDY)
            numpy_greedy_agree.append(bool(np.array_equal(np_tokens, g_tokens)))
            print(f"{name} seq {i} T={len(s)}: max|diff| vs numpy f64 {numpy_diffs[-1]:.3e}, greedy margin "
                  f"median {np.median(g_margins):.3f} min {g_margins.min():.4f}, numpy greedy equal "
                  f"{numpy_greedy_agree[-1]}")
    write_safetensors(os.path.join(out_dir, "reference.safetensors"), tensors)
    report = {
        "name": name,
        "source": f"tests/fixtures/models/{family}",
        "quantization": {k: spec[k] for k in ("bits", "group_size", "dtype", "overrides")},
        "quantized_tensors": quantized,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "compute": "float32, eager attention, TF32 off; the dequantized weights (scale * q + bias in float32) "
        "written as a float32 checkpoint and reloaded with from_pretrained(folder)",
        "token_seed": mf.TOKEN_SEED,
        "sequence_lengths": list(mf.SEQUENCE_LENGTHS),
        "greedy": f"{mf.N_GREEDY} tokens by a loop of full forwards (no cache), eos ignored",
        "logit_margin_stats": mf.stats(np.concatenate(all_margins)),
        "greedy_margin_stats": mf.stats(np.concatenate(greedy_all)),
        "numpy_float64_max_abs_logit_diff": numpy_diffs,
        "numpy_float64_greedy_tokens_equal": numpy_greedy_agree,
    }
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"{name}: greedy margins {json.dumps(report['greedy_margin_stats'])}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (quant/ and models/ below it)")
    ap.add_argument("--no-reference", action="store_true", help="skip transformers (no references)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    write_quantizer_fixture(os.path.join(args.out, "quant"))

    transformers, device = None, "cpu"
    if not args.no_reference:
        import transformers

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        device = "cuda" if torch.cuda.is_available() else "cpu"
        print(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device}")
    failed = []
    for name in args.models.split(","):
        try:
            out_dir = os.path.join(args.out, "models", name)
            config, deq, quantized = quantize_checkpoint(name, MODELS[name], out_dir)
            if transformers is not None:
                write_reference(name, MODELS[name], out_dir, config, deq, quantized, transformers, device)
        except Exception:
            traceback.print_exc()
            failed.append(name)
    if failed:
        print(f"FAILED: {failed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
