#!/usr/bin/env python3
"""Transformers references for the checkpoints of tools/make_quant_checkpoints.py.

For each format folder under --dir, the quantized tensors of model.safetensors are
dequantized here in PyTorch, independently of both Osprey and the numpy script (AWQ: unpack
with the reverse of the [0, 2, 4, 6, 1, 3, 5, 7] order; GPTQ: unpack along the inputs, zero
points + 1 for checkpoint_format "gptq", g_idx per input; FP8: torch.float8_e4m3fn times its
scale, per tensor, row or block). The weights are loaded into the transformers model of the
folder's config (quantization_config removed) in float32, and
<format>/reference.safetensors gets, for each of 3 seeded prompts i:
  tokens_i [T] i32, logits_i [T, vocab] f32         every position of one forward pass
  greedy_prompt_i, greedy_tokens_i [32] i32, greedy_margins_i [32] f32
                                                   greedy continuation and each step's
                                                   top-1 minus top-2 logit (teacher-forced)
and dequant_check: the largest |torch dequantization - dequant.safetensors| over all weights.

Usage (torch + transformers, CUDA if present):
  /usr/bin/python3 tools/make_quant_checkpoints.py --src tests/fixtures/models/llama --out /tmp/quant
  python3 tools/quant_reference.py --dir /tmp/quant
"""

import argparse
import json
import os
import tempfile

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

AWQ_REVERSE = [0, 4, 1, 5, 2, 6, 3, 7]


def unpack_cols(packed, bits):
    """int32 [r, c] -> [r, c * 32 / bits]: column c*per + j from bits bits*j (no reordering)."""
    per = 32 // bits
    shifts = torch.arange(0, 32, bits, device=packed.device, dtype=torch.int32)
    v = torch.bitwise_right_shift(packed[:, :, None], shifts[None, None, :]) & (2 ** bits - 1)
    return v.reshape(packed.shape[0], packed.shape[1] * per)


def awq_dequant(t, p, group):
    qw, qz, s = t[p + ".qweight"], t[p + ".qzeros"], t[p + ".scales"].float()
    order = torch.arange(qw.shape[1] * 8).view(-1, 8)[:, AWQ_REVERSE].reshape(-1)
    w = unpack_cols(qw, 4)[:, order]  # [in, out]
    z = unpack_cols(qz, 4)[:, order]  # [in/g, out]
    zf = z.repeat_interleave(group, dim=0)
    sf = s.repeat_interleave(group, dim=0)
    return ((w - zf).float() * sf).T.contiguous()


def gptq_dequant(t, p, bits, v1):
    qw, qz, s = t[p + ".qweight"], t[p + ".qzeros"], t[p + ".scales"].float()
    w = unpack_cols(qw.T.contiguous(), bits).T  # [in, out]
    z = unpack_cols(qz, bits) + (1 if v1 else 0)  # [in/g, out]
    g_idx = t[p + ".g_idx"].long()
    return ((w - z[g_idx]).float() * s[g_idx]).T.contiguous()


def fp8_dequant(t, p, block):
    w = t[p + ".weight"].to(torch.float32)
    name = p + ".weight_scale_inv" if p + ".weight_scale_inv" in t else p + ".weight_scale"
    s = t[name].float()
    if s.numel() == 1:
        return w * s.reshape(())
    if s.numel() == w.shape[0]:
        return w * s.reshape(-1, 1)
    full = s.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[: w.shape[0], : w.shape[1]]
    return w * full


def dequantize_folder(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    qc = cfg.get("quantization_config", {"quant_method": "modelopt"})
    t = load_file(os.path.join(d, "model.safetensors"))
    out = {}
    for name in list(t):
        if name.endswith(".qweight"):
            p = name[: -len(".qweight")]
            if qc["quant_method"] == "awq":
                out[p + ".weight"] = awq_dequant(t, p, qc["group_size"])
            else:
                out[p + ".weight"] = gptq_dequant(t, p, qc["bits"], qc.get("checkpoint_format", "gptq") == "gptq")
        elif name.endswith(".weight") and t[name].dtype == torch.float8_e4m3fn:
            p = name[: -len(".weight")]
            out[name] = fp8_dequant(t, p, qc.get("weight_block_size", [128, 128]))
        elif not any(name.endswith(x) for x in (".qzeros", ".scales", ".g_idx", ".weight_scale", ".weight_scale_inv",
                                                 ".input_scale", ".k_scale", ".v_scale")):
            out[name] = t[name].float()
    return cfg, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for fmt in sorted(os.listdir(args.dir)):
        d = os.path.join(args.dir, fmt)
        if not os.path.isfile(os.path.join(d, "model.safetensors")):
            continue
        cfg, weights = dequantize_folder(d)
        mine = load_file(os.path.join(d, "dequant.safetensors"))
        check = max(float((weights[k] - mine[k]).abs().max()) for k in mine)
        cfg.pop("quantization_config", None)
        cfg["torch_dtype"] = "float32"
        with tempfile.TemporaryDirectory() as tmp:
            json.dump(cfg, open(os.path.join(tmp, "config.json"), "w"))
            save_file({k: v.contiguous() for k, v in weights.items()}, os.path.join(tmp, "model.safetensors"))
            model = AutoModelForCausalLM.from_pretrained(tmp, torch_dtype=torch.float32).to(dev).eval()
        ref = {"dequant_check": torch.tensor([check], dtype=torch.float32)}
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for i in range(3):
                ids = torch.randint(3, 256, (24,), generator=g)
                ref[f"tokens_{i}"] = ids.to(torch.int32)
                ref[f"logits_{i}"] = model(ids[None].to(dev)).logits[0].float().cpu()
                prompt = torch.randint(3, 256, (8,), generator=g)
                seq = prompt.tolist()
                for _ in range(32):
                    seq.append(int(model(torch.tensor([seq], device=dev)).logits[0, -1].argmax()))
                logits = model(torch.tensor([seq[:-1]], device=dev)).logits[0, len(prompt) - 1:].float().cpu()
                top = logits.topk(2, dim=-1).values
                ref[f"greedy_prompt_{i}"] = prompt.to(torch.int32)
                ref[f"greedy_tokens_{i}"] = torch.tensor(seq[len(prompt):], dtype=torch.int32)
                ref[f"greedy_margins_{i}"] = (top[:, 0] - top[:, 1]).contiguous()
        save_file(ref, os.path.join(d, "reference.safetensors"))
        print(f"{fmt}: dequantization differs from the numpy script's by at most {check:.3g}")


if __name__ == "__main__":
    main()
