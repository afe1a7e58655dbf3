#!/usr/bin/env python3
"""Writes tiny random-weight checkpoints and their transformers reference outputs.

For each family (llama, qwen2) this writes, under OUT/<family>/:
  config.json, generation_config.json, model.safetensors   (bf16, via save_pretrained)
  reference.safetensors                                    (see below)
  reference.json                                           (versions, config, seeds, margins)

The references are computed from the folder as transformers loads it back
(from_pretrained(folder, dtype=float32, attn_implementation="eager")), on CUDA in
float32 with TF32 off; the in-memory model that wrote the files is never used.

reference.safetensors, for i in 0, 1, 2:
  tokens_<i>          int32   [T_i]          T = 7, 33, 100; ids in [3, vocab)
  logits_<i>          float32 [T_i, vocab]   full forward, every position
  greedy_prompt_<i>   int32   [T_i]          same ids as tokens_<i>
  greedy_tokens_<i>   int32   [64]           greedy continuation (eos ignored)
  greedy_margins_<i>  float32 [64]           top1 - top2 logit at each generated step

The weights are drawn with numpy (seeded) and rounded to bf16 before they reach torch, and
an independent float64 numpy forward pass of the same weights is compared against the
transformers logits as a check on how the config was interpreted.

Usage:
  python3 make_fixtures.py --out DIR            (needs torch + transformers; CUDA if present)
  python3 make_fixtures.py --numpy-only         (margins of the numpy forward only; no torch)
"""

import argparse
import json
import math
import os
import sys
import traceback

import numpy as np

SEQUENCE_LENGTHS = (7, 33, 100)
N_GREEDY = 64
TOKEN_SEED = 1234
MIN_TOKEN_ID = 3

FAMILIES = {
    "llama": {
        "seed": 122,
        "config": {
            "model_type": "llama",
            "vocab_size": 512,
            "hidden_size": 64,
            "intermediate_size": 160,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            "max_position_embeddings": 2048,
            "tie_word_embeddings": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
        },
        # std of the normal draws, per weight kind
        "std": {
            "embed": 1.0,
            "lm_head": 1.0,
            "q": 0.14,
            "k": 0.14,
            "v": 0.14,
            "o": 0.14,
            "gate": 0.14,
            "up": 0.14,
            "down": 0.12,
            "norm": 0.1,  # norm weights are scale * (1 + std * N(0, 1))
            "final_norm_scale": 1.0,
            "bias": 0.0,
        },
    },
    "qwen2": {
        # Seed and q/k scales keep the fp16 rounding of the engine's KV cache alone under 6e-4 of
        # the logit range (1.1e-3 at seed 111 with q/k std 0.2 and bias 0.3), while every
        # greedy step keeps a top1-top2 margin above 0.05.
        "seed": 120,
        "config": {
            "model_type": "qwen2",
            "vocab_size": 512,
            "hidden_size": 64,
            "intermediate_size": 176,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
            "max_position_embeddings": 2048,
            "tie_word_embeddings": True,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_act": "silu",
            "use_sliding_window": False,
        },
        "std": {
            "embed": 0.5,
            "lm_head": None,  # tied
            "q": 0.15,
            "k": 0.15,
            "v": 0.3,
            "o": 0.5,
            "gate": 0.14,
            "up": 0.14,
            "down": 0.4,
            "norm": 0.1,
            "final_norm_scale": 3.0,
            "bias": 0.2,
        },
    },
}


# ----------------------------------------------------------------------------------------
# weights (numpy)


def round_to_bf16(x):
    """float32 values rounded to the nearest bf16 (ties to even), returned as float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) & np.uint32(0xFFFF0000)).view(np.float32)


def head_dim_of(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def make_weights(family):
    """dict name -> float32 array (bf16-exact), HF parameter names and [out, in] layout."""
    spec = FAMILIES[family]
    cfg, std = spec["config"], spec["std"]
    rng = np.random.default_rng(spec["seed"])
    hidden, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    n_heads, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = head_dim_of(cfg)
    has_qkv_bias = cfg["model_type"] == "qwen2"

    def normal(shape, s):
        return round_to_bf16(rng.standard_normal(shape) * s)

    def norm_weight(scale=1.0):
        return round_to_bf16(scale * (1.0 + rng.standard_normal(hidden) * std["norm"]))

    w = {"model.embed_tokens.weight": normal((vocab, hidden), std["embed"])}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_weight()
        w[p + "self_attn.q_proj.weight"] = normal((n_heads * hd, hidden), std["q"])
        w[p + "self_attn.k_proj.weight"] = normal((n_kv * hd, hidden), std["k"])
        w[p + "self_attn.v_proj.weight"] = normal((n_kv * hd, hidden), std["v"])
        if has_qkv_bias:
            w[p + "self_attn.q_proj.bias"] = normal((n_heads * hd,), std["bias"])
            w[p + "self_attn.k_proj.bias"] = normal((n_kv * hd,), std["bias"])
            w[p + "self_attn.v_proj.bias"] = normal((n_kv * hd,), std["bias"])
        w[p + "self_attn.o_proj.weight"] = normal((hidden, n_heads * hd), std["o"])
        w[p + "post_attention_layernorm.weight"] = norm_weight()
        w[p + "mlp.gate_proj.weight"] = normal((inter, hidden), std["gate"])
        w[p + "mlp.up_proj.weight"] = normal((inter, hidden), std["up"])
        w[p + "mlp.down_proj.weight"] = normal((hidden, inter), std["down"])
    w["model.norm.weight"] = norm_weight(std["final_norm_scale"])
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = normal((vocab, hidden), std["lm_head"])
    return w


def make_token_sequences(vocab):
    rng = np.random.default_rng(TOKEN_SEED)
    return [rng.integers(MIN_TOKEN_ID, vocab, size=n).astype(np.int32) for n in SEQUENCE_LENGTHS]


# ----------------------------------------------------------------------------------------
# independent float64 forward pass (numpy)


def rope_inv_freq(cfg):
    """[head_dim / 2] inverse frequencies, float64, per the config's rope_parameters."""
    rp = cfg["rope_parameters"]
    hd = head_dim_of(cfg)
    inv = 1.0 / (rp["rope_theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    if rp["rope_type"] == "default":
        return inv
    assert rp["rope_type"] == "llama3"
    factor, low, high = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
    old_ctx = rp["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out = np.empty_like(inv)
    for j, f in enumerate(inv):
        wavelen = 2.0 * math.pi / f
        if wavelen < high_wavelen:
            out[j] = f
        elif wavelen > low_wavelen:
            out[j] = f / factor
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out[j] = (1.0 - smooth) * f / factor + smooth * f
    return out


def numpy_forward(cfg, w, tokens):
    """logits [T, vocab] float64 of a full causal forward over `tokens`."""
    f64 = {k: v.astype(np.float64) for k, v in w.items()}
    n_heads, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = head_dim_of(cfg)
    eps = cfg["rms_norm_eps"]
    T = len(tokens)

    def rms_norm(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

    def linear(x, name):
        y = x @ f64[name + ".weight"].T
        if name + ".bias" in f64:
            y = y + f64[name + ".bias"]
        return y

    inv = rope_inv_freq(cfg)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]  # [T, hd/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]  # [T, 1, hd/2]

    def rope(x):  # x: [T, n, hd], halves rotated as pairs (j, j + hd/2)
        a, b = x[..., : hd // 2], x[..., hd // 2 :]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

    mask = np.triu(np.full((T, T), -np.inf), k=1)
    x = f64["model.embed_tokens.weight"][tokens]  # [T, hidden]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, f64[p + "input_layernorm.weight"])
        q = rope(linear(h, p + "self_attn.q_proj").reshape(T, n_heads, hd))
        k = rope(linear(h, p + "self_attn.k_proj").reshape(T, n_kv, hd))
        v = linear(h, p + "self_attn.v_proj").reshape(T, n_kv, hd)
        out = np.empty((T, n_heads, hd))
        for hh in range(n_heads):
            kv = hh // (n_heads // n_kv)
            s = q[:, hh, :] @ k[:, kv, :].T / math.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            out[:, hh, :] = s @ v[:, kv, :]
        x = x + linear(out.reshape(T, n_heads * hd), p + "self_attn.o_proj")
        h = rms_norm(x, f64[p + "post_attention_layernorm.weight"])
        g = linear(h, p + "mlp.gate_proj")
        act = g / (1.0 + np.exp(-g)) * linear(h, p + "mlp.up_proj")
        x = x + linear(act, p + "mlp.down_proj")
    x = rms_norm(x, f64["model.norm.weight"])
    head = f64.get("lm_head.weight", f64["model.embed_tokens.weight"])
    return x @ head.T


def numpy_greedy(cfg, w, prompt, n):
    seq = list(int(t) for t in prompt)
    out, margins = [], []
    for _ in range(n):
        logits = numpy_forward(cfg, w, np.array(seq))[-1]
        order = np.argsort(-logits)
        margins.append(logits[order[0]] - logits[order[1]])
        out.append(int(order[0]))
        seq.append(int(order[0]))
    return np.array(out), np.array(margins)


def top2_margins(logits):
    """[T] top1 - top2 along the last axis."""
    part = np.sort(logits, axis=-1)
    return part[..., -1] - part[..., -2]


def stats(x):
    x = np.asarray(x, dtype=np.float64).ravel()
    return {
        "n": int(x.size),
        "min": float(x.min()),
        "p05": float(np.percentile(x, 5)),
        "median": float(np.median(x)),
        "max": float(x.max()),
        "count_below_0.01": int((x < 0.01).sum()),
        "count_below_0.05": int((x < 0.05).sum()),
    }


def numpy_only():
    for family, spec in FAMILIES.items():
        cfg = spec["config"]
        w = make_weights(family)
        seqs = make_token_sequences(cfg["vocab_size"])
        margins = []
        for s in seqs:
            logits = numpy_forward(cfg, w, s)
            assert np.isfinite(logits).all()
            margins.append(top2_margins(logits))
            print(f"{family} T={len(s)} logit std {logits.std():.3f} max|.| {np.abs(logits).max():.2f}")
        print(family, "logit margins", json.dumps(stats(np.concatenate(margins))))
        g_margins, g_tokens = [], []
        for s in seqs:
            toks, m = numpy_greedy(cfg, w, s, N_GREEDY)
            g_margins.append(m)
            g_tokens.append(toks)
        print(family, "greedy margins", json.dumps(stats(np.concatenate(g_margins))))
        for t in g_tokens:
            print(family, "greedy distinct tokens", len(set(t.tolist())), t[:16].tolist())
        print(family, "inv_freq", rope_inv_freq(cfg).tolist())


# ----------------------------------------------------------------------------------------
# transformers side


def write_family(family, out_root, torch, transformers, device):
    from safetensors.torch import save_file

    spec = FAMILIES[family]
    cfg = spec["config"]
    folder = os.path.join(out_root, family)
    os.makedirs(folder, exist_ok=True)

    cfg_kwargs = {k: v for k, v in cfg.items() if k != "model_type"}
    cfg_kwargs["rope_parameters"] = dict(cfg["rope_parameters"])
    if family == "llama":
        config = transformers.LlamaConfig(**cfg_kwargs)
        model_cls = transformers.LlamaForCausalLM
    else:
        config = transformers.Qwen2Config(**cfg_kwargs)
        model_cls = transformers.Qwen2ForCausalLM

    weights = make_weights(family)
    torch.manual_seed(spec["seed"])
    writer = model_cls(config).to(torch.float32)
    sd = writer.state_dict()
    expected = set(sd.keys())
    if cfg["tie_word_embeddings"]:
        expected.discard("lm_head.weight")
    if expected != set(weights.keys()):
        raise RuntimeError(
            f"{family}: parameter names differ: model-only {sorted(expected - set(weights))}, "
            f"numpy-only {sorted(set(weights) - expected)}"
        )
    with torch.no_grad():
        for name, value in weights.items():
            if tuple(sd[name].shape) != value.shape:
                raise RuntimeError(f"{family}: {name} shape {tuple(sd[name].shape)} vs {value.shape}")
            sd[name].copy_(torch.from_numpy(value))
    if cfg["tie_word_embeddings"]:
        assert torch.equal(writer.lm_head.weight, writer.model.embed_tokens.weight)
    writer = writer.to(torch.bfloat16)
    writer.save_pretrained(folder)
    if not os.path.exists(os.path.join(folder, "generation_config.json")):
        writer.generation_config.save_pretrained(folder)
    del writer, sd
    if not os.path.exists(os.path.join(folder, "model.safetensors")):
        raise RuntimeError(f"{family}: save_pretrained wrote {sorted(os.listdir(folder))}")

    # Everything below uses only the folder.
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager"
        )
    except TypeError:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, torch_dtype=torch.float32, attn_implementation="eager"
        )
    model = model.to(device).eval()
    loaded_sd = model.state_dict()
    for name, value in weights.items():
        got = loaded_sd[name].detach().float().cpu().numpy()
        if not np.array_equal(got, value):
            raise RuntimeError(f"{family}: reloaded {name} differs from the bf16 weights written")
    vocab = cfg["vocab_size"]
    seqs = make_token_sequences(vocab)
    tensors = {}
    all_margins, greedy_all, numpy_diffs, generate_agreement = [], [], [], []
    numpy_greedy_agree = []

    with torch.no_grad():
        for i, s in enumerate(seqs):
            ids = torch.from_numpy(s.astype(np.int64))[None].to(device)
            logits = model(input_ids=ids, use_cache=False).logits[0].float()  # [T, vocab]
            logits_np = logits.cpu().numpy()
            if not np.isfinite(logits_np).all():
                raise RuntimeError(f"{family}: non-finite logits for sequence {i}")
            tensors[f"tokens_{i}"] = torch.from_numpy(s.copy()).contiguous()
            tensors[f"logits_{i}"] = torch.from_numpy(logits_np.copy()).contiguous()
            all_margins.append(top2_margins(logits_np))
            ref64 = numpy_forward(cfg, weights, s)
            numpy_diffs.append(float(np.abs(ref64 - logits_np).max()))

            seq = ids.clone()
            g_tokens, g_margins = [], []
            for _ in range(N_GREEDY):
                last = model(input_ids=seq, use_cache=False).logits[0, -1].float()
                top = torch.topk(last, 2)
                nxt = int(top.indices[0])
                g_tokens.append(nxt)
                g_margins.append(float(top.values[0] - top.values[1]))
                seq = torch.cat([seq, torch.tensor([[nxt]], device=device)], dim=1)
            g_tokens = np.array(g_tokens, dtype=np.int32)
            g_margins = np.array(g_margins, dtype=np.float32)
            tensors[f"greedy_prompt_{i}"] = torch.from_numpy(s.copy()).contiguous()
            tensors[f"greedy_tokens_{i}"] = torch.from_numpy(g_tokens).contiguous()
            tensors[f"greedy_margins_{i}"] = torch.from_numpy(g_margins).contiguous()
            greedy_all.append(g_margins)
            np_tokens, _ = numpy_greedy(cfg, weights, s, N_GREEDY)
            numpy_greedy_agree.append(bool(np.array_equal(np_tokens, g_tokens)))

            # Cross-check with the cached generate() path, up to the first eos of the loop.
            try:
                gen = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=False,
                    max_new_tokens=N_GREEDY,
                    min_new_tokens=N_GREEDY,
                    pad_token_id=0,
                )[0, ids.shape[1] :].cpu().numpy()
                eos_hits = np.nonzero(g_tokens == cfg["eos_token_id"])[0]
                upto = int(eos_hits[0]) if eos_hits.size else N_GREEDY
                agree = 0
                while agree < min(upto, len(gen)) and gen[agree] == g_tokens[agree]:
                    agree += 1
                generate_agreement.append({"compared": upto, "agreeing_prefix": agree})
            except Exception as e:  # informative only
                generate_agreement.append({"error": repr(e)[:300]})
            print(
                f"{family} seq {i} T={len(s)}: logits max|diff| vs numpy f64 {numpy_diffs[-1]:.3e}, "
                f"greedy margin median {np.median(g_margins):.3f} min {g_margins.min():.4f}, "
                f"numpy greedy equal {numpy_greedy_agree[-1]}, "
                f"generate agreement {generate_agreement[-1]}"
            )

    save_file(tensors, os.path.join(folder, "reference.safetensors"))

    inv_loaded = None
    rotary = getattr(model.model, "rotary_emb", None)
    if rotary is not None and hasattr(rotary, "inv_freq"):
        inv_loaded = rotary.inv_freq.detach().double().cpu().numpy()
    inv_expected = rope_inv_freq(cfg)
    logit_stats = stats(np.concatenate(all_margins))
    greedy_stats = stats(np.concatenate(greedy_all))
    with open(os.path.join(folder, "config.json")) as f:
        written_config = json.load(f)
    report = {
        "family": family,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "compute": "float32, eager attention, TF32 off, reloaded with from_pretrained(folder)",
        "config_arguments": cfg_kwargs,
        "config_json_written": written_config,
        "weight_seed": spec["seed"],
        "weight_std": spec["std"],
        "weight_init": "numpy default_rng(weight_seed) standard_normal * std, rounded to bf16; "
        "norm weights 1 + std_norm * N(0,1), the final norm's times final_norm_scale; "
        "seeds picked (numpy float64 sweep) for clear greedy margins",
        "token_seed": TOKEN_SEED,
        "token_range": [MIN_TOKEN_ID, vocab],
        "sequence_lengths": list(SEQUENCE_LENGTHS),
        "greedy": f"{N_GREEDY} tokens by a loop of full forwards (no cache), eos ignored; "
        "greedy_prompt_<i> equals tokens_<i>",
        "logit_margin_stats": logit_stats,
        "greedy_margin_stats": greedy_stats,
        "numpy_float64_max_abs_logit_diff": numpy_diffs,
        "numpy_float64_greedy_tokens_equal": numpy_greedy_agree,
        "generate_agreement": generate_agreement,
        "rope_inv_freq_expected": inv_expected.tolist(),
        "rope_inv_freq_loaded": None if inv_loaded is None else inv_loaded.tolist(),
    }
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"{family}: logit margins {json.dumps(logit_stats)}")
    print(f"{family}: greedy margins {json.dumps(greedy_stats)}")
    if inv_loaded is not None:
        print(f"{family}: inv_freq max rel diff {np.max(np.abs(inv_loaded / inv_expected - 1)):.2e}")
    print(f"{family}: files {sorted(os.listdir(folder))}")
    print(f"{family}: config.json {json.dumps(written_config, sort_keys=True)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output folder (one subfolder per family)")
    ap.add_argument("--numpy-only", action="store_true", help="print numpy-forward margins only")
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated subset")
    args = ap.parse_args()
    if args.numpy_only:
        numpy_only()
        return
    if not args.out:
        ap.error("--out is required")

    import torch
    import transformers

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device}")
    failed = []
    for family in args.families.split(","):
        try:
            write_family(family, args.out, torch, transformers, device)
        except Exception:
            traceback.print_exc()
            failed.append(family)
    if failed:
        print(f"FAILED: {failed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
