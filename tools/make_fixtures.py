#!/usr/bin/env python3
"""Writes tiny random-weight checkpoints and their transformers reference outputs.

For each family (llama, qwen2, qwen3, mistral, gemma3, gemma3-mm, cohere2, and the
mixtures of experts qwen3-moe, qwen3-moe-128, mixtral; --families picks some) this writes,
under OUT/<family>/:
  config.json, generation_config.json, model.safetensors   (bf16, via save_pretrained)
  reference.safetensors                                    (see below)
  reference.json                                           (versions, config, seeds, margins)

The references are computed from the folder as transformers loads it back
(from_pretrained(folder, dtype=float32, attn_implementation="eager")), on CUDA in
float32 with TF32 off; the in-memory model that wrote the files is never used.

reference.safetensors, for i in 0, 1, 2:
  tokens_<i>          int32   [T_i]          T = 7, 33, 100 (gemma3, cohere2: 7, 40, 100)
  logits_<i>          float32 [T_i, vocab]   full forward, every position
  greedy_prompt_<i>   int32   [T_i]          same ids as tokens_<i>
  greedy_tokens_<i>   int32   [64]           greedy continuation (eos ignored)
  greedy_margins_<i>  float32 [64]           top1 - top2 logit at each generated step

gemma3-mm also holds references for a prompt with an image (image_tokens, image_pixel_values_<i>,
image_patches_<i>, image_features_<i>, image_logits_<i>, image_greedy_tokens_0: see
image_references()), from the test images of tests/fixtures/vision/images, and its
preprocessor_config.json; a float64 numpy forward of the image encoder and of the text model
with the image's soft tokens checks them.

The weights are drawn with numpy (seeded) and rounded to bf16 before they reach torch, and
an independent float64 numpy forward pass of the same weights is compared against the
transformers logits as a check on how the config was interpreted.

Usage:
  python3 make_fixtures.py --out DIR            (needs torch + transformers; CUDA if present)
  python3 make_fixtures.py --numpy-only         (margins of the numpy forward only; no torch)
  python3 make_fixtures.py --numpy-reference --out DIR
                                                (no torch: the folder written by this script and
                                                 the float64 numpy forward as the reference;
                                                 reference.json says "reference": "numpy-float64"
                                                 until a run with transformers replaces it)
  --families gemma3,gemma3-mm,cohere2            (a subset; gemma3-mm needs gemma3 in the same OUT)

The mixture-of-experts families (moe_fixtures.py) also record how close each token's routing
came to a tie (router gaps), and --numpy-only counts the routing choices that change when the
K/V rows are rounded to float16 as the engine stores them.
"""

import argparse
import json
import math
import os
import re
import sys
import traceback

import numpy as np

import moe_fixtures as moe

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
    "qwen3": {
        # head_dim 32 with hidden 64 and 4 heads: q_proj's output (128) differs from hidden, as in
        # every real Qwen3 config. q/k norms per head before RoPE; tied embeddings.
        "seed": 130,
        "config": {
            "model_type": "qwen3",
            "vocab_size": 512,
            "hidden_size": 64,
            "intermediate_size": 176,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
            "max_position_embeddings": 2048,
            "tie_word_embeddings": True,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_act": "silu",
            "attention_bias": False,
            "use_sliding_window": False,
        },
        "std": {
            "embed": 0.5,
            "lm_head": None,  # tied
            "q": 0.15,
            "k": 0.15,
            "v": 0.3,
            "o": 0.3,
            "gate": 0.14,
            "up": 0.14,
            "down": 0.4,
            "norm": 0.1,
            "qk_norm": 0.3,
            "final_norm_scale": 3.0,
            "bias": 0.0,
        },
    },
    "mistral": {
        # A sliding window of 16 positions on every layer: the 33- and 100-token sequences
        # reach past it, so the references exercise the mask and the rotating cache.
        "seed": 148,
        "config": {
            "model_type": "mistral",
            "vocab_size": 512,
            "hidden_size": 64,
            "intermediate_size": 160,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "max_position_embeddings": 2048,
            "sliding_window": 16,
            "tie_word_embeddings": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_act": "silu",
        },
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
            "norm": 0.1,
            "final_norm_scale": 1.0,
            "bias": 0.0,
        },
    },
    "gemma3": {
        # Gemma3ForCausalLM (model_type gemma3_text). Norm weights are stored as w with the
        # layer computing x_hat * (1 + w); "norm_scale" gives the typical (1 + w) per norm so
        # that the residual stream (post_feedforward_layernorm scale) and the GeGLU product
        # (pre_feedforward_layernorm scale) pass float16's range while the final norm and the
        # softcap keep the logits well conditioned.
        # Seed and final norm scale picked by a float64 numpy sweep (seeds 301-356, final norm
        # 1.0 / 1.6 / 2.5) for greedy margins: two of 192 steps under 0.05, none under 0.03.
        "seed": 331,
        "sequence_lengths": (7, 40, 100),
        "config": {
            "model_type": "gemma3_text",
            "vocab_size": 512,
            "hidden_size": 64,
            "intermediate_size": 160,
            "num_hidden_layers": 6,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "hidden_activation": "gelu_pytorch_tanh",
            "rms_norm_eps": 1e-6,
            "query_pre_attn_scalar": 48,
            "sliding_window": 16,
            "layer_types": [
                "sliding_attention",
                "sliding_attention",
                "full_attention",
                "sliding_attention",
                "sliding_attention",
                "full_attention",
            ],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            },
            "final_logit_softcapping": 30.0,
            "attn_logit_softcapping": None,
            "max_position_embeddings": 2048,
            "tie_word_embeddings": True,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "attention_bias": False,
        },
        "std": {
            "embed": 0.6,
            "q": 0.15,
            "k": 0.15,
            "v": 0.15,
            "o": 0.15,
            "gate": 1.0,
            "up": 1.0,
            "down": 0.1,
            "norm": 0.3,  # stored w = scale * (1 + std * N(0, 1)) - 1
        },
        "norm_scale": {
            "input_layernorm": 1.0,
            "post_attention_layernorm": 3000.0,
            "pre_feedforward_layernorm": 40.0,
            "post_feedforward_layernorm": 12000.0,
            "q_norm": 1.5,
            "k_norm": 1.5,
            "norm": 1.6,
        },
    },
    "gemma3-mm": {
        # The gemma3 language model wrapped as Gemma3ForConditionalGeneration (model_type
        # gemma3) with a tiny SigLIP vision tower of the real one's shape: 14-pixel patches,
        # each soft token the average of 4 x 4 patches (Gemma 3: 896 / 14 = 64 patches a side,
        # 16 tokens a side). References on text-only input ids, and on prompts holding one image
        # (image_references below).
        "text_family": "gemma3",
        "seed": 302,
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_channels": 3,
            "image_size": 112,
            "patch_size": 14,
            "layer_norm_eps": 1e-6,
            "vision_use_head": False,
        },
        "mm_tokens_per_image": 4,
        # Inside the tiny vocabulary (the real ones are 255999, 256000, 262144 of 262208).
        "boi_token_index": 509,
        "eoi_token_index": 510,
        "image_token_index": 511,
        # The image prompts: bos, text, <start_of_image>, the image's tokens, <end_of_image>,
        # text; the image tokens sit past the sliding window (16) of the first text tokens.
        "image_prompt": {"n_before": 19, "n_after": 6, "n_greedy": 16, "token_seed": 4321},
        # tests/fixtures/vision/images (tools/make_vision_fixtures.py): image 0 is the prompt's,
        # image 1 the same prompt with another image (the logits must differ).
        "images": ["jpeg_rgb_120x80.jpg", "png_rgb_64x48.png"],
        # Pan-and-scan (do_pan_and_scan, crops of at least 16 pixels): wide, wider and tall.
        "pan_and_scan_images": ["webp_lossy_96x64.webp", "jpeg_progressive_300x200.jpg", "jpeg_gray_31x45.jpg"],
        # Gemma3ForConditionalGeneration (transformers 5.17) never applies
        # text_config.final_logit_softcapping: its head returns lm_head(hidden) as is. With the
        # cap set, the folder's references would contradict its own config, so this fixture sets
        # it null (as the real Gemma 3 4B config does); its logits are gemma3's before the cap.
        "text_config_overrides": {"final_logit_softcapping": None},
    },
    "cohere2": {
        # Cohere2ForCausalLM: parallel attention + MLP on one LayerNorm (no bias), interleaved
        # RoPE on sliding layers only, logits times logit_scale. Seed and final norm scale
        # picked by a float64 numpy sweep for greedy margins (one of 192 steps under 0.05).
        "seed": 405,
        "sequence_lengths": (7, 40, 100),
        "config": {
            "model_type": "cohere2",
            "vocab_size": 512,
            "hidden_size": 64,
            "intermediate_size": 160,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "hidden_act": "silu",
            "layer_norm_eps": 1e-5,
            "logit_scale": 0.25,
            "sliding_window": 16,
            "layer_types": [
                "sliding_attention",
                "sliding_attention",
                "sliding_attention",
                "full_attention",
            ],
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "max_position_embeddings": 2048,
            "tie_word_embeddings": True,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "attention_bias": False,
        },
        "std": {
            "embed": 1.0,
            "q": 0.3,
            "k": 0.3,
            "v": 0.3,
            "o": 0.2,
            "gate": 0.2,
            "up": 0.2,
            "down": 0.2,
            "norm": 0.1,
            "final_norm_scale": 4.5,
        },
    },
    "qwen3-moe": {
        # Qwen3MoeForCausalLM: Qwen3 attention (q/k norms, head_dim 32 with 4 heads) and sparse
        # MoE blocks of 8 experts, top 2, the chosen weights not renormalized (norm_topk_prob
        # false, Qwen3MoeConfig's default); layer 1 is dense (mlp_only_layers) with the
        # intermediate_size MLP. Seed picked by a float64 numpy sweep for greedy margins and
        # router gaps (moe_fixtures.py).
        "seed": 501,
        "config": {
            "model_type": "qwen3_moe",
            "vocab_size": 512,
            "hidden_size": 64,
            "intermediate_size": 96,
            "moe_intermediate_size": 16,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "norm_topk_prob": False,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [1],
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
            "max_position_embeddings": 2048,
            "tie_word_embeddings": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_act": "silu",
            "attention_bias": False,
            "use_sliding_window": False,
            "router_aux_loss_coef": 0.001,
        },
        "std": {
            "embed": 1.0,
            "lm_head": 1.0,
            "q": 0.15,
            "k": 0.15,
            "v": 0.3,
            "o": 0.3,
            "router": 0.3,
            "gate": 0.14,
            "up": 0.14,
            "down": 0.5,
            "norm": 0.1,
            "qk_norm": 0.3,
            "final_norm_scale": 1.0,
            "bias": 0.0,
        },
    },
    "qwen3-moe-128": {
        # The routing of the real Qwen3-30B-A3B (128 experts, top 8, renormalized) at tiny
        # widths: hidden 32, experts of width 8, two sparse layers.
        "seed": 516,
        "config": {
            "model_type": "qwen3_moe",
            "vocab_size": 512,
            "hidden_size": 32,
            "intermediate_size": 64,
            "moe_intermediate_size": 8,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
            "max_position_embeddings": 2048,
            "tie_word_embeddings": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_act": "silu",
            "attention_bias": False,
            "use_sliding_window": False,
            "router_aux_loss_coef": 0.001,
        },
        "std": {
            "embed": 1.0,
            "lm_head": 1.0,
            "q": 0.2,
            "k": 0.2,
            "v": 0.3,
            "o": 0.15,
            "router": 0.3,
            "gate": 0.2,
            "up": 0.2,
            "down": 0.8,
            "norm": 0.1,
            "qk_norm": 0.3,
            "final_norm_scale": 1.0,
            "bias": 0.0,
        },
    },
    "mixtral": {
        # MixtralForCausalLM: Mistral attention with a sliding window of 16 (the 33- and
        # 100-token sequences pass it) and 8 experts of intermediate_size, top 2 (a softmax
        # over the two chosen logits).
        "seed": 522,
        "config": {
            "model_type": "mixtral",
            "vocab_size": 512,
            "hidden_size": 64,
            "intermediate_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
            "max_position_embeddings": 2048,
            "sliding_window": 16,
            "tie_word_embeddings": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_act": "silu",
            "router_jitter_noise": 0.0,
            "router_aux_loss_coef": 0.001,
        },
        "std": {
            "embed": 1.0,
            "lm_head": 1.0,
            "q": 0.14,
            "k": 0.14,
            "v": 0.14,
            "o": 0.14,
            "router": 0.3,
            "gate": 0.14,
            "up": 0.14,
            "down": 0.2,
            "norm": 0.1,
            "final_norm_scale": 1.0,
            "bias": 0.0,
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
    spec = spec_of(family)
    if spec["config"]["model_type"] == "gemma3_text":
        return make_gemma3_weights(spec)
    if spec["config"]["model_type"] == "cohere2":
        return make_cohere2_weights(spec)
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
        if cfg["model_type"] in ("qwen3", "qwen3_moe"):
            w[p + "self_attn.q_norm.weight"] = round_to_bf16(1.0 + rng.standard_normal(hd) * std["qk_norm"])
            w[p + "self_attn.k_norm.weight"] = round_to_bf16(1.0 + rng.standard_normal(hd) * std["qk_norm"])
        if has_qkv_bias:
            w[p + "self_attn.q_proj.bias"] = normal((n_heads * hd,), std["bias"])
            w[p + "self_attn.k_proj.bias"] = normal((n_kv * hd,), std["bias"])
            w[p + "self_attn.v_proj.bias"] = normal((n_kv * hd,), std["bias"])
        w[p + "self_attn.o_proj.weight"] = normal((hidden, n_heads * hd), std["o"])
        w[p + "post_attention_layernorm.weight"] = norm_weight()
        if moe.is_moe_config(cfg):
            w.update(moe.draw_mlp(cfg, std, i, p, normal))
            continue
        w[p + "mlp.gate_proj.weight"] = normal((inter, hidden), std["gate"])
        w[p + "mlp.up_proj.weight"] = normal((inter, hidden), std["up"])
        w[p + "mlp.down_proj.weight"] = normal((hidden, inter), std["down"])
    w["model.norm.weight"] = norm_weight(std["final_norm_scale"])
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = normal((vocab, hidden), std["lm_head"])
    return w


def spec_of(family):
    """The spec holding the language model's config (gemma3-mm uses gemma3's)."""
    spec = FAMILIES[family]
    return FAMILIES[spec["text_family"]] if "text_family" in spec else spec


def config_of(family):
    """The language model's config for `family`: its spec's, with the family's overrides."""
    cfg = dict(spec_of(family)["config"])
    cfg.update(FAMILIES[family].get("text_config_overrides", {}))
    return cfg


def sequence_lengths_of(family):
    return tuple(spec_of(family).get("sequence_lengths", SEQUENCE_LENGTHS))


def make_gemma3_weights(spec):
    cfg, std, scale = spec["config"], spec["std"], spec["norm_scale"]
    rng = np.random.default_rng(spec["seed"])
    hidden, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    n_heads, n_kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

    def normal(shape, s):
        return round_to_bf16(rng.standard_normal(shape) * s)

    def norm_weight(kind, n):  # stored w; the layer multiplies by (1 + w)
        return round_to_bf16(scale[kind] * (1.0 + rng.standard_normal(n) * std["norm"]) - 1.0)

    w = {"model.embed_tokens.weight": normal((vocab, hidden), std["embed"])}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_weight("input_layernorm", hidden)
        w[p + "self_attn.q_proj.weight"] = normal((n_heads * hd, hidden), std["q"])
        w[p + "self_attn.k_proj.weight"] = normal((n_kv * hd, hidden), std["k"])
        w[p + "self_attn.v_proj.weight"] = normal((n_kv * hd, hidden), std["v"])
        w[p + "self_attn.o_proj.weight"] = normal((hidden, n_heads * hd), std["o"])
        w[p + "self_attn.q_norm.weight"] = norm_weight("q_norm", hd)
        w[p + "self_attn.k_norm.weight"] = norm_weight("k_norm", hd)
        w[p + "post_attention_layernorm.weight"] = norm_weight("post_attention_layernorm", hidden)
        w[p + "pre_feedforward_layernorm.weight"] = norm_weight("pre_feedforward_layernorm", hidden)
        w[p + "mlp.gate_proj.weight"] = normal((inter, hidden), std["gate"])
        w[p + "mlp.up_proj.weight"] = normal((inter, hidden), std["up"])
        w[p + "mlp.down_proj.weight"] = normal((hidden, inter), std["down"])
        w[p + "post_feedforward_layernorm.weight"] = norm_weight("post_feedforward_layernorm", hidden)
    w["model.norm.weight"] = norm_weight("norm", hidden)
    return w


def make_cohere2_weights(spec):
    cfg, std = spec["config"], spec["std"]
    rng = np.random.default_rng(spec["seed"])
    hidden, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    n_heads, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = head_dim_of(cfg)

    def normal(shape, s):
        return round_to_bf16(rng.standard_normal(shape) * s)

    def norm_weight(s=1.0):
        return round_to_bf16(s * (1.0 + rng.standard_normal(hidden) * std["norm"]))

    w = {"model.embed_tokens.weight": normal((vocab, hidden), std["embed"])}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_weight()
        w[p + "self_attn.q_proj.weight"] = normal((n_heads * hd, hidden), std["q"])
        w[p + "self_attn.k_proj.weight"] = normal((n_kv * hd, hidden), std["k"])
        w[p + "self_attn.v_proj.weight"] = normal((n_kv * hd, hidden), std["v"])
        w[p + "self_attn.o_proj.weight"] = normal((hidden, n_heads * hd), std["o"])
        w[p + "mlp.gate_proj.weight"] = normal((inter, hidden), std["gate"])
        w[p + "mlp.up_proj.weight"] = normal((inter, hidden), std["up"])
        w[p + "mlp.down_proj.weight"] = normal((hidden, inter), std["down"])
    w["model.norm.weight"] = norm_weight(std["final_norm_scale"])
    return w


def attention_f64(q, k, v, scale, window, groups=None):
    """q [T, H, D], k/v [T, KV, D]; causal, and with `window` key j is seen from row i only
    when i - j < window (the row itself and the window - 1 rows before it). `groups` [T]
    (image block ids, -1 for text): rows of one block also see each other (Gemma 3's or-mask)."""
    T, n_heads, _ = q.shape
    n_kv = k.shape[1]
    i = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= (i - j) < window
    if groups is not None:
        g = np.asarray(groups)
        allowed |= (g[:, None] == g[None, :]) & (g[:, None] >= 0)
    mask = np.where(allowed, 0.0, -np.inf)
    out = np.empty((T, n_heads, v.shape[2]))
    for hh in range(n_heads):
        kv = hh // (n_heads // n_kv)
        s = q[:, hh, :] @ k[:, kv, :].T * scale + mask
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        out[:, hh, :] = s @ v[:, kv, :]
    return out


def gemma3_inv_freq(cfg, layer_type):
    rp = cfg["rope_parameters"][layer_type]
    hd = cfg["head_dim"]
    inv = 1.0 / (rp["rope_theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    if rp["rope_type"] == "linear":
        inv = inv / rp["factor"]
    else:
        assert rp["rope_type"] == "default", rp
    return inv


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def gemma3_forward(cfg, w, tokens, probe=None, image_rows=None, groups=None, group_layers=("sliding_attention", "full_attention")):
    """logits [T, vocab] float64. `probe`, a dict, receives max |residual| (after every
    layer) and max |down_proj input|. `image_rows` {row: [hidden] vector} replaces those rows'
    scaled embeddings (an image's soft tokens); `groups` (attention_f64's) applies on the
    layer types in `group_layers`."""
    f64 = {k: v.astype(np.float64) for k, v in w.items()}
    n_heads, n_kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)

    def rms_norm(x, g):  # Gemma: x_hat * (1 + w)
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + g)

    def rope(x, inv):  # halves rotated as pairs (j, j + hd/2)
        ang = pos[:, None] * inv[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., : hd // 2], x[..., hd // 2 :]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

    def lin(x, name):
        return x @ f64[name + ".weight"].T

    inv = {t: gemma3_inv_freq(cfg, t) for t in ("sliding_attention", "full_attention")}
    scale = cfg["query_pre_attn_scalar"] ** -0.5
    max_res, max_down = 0.0, 0.0
    # embeddings times sqrt(hidden) (exact for hidden 64)
    x = f64["model.embed_tokens.weight"][tokens] * math.sqrt(cfg["hidden_size"])
    for row, vec in (image_rows or {}).items():
        x[row] = vec
    for i, layer_type in enumerate(cfg["layer_types"]):
        p = f"model.layers.{i}."
        window = cfg["sliding_window"] if layer_type == "sliding_attention" else None
        h = rms_norm(x, f64[p + "input_layernorm.weight"])
        q = lin(h, p + "self_attn.q_proj").reshape(T, n_heads, hd)
        k = lin(h, p + "self_attn.k_proj").reshape(T, n_kv, hd)
        v = lin(h, p + "self_attn.v_proj").reshape(T, n_kv, hd)
        q = rope(rms_norm(q, f64[p + "self_attn.q_norm.weight"]), inv[layer_type])
        k = rope(rms_norm(k, f64[p + "self_attn.k_norm.weight"]), inv[layer_type])
        a = attention_f64(q, k, v, scale, window, groups if layer_type in group_layers else None)
        a = lin(a.reshape(T, n_heads * hd), p + "self_attn.o_proj")
        x = x + rms_norm(a, f64[p + "post_attention_layernorm.weight"])
        h = rms_norm(x, f64[p + "pre_feedforward_layernorm.weight"])
        act = gelu_tanh(lin(h, p + "mlp.gate_proj")) * lin(h, p + "mlp.up_proj")
        max_down = max(max_down, float(np.abs(act).max()))
        m = lin(act, p + "mlp.down_proj")
        x = x + rms_norm(m, f64[p + "post_feedforward_layernorm.weight"])
        max_res = max(max_res, float(np.abs(x).max()))
    x = rms_norm(x, f64["model.norm.weight"])
    logits = x @ f64["model.embed_tokens.weight"].T
    cap = cfg.get("final_logit_softcapping")
    if cap is not None:
        logits = np.tanh(logits / cap) * cap
    if probe is not None:
        probe["max_abs_residual"] = max(probe.get("max_abs_residual", 0.0), max_res)
        probe["max_abs_down_proj_input"] = max(probe.get("max_abs_down_proj_input", 0.0), max_down)
    return logits


def cohere2_inv_freq(cfg):
    rp = cfg["rope_parameters"]
    assert rp["rope_type"] == "default", rp
    hd = head_dim_of(cfg)
    return 1.0 / (rp["rope_theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd))


def cohere2_forward(cfg, w, tokens, probe=None):
    """logits [T, vocab] float64 of Cohere2: x + attn(ln(x)) + mlp(ln(x)) per layer."""
    f64 = {k: v.astype(np.float64) for k, v in w.items()}
    n_heads, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = head_dim_of(cfg)
    eps = cfg["layer_norm_eps"]
    T = len(tokens)
    ang = np.arange(T, dtype=np.float64)[:, None] * cohere2_inv_freq(cfg)[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def layer_norm(x, g):  # mean removed, no bias
        c = x - x.mean(axis=-1, keepdims=True)
        return c / np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + eps) * g

    def rope_interleaved(x):  # pairs (2j, 2j + 1) rotated by frequency j
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = b * cos + a * sin
        return out

    def lin(x, name):
        return x @ f64[name + ".weight"].T

    max_res, max_down = 0.0, 0.0
    x = f64["model.embed_tokens.weight"][tokens]
    for i, layer_type in enumerate(cfg["layer_types"]):
        p = f"model.layers.{i}."
        sliding = layer_type == "sliding_attention"
        h = layer_norm(x, f64[p + "input_layernorm.weight"])
        q = lin(h, p + "self_attn.q_proj").reshape(T, n_heads, hd)
        k = lin(h, p + "self_attn.k_proj").reshape(T, n_kv, hd)
        v = lin(h, p + "self_attn.v_proj").reshape(T, n_kv, hd)
        if sliding:  # full layers have no position encoding
            q, k = rope_interleaved(q), rope_interleaved(k)
        a = attention_f64(q, k, v, hd**-0.5, cfg["sliding_window"] if sliding else None)
        a = lin(a.reshape(T, n_heads * hd), p + "self_attn.o_proj")
        g = lin(h, p + "mlp.gate_proj")
        act = g / (1.0 + np.exp(-g)) * lin(h, p + "mlp.up_proj")
        max_down = max(max_down, float(np.abs(act).max()))
        x = x + a + lin(act, p + "mlp.down_proj")
        max_res = max(max_res, float(np.abs(x).max()))
    x = layer_norm(x, f64["model.norm.weight"])
    if probe is not None:
        probe["max_abs_residual"] = max(probe.get("max_abs_residual", 0.0), max_res)
        probe["max_abs_down_proj_input"] = max(probe.get("max_abs_down_proj_input", 0.0), max_down)
    return (x @ f64["model.embed_tokens.weight"].T) * cfg["logit_scale"]


def make_token_sequences(vocab, lengths=SEQUENCE_LENGTHS):
    rng = np.random.default_rng(TOKEN_SEED)
    return [rng.integers(MIN_TOKEN_ID, vocab, size=n).astype(np.int32) for n in lengths]


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


def numpy_forward(cfg, w, tokens, probe=None):
    """logits [T, vocab] float64 of a full causal forward over `tokens`."""
    if cfg["model_type"] == "gemma3_text":
        return gemma3_forward(cfg, w, tokens, probe)
    if cfg["model_type"] == "cohere2":
        return cohere2_forward(cfg, w, tokens, probe)
    return llama_forward(cfg, w, tokens, probe)


def llama_forward(cfg, w, tokens, probe=None, kv_f16=False):
    """logits [T, vocab] float64 of a llama / qwen2 / qwen3 / mistral / qwen3_moe / mixtral
    causal forward over `tokens`. `probe` receives the MoE routing (moe_fixtures.moe_f64);
    `kv_f16` rounds K and V to float16 as the engine stores them (a diagnostic)."""
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
    window = cfg.get("sliding_window") or 0
    if window:  # query i sees key j when i - window < j <= i
        mask = mask + np.tril(np.full((T, T), -np.inf), k=-window)
    x = f64["model.embed_tokens.weight"][tokens]  # [T, hidden]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, f64[p + "input_layernorm.weight"])
        q = linear(h, p + "self_attn.q_proj").reshape(T, n_heads, hd)
        k = linear(h, p + "self_attn.k_proj").reshape(T, n_kv, hd)
        if p + "self_attn.q_norm.weight" in f64:  # qwen3: per-head RMSNorm before RoPE
            q = rms_norm(q, f64[p + "self_attn.q_norm.weight"])
            k = rms_norm(k, f64[p + "self_attn.k_norm.weight"])
        q, k = rope(q), rope(k)
        v = linear(h, p + "self_attn.v_proj").reshape(T, n_kv, hd)
        if kv_f16:
            k, v = k.astype(np.float16).astype(np.float64), v.astype(np.float16).astype(np.float64)
        out = np.empty((T, n_heads, hd))
        for hh in range(n_heads):
            kv = hh // (n_heads // n_kv)
            s = q[:, hh, :] @ k[:, kv, :].T / math.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            out[:, hh, :] = s @ v[:, kv, :]
        x = x + linear(out.reshape(T, n_heads * hd), p + "self_attn.o_proj")
        h = rms_norm(x, f64[p + "post_attention_layernorm.weight"])
        if moe.is_moe_config(cfg):
            x = x + moe.mlp_f64(cfg, f64, i, p, h, probe)
            continue
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


FLOAT16_MAX = 65504.0


def needs_fp16_overflow(family):
    return spec_of(family)["config"]["model_type"] == "gemma3_text"


def check_activation_maxima(family, probe):
    """The gemma3 fixtures exist to catch float16 overflow: both maxima must pass 65504."""
    if not needs_fp16_overflow(family):
        return
    for key in ("max_abs_residual", "max_abs_down_proj_input"):
        if not probe.get(key, 0.0) > FLOAT16_MAX:
            raise RuntimeError(f"{family}: {key} = {probe.get(key)} does not exceed {FLOAT16_MAX}")


def numpy_only(families):
    for family in families:
        cfg = config_of(family)
        w = make_weights(family)
        seqs = make_token_sequences(cfg["vocab_size"], sequence_lengths_of(family))
        margins, probe = [], {}
        for s in seqs:
            logits = numpy_forward(cfg, w, s, probe)
            assert np.isfinite(logits).all()
            margins.append(top2_margins(logits))
            print(f"{family} T={len(s)} logit std {logits.std():.3f} max|.| {np.abs(logits).max():.2f}")
        print(family, "logit margins", json.dumps(stats(np.concatenate(margins))))
        if probe and not moe.is_moe_config(cfg):
            print(family, "activation maxima", json.dumps(probe))
            check_activation_maxima(family, probe)
        g_margins, g_tokens = [], []
        for s in seqs:
            toks, m = numpy_greedy(cfg, w, s, N_GREEDY)
            g_margins.append(m)
            g_tokens.append(toks)
        print(family, "greedy margins", json.dumps(stats(np.concatenate(g_margins))))
        for t in g_tokens:
            print(family, "greedy distinct tokens", len(set(t.tolist())), t[:16].tolist())
        if moe.is_moe_config(cfg):
            routed = seqs + [np.concatenate([s, t]) for s, t in zip(seqs, g_tokens)]
            print(family, "routing", json.dumps(routing_report(cfg, w, routed)))
        if cfg["model_type"] == "gemma3_text":
            for t in ("sliding_attention", "full_attention"):
                print(family, t, "inv_freq[:4]", gemma3_inv_freq(cfg, t)[:4].tolist())
        elif cfg["model_type"] == "cohere2":
            print(family, "inv_freq", cohere2_inv_freq(cfg).tolist())
        else:
            print(family, "inv_freq", rope_inv_freq(cfg).tolist())


def routing_report(cfg, w, sequences):
    """How near the MoE routing of `sequences` (the references' prompts and their greedy
    continuations, as the tests feed them) comes to a tie: the relative router gaps of the
    reference forward (float64; moe_fixtures.route_f64), and, against the same forward with K
    and V rounded to float16 as the engine stores them, how many (token, layer) choices change
    and the smallest ratio of a choice's gap to how much the rounding moves it (below 1 it
    flips). A fixture wants no change and a ratio well above 1: a choice the engine makes
    otherwise than the reference moves that token's logits far past any tolerance."""
    exact, rounded = {}, {}
    for s in sequences:
        llama_forward(cfg, w, s, exact)
        llama_forward(cfg, w, s, rounded, kv_f16=True)
    changed = sum(
        int(np.any(a != b, axis=-1).sum()) for a, b in zip(exact["router_choices"], rounded["router_choices"])
    )
    moved = max(float(np.abs(a - b).max()) for a, b in zip(exact["router_logits"], rounded["router_logits"]))
    # Each choice's gap (k-th minus (k+1)-th logit, over the row's std) against how much the
    # float16 rows move that same difference: below 1 the choice flips.
    k = cfg["num_experts_per_tok"]
    safety = np.inf
    for a, b in zip(exact["router_logits"], rounded["router_logits"]):
        if k >= a.shape[1]:
            continue
        order = np.argsort(-a, axis=-1, kind="stable")[:, k - 1 : k + 1]
        gap_a = np.diff(-np.take_along_axis(a, order, axis=-1), axis=-1)[:, 0]
        gap_b = np.diff(-np.take_along_axis(b, order, axis=-1), axis=-1)[:, 0]
        safety = min(safety, float(np.min(gap_a / np.maximum(np.abs(gap_a - gap_b), 1e-12))))
    return {
        "router_gaps": moe.router_stats(exact),
        "choices_changed_by_f16_kv": changed,
        "max_relative_router_logit_change_by_f16_kv": moved,
        "min_gap_over_its_f16_kv_change": safety,
    }


# ----------------------------------------------------------------------------------------
# transformers side

# The config and model classes of the families write_family handles, by model_type.
CAUSAL_LM_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
}


def write_family(family, out_root, torch, transformers, device):
    from safetensors.torch import save_file

    spec = FAMILIES[family]
    cfg = spec["config"]
    folder = os.path.join(out_root, family)
    os.makedirs(folder, exist_ok=True)

    cfg_kwargs = {k: v for k, v in cfg.items() if k != "model_type"}
    cfg_kwargs["rope_parameters"] = dict(cfg["rope_parameters"])
    classes = CAUSAL_LM_CLASSES[cfg["model_type"]]
    config = getattr(transformers, classes[0])(**cfg_kwargs)
    model_cls = getattr(transformers, classes[1])
    is_moe = moe.is_moe_config(cfg)
    if is_moe:
        config._experts_implementation = "eager"

    weights = make_weights(family)  # checkpoint names
    torch.manual_seed(spec["seed"])
    writer = model_cls(config).to(torch.float32)
    sd = writer.state_dict()
    expected = set(sd.keys())
    if cfg["tie_word_embeddings"]:
        expected.discard("lm_head.weight")
    # The model's own names: transformers 5 holds a sparse layer's experts fused.
    model_weights = moe.model_state(cfg, weights, expected) if is_moe else weights
    if expected != set(model_weights.keys()):
        raise RuntimeError(
            f"{family}: parameter names differ: model-only {sorted(expected - set(model_weights))}, "
            f"numpy-only {sorted(set(model_weights) - expected)}"
        )
    with torch.no_grad():
        for name, value in model_weights.items():
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

    written_names = safetensors_names(os.path.join(folder, "model.safetensors"))

    # Everything below uses only the folder.
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager"
        )
    except TypeError:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, torch_dtype=torch.float32, attn_implementation="eager"
        )
    experts_implementation = None
    if is_moe:  # the reference loops over the experts (no grouped GEMM)
        model.config._experts_implementation = "eager"
        experts_implementation = model.config._experts_implementation
    model = model.to(device).eval()
    loaded_sd = model.state_dict()
    for name, value in model_weights.items():
        got = loaded_sd[name].detach().float().cpu().numpy()
        if not np.array_equal(got, value):
            raise RuntimeError(f"{family}: reloaded {name} differs from the bf16 weights written")
    vocab = cfg["vocab_size"]
    seqs = make_token_sequences(vocab)
    tensors = {}
    all_margins, greedy_all, numpy_diffs, generate_agreement = [], [], [], []
    numpy_greedy_agree, greedy_sequences = [], []

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
            greedy_sequences.append(np.concatenate([s, g_tokens]))
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
        "reference": "transformers",
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
    if is_moe:
        report["experts_implementation"] = experts_implementation
        report["tensor_name_patterns_written"] = name_patterns(written_names)
        report["routing"] = routing_report(cfg, weights, seqs + greedy_sequences)
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"{family}: logit margins {json.dumps(logit_stats)}")
    print(f"{family}: greedy margins {json.dumps(greedy_stats)}")
    if inv_loaded is not None:
        print(f"{family}: inv_freq max rel diff {np.max(np.abs(inv_loaded / inv_expected - 1)):.2e}")
    print(f"{family}: files {sorted(os.listdir(folder))}")
    print(f"{family}: config.json {json.dumps(written_config, sort_keys=True)}")
    if is_moe:
        print(f"{family}: routing {json.dumps(report['routing'])}")
        print(f"{family}: tensor name patterns {json.dumps(report['tensor_name_patterns_written'])}")
        # After the files are written, for inspection: a routing read otherwise than the numpy
        # forward reads it shows as a whole expert's difference in some row.
        if not max(numpy_diffs) < 1e-2:
            raise RuntimeError(f"{family}: numpy float64 forward differs from transformers by {max(numpy_diffs)}")


# ----------------------------------------------------------------------------------------
# transformers side: gemma3, gemma3-mm, cohere2


def safetensors_names(path):
    """Tensor names in a safetensors file, read from its header."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return sorted(k for k in header if k != "__metadata__")


def name_patterns(names):
    """Names with layer indices replaced by N, deduplicated."""
    return sorted({re.sub(r"\.\d+\.", ".N.", n) for n in names})


def build_model_config(family, transformers):
    """(config, model class) for gemma3 / gemma3-mm / cohere2 from the FAMILIES entry."""
    spec = FAMILIES[family]
    cfg = config_of(family)
    kwargs = json.loads(json.dumps({k: v for k, v in cfg.items() if k != "model_type"}))
    if cfg["model_type"] == "cohere2":
        return transformers.Cohere2Config(**kwargs), transformers.Cohere2ForCausalLM, kwargs
    text_config = transformers.Gemma3TextConfig(**kwargs)
    if family == "gemma3":
        return text_config, transformers.Gemma3ForCausalLM, kwargs
    vision = {k: v for k, v in spec["vision_config"].items() if k != "model_type"}
    mm_kwargs = {"vision_config": vision, "mm_tokens_per_image": spec["mm_tokens_per_image"]}
    for key in ("boi_token_index", "eoi_token_index", "image_token_index"):
        mm_kwargs[key] = spec[key]
    config = transformers.Gemma3Config(text_config=text_config, **mm_kwargs)
    return config, transformers.Gemma3ForConditionalGeneration, {"text_config": kwargs, **mm_kwargs}


def language_model_prefix(module_names):
    """Where the decoder of a Gemma3ForConditionalGeneration lives in its state dict."""
    for prefix in ("model.language_model.", "language_model.model."):
        if prefix + "embed_tokens.weight" in module_names:
            return prefix
    raise RuntimeError(f"no language model embed_tokens among {sorted(module_names)[:20]}...")


def write_family_hybrid(family, out_root, torch, transformers, device):
    from safetensors.torch import load_file, save_file

    spec = FAMILIES[family]
    text_spec = spec_of(family)
    cfg = config_of(family)
    lengths = sequence_lengths_of(family)
    folder = os.path.join(out_root, family)
    os.makedirs(folder, exist_ok=True)

    config, model_cls, config_arguments = build_model_config(family, transformers)
    weights = make_weights(family)  # decoder names as in the causal LM: model.layers.N...
    torch.manual_seed(spec["seed"])
    writer = model_cls(config).to(torch.float32)
    sd = writer.state_dict()
    if family == "gemma3-mm":
        prefix = language_model_prefix(set(sd))
        to_module = {n: prefix + n[len("model.") :] for n in weights}
    else:
        to_module = {n: n for n in weights}
    missing = [m for m in to_module.values() if m not in sd]
    if missing:
        raise RuntimeError(f"{family}: model has no parameters {missing}")
    embed_name = to_module["model.embed_tokens.weight"]
    extra = sorted(set(sd) - set(to_module.values()) - {"lm_head.weight"})
    if extra and family != "gemma3-mm":
        raise RuntimeError(f"{family}: parameters without numpy weights: {extra}")
    rng = np.random.default_rng(spec["seed"] + 1000)
    extra_values = {}
    for name in extra:  # vision tower and projector: seeded draws, they never reach the text logits
        shape = tuple(sd[name].shape)
        if len(shape) >= 2:
            value = rng.standard_normal(shape) * 0.05
        elif name.endswith("bias"):
            value = rng.standard_normal(shape) * 0.05
        elif "soft_emb_norm" in name:
            value = rng.standard_normal(shape) * 0.1  # Gemma RMSNorm: 1 + w
        else:
            value = 1.0 + rng.standard_normal(shape) * 0.1
        extra_values[name] = round_to_bf16(value)
    with torch.no_grad():
        for name, value in list(weights.items()) + list(extra_values.items()):
            target = to_module.get(name, name)
            if tuple(sd[target].shape) != value.shape:
                raise RuntimeError(f"{family}: {target} shape {tuple(sd[target].shape)} vs {value.shape}")
            sd[target].copy_(torch.from_numpy(value))
        lm_head_tied = "lm_head.weight" not in sd or (
            sd["lm_head.weight"].data_ptr() == sd[embed_name].data_ptr()
        )
        if not lm_head_tied:  # the fixture's head is the embedding either way
            print(f"{family}: WARNING lm_head is a separate tensor; writing the embedding into it")
            sd["lm_head.weight"].copy_(sd[embed_name])
    writer = writer.to(torch.bfloat16)
    writer.save_pretrained(folder)
    if not os.path.exists(os.path.join(folder, "generation_config.json")):
        writer.generation_config.save_pretrained(folder)
    del writer, sd
    st_path = os.path.join(folder, "model.safetensors")
    if not os.path.exists(st_path):
        raise RuntimeError(f"{family}: save_pretrained wrote {sorted(os.listdir(folder))}")
    written_names = safetensors_names(st_path)

    # Everything below uses only the folder.
    try:
        model = model_cls.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    except TypeError:
        model = model_cls.from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="eager")
    model = model.to(device).eval()
    loaded_sd = model.state_dict()
    for name, value in weights.items():
        got = loaded_sd[to_module[name]].detach().float().cpu().numpy()
        if not np.array_equal(got, value):
            raise RuntimeError(f"{family}: reloaded {to_module[name]} differs from the bf16 weights written")
    head = model.get_output_embeddings().weight.detach().float().cpu().numpy()
    if not np.array_equal(head, weights["model.embed_tokens.weight"]):
        raise RuntimeError(f"{family}: reloaded lm_head differs from the embedding")

    # float16-range probes: every decoder layer's output (the residual stream) and every
    # down_proj's input (the gated MLP product), language model only.
    probe = {"max_abs_residual": 0.0, "max_abs_down_proj_input": 0.0}
    probing = [False]

    def on_layer(_module, _inputs, output):
        if probing[0]:
            t = output[0] if isinstance(output, (tuple, list)) else output
            probe["max_abs_residual"] = max(probe["max_abs_residual"], float(t.detach().abs().max()))

    def on_down(_module, inputs):
        if probing[0]:
            probe["max_abs_down_proj_input"] = max(
                probe["max_abs_down_proj_input"], float(inputs[0].detach().abs().max())
            )

    hooked = {"layers": 0, "down_proj": 0}
    for name, module in model.named_modules():
        if "vision" in name:
            continue
        if re.search(r"(^|\.)layers\.\d+$", name):
            module.register_forward_hook(on_layer)
            hooked["layers"] += 1
        elif name.endswith("mlp.down_proj"):
            module.register_forward_pre_hook(on_down)
            hooked["down_proj"] += 1
    if hooked["layers"] != cfg["num_hidden_layers"] or hooked["down_proj"] != cfg["num_hidden_layers"]:
        raise RuntimeError(f"{family}: hooked {hooked}, expected {cfg['num_hidden_layers']} of each")

    def forward(ids):
        return model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[0].float()

    seqs = make_token_sequences(cfg["vocab_size"], lengths)
    tensors = {}
    all_margins, greedy_all, numpy_diffs, generate_agreement, numpy_greedy_agree = [], [], [], [], []
    numpy_probe = {}
    with torch.no_grad():
        for i, s in enumerate(seqs):
            ids = torch.from_numpy(s.astype(np.int64))[None].to(device)
            probing[0] = True
            logits_np = forward(ids).cpu().numpy()  # [T, vocab]
            probing[0] = False
            if not np.isfinite(logits_np).all():
                raise RuntimeError(f"{family}: non-finite logits for sequence {i}")
            tensors[f"tokens_{i}"] = torch.from_numpy(s.copy()).contiguous()
            tensors[f"logits_{i}"] = torch.from_numpy(logits_np.copy()).contiguous()
            all_margins.append(top2_margins(logits_np))
            ref64 = numpy_forward(cfg, weights, s, numpy_probe)
            numpy_diffs.append(float(np.abs(ref64 - logits_np).max()))

            seq = ids.clone()
            g_tokens, g_margins = [], []
            for _ in range(N_GREEDY):
                last = forward(seq)[-1]
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

            try:  # the cached generate() path, informative only
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
            except Exception as e:
                generate_agreement.append({"error": repr(e)[:300]})
            print(
                f"{family} seq {i} T={len(s)}: logits max|diff| vs numpy f64 {numpy_diffs[-1]:.3e}, "
                f"greedy margin median {np.median(g_margins):.3f} min {g_margins.min():.4f}, "
                f"numpy greedy equal {numpy_greedy_agree[-1]}, "
                f"generate agreement {generate_agreement[-1]}"
            )

    image_report = None
    if family == "gemma3-mm":
        image_report = image_references(model, cfg, weights, folder, tensors, torch, transformers, device)
    save_file(tensors, os.path.join(folder, "reference.safetensors"))

    # RoPE frequencies as the loaded model holds them, against the numpy ones.
    rope_loaded, rope_rel_diff = {}, {}
    for name, buf in model.named_buffers():
        if "inv_freq" not in name or "original" in name or "vision" in name:
            continue
        got = buf.detach().double().cpu().numpy()
        if cfg["model_type"] == "cohere2":
            expected = cohere2_inv_freq(cfg)
        elif "sliding" in name or "local" in name:
            expected = gemma3_inv_freq(cfg, "sliding_attention")
        else:
            expected = gemma3_inv_freq(cfg, "full_attention")
        rope_loaded[name] = got.tolist()
        rope_rel_diff[name] = float(np.max(np.abs(got / expected - 1))) if got.shape == expected.shape else None

    same_as_text = None
    if family == "gemma3-mm" and not os.path.exists(os.path.join(out_root, "gemma3", "reference.safetensors")):
        raise RuntimeError("gemma3-mm is compared with gemma3's references: write gemma3 first (same --out)")
    if family == "gemma3-mm":
        text_ref = os.path.join(out_root, "gemma3", "reference.safetensors")
        if os.path.exists(text_ref):
            ref = load_file(text_ref)
            cap = config_of("gemma3")["final_logit_softcapping"]

            def capped(x):  # gemma3's softcap applied to this fixture's uncapped logits
                x = x.astype(np.float64)
                return x if cap is None else np.tanh(x / cap) * cap

            same_as_text = {
                "gemma3_final_logit_softcapping": cap,
                "logits_max_abs_diff_after_cap": [
                    float(np.abs(ref[f"logits_{i}"].numpy() - capped(tensors[f"logits_{i}"].numpy())).max())
                    for i in range(len(seqs))
                ],
                "greedy_tokens_equal": [
                    bool(np.array_equal(ref[f"greedy_tokens_{i}"].numpy(), tensors[f"greedy_tokens_{i}"].numpy()))
                    for i in range(len(seqs))
                ],
            }

    logit_stats = stats(np.concatenate(all_margins))
    greedy_stats = stats(np.concatenate(greedy_all))
    with open(os.path.join(folder, "config.json")) as f:
        written_config = json.load(f)
    report = {
        "family": family,
        "model_class": model_cls.__name__,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "compute": "float32, eager attention, TF32 off, reloaded with from_pretrained(folder); "
        "forward(input_ids, attention_mask=ones, use_cache=False)",
        "config_arguments": config_arguments,
        "config_json_written": written_config,
        "tensor_names_written": written_names,
        "tensor_name_patterns_written": name_patterns(written_names),
        "lm_head_tied_in_writer": lm_head_tied,
        "weight_seed": text_spec["seed"],
        "weight_std": text_spec["std"],
        "norm_scale": text_spec.get("norm_scale"),
        "weight_init": "numpy default_rng(weight_seed) standard_normal * std, rounded to bf16; "
        "gemma3 norm weights w = norm_scale * (1 + std_norm * N(0,1)) - 1 (the layer scales by 1 + w); "
        "cohere2 LayerNorm weights 1 + std_norm * N(0,1), the final one times final_norm_scale",
        "token_seed": TOKEN_SEED,
        "token_range": [MIN_TOKEN_ID, cfg["vocab_size"]],
        "sequence_lengths": list(lengths),
        "greedy": f"{N_GREEDY} tokens by a loop of full forwards (no cache), eos ignored; "
        "greedy_prompt_<i> equals tokens_<i>",
        "logit_margin_stats": logit_stats,
        "greedy_margin_stats": greedy_stats,
        "numpy_float64_max_abs_logit_diff": numpy_diffs,
        "numpy_float64_greedy_tokens_equal": numpy_greedy_agree,
        "generate_agreement": generate_agreement,
        "max_abs_residual": probe["max_abs_residual"],
        "max_abs_down_proj_input": probe["max_abs_down_proj_input"],
        "numpy_max_abs_residual": numpy_probe.get("max_abs_residual"),
        "numpy_max_abs_down_proj_input": numpy_probe.get("max_abs_down_proj_input"),
        "rope_inv_freq_loaded": rope_loaded,
        "rope_inv_freq_max_rel_diff": rope_rel_diff,
        "same_as_gemma3": same_as_text,
        "image_references": image_report,
    }
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"{family}: logit margins {json.dumps(logit_stats)}")
    print(f"{family}: greedy margins {json.dumps(greedy_stats)}")
    print(f"{family}: activation maxima transformers {json.dumps(probe)} numpy {json.dumps(numpy_probe)}")
    print(f"{family}: rope inv_freq max rel diff {json.dumps(rope_rel_diff)}")
    if same_as_text is not None:
        print(f"{family}: against gemma3 {json.dumps(same_as_text)}")
    print(f"{family}: tensor name patterns {json.dumps(name_patterns(written_names))}")
    print(f"{family}: files {sorted(os.listdir(folder))}")
    print(f"{family}: config.json {json.dumps(written_config, sort_keys=True)}")

    # Checks that make the run fail (after the files are written, for inspection).
    problems = []
    if needs_fp16_overflow(family):
        for key in ("max_abs_residual", "max_abs_down_proj_input"):
            if not probe[key] > FLOAT16_MAX:
                problems.append(f"{key} {probe[key]} does not exceed {FLOAT16_MAX}")
    worst = max(numpy_diffs)
    if not worst < 1e-2:
        problems.append(f"numpy float64 forward differs from transformers by {worst} (config read differently?)")
    if not rope_rel_diff:
        problems.append("no inv_freq buffer found in the loaded model")
    for name, d in rope_rel_diff.items():
        if d is None or not d < 1e-6:
            problems.append(f"rope {name} differs from the numpy frequencies (rel {d})")
    if same_as_text is not None:
        if not all(same_as_text["greedy_tokens_equal"]):
            problems.append("gemma3-mm greedy tokens differ from gemma3's")
        if not max(same_as_text["logits_max_abs_diff_after_cap"]) < 1e-3:
            problems.append(f"gemma3-mm logits, capped, differ from gemma3's: {same_as_text}")
    if image_report is not None:
        problems += image_report["problems"]
    if problems:
        raise RuntimeError(f"{family}: " + "; ".join(problems))


# ----------------------------------------------------------------------------------------
# gemma3-mm: prompts with an image


def siglip_projector_f64(spec, text_hidden, sd, pv):
    """Gemma 3's image encoder in float64 from its definition (SigLIP's vision transformer,
    then Gemma3MultiModalProjector): pv [3, S, S] -> (last hidden state [n, h], soft tokens
    [mm_tokens, text_hidden]). `sd`: name -> float64 array of the loaded model's state dict."""
    vc = spec["vision_config"]
    h, p, S, heads = vc["hidden_size"], vc["patch_size"], vc["image_size"], vc["num_attention_heads"]
    eps, g = vc["layer_norm_eps"], S // p
    T = next(n[: -len("embeddings.patch_embedding.weight")] for n in sd if n.endswith("embeddings.patch_embedding.weight"))
    P = next(n[: -len("mm_input_projection_weight")] for n in sd if n.endswith("mm_input_projection_weight"))

    def ln(x, name):
        m = x.mean(-1, keepdims=True)
        var = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / np.sqrt(var + eps) * sd[name + ".weight"] + sd[name + ".bias"]

    def lin(x, name):
        return x @ sd[name + ".weight"].T + sd[name + ".bias"]

    patches = pv.astype(np.float64).reshape(3, g, p, g, p).transpose(1, 3, 0, 2, 4).reshape(g * g, 3 * p * p)
    x = patches @ sd[T + "embeddings.patch_embedding.weight"].reshape(h, -1).T + sd[T + "embeddings.patch_embedding.bias"]
    x = x + sd[T + "embeddings.position_embedding.weight"]
    hd = h // heads
    for l in range(vc["num_hidden_layers"]):
        pre = f"{T}encoder.layers.{l}."
        a = ln(x, pre + "layer_norm1")
        q = lin(a, pre + "self_attn.q_proj").reshape(-1, heads, hd)
        k = lin(a, pre + "self_attn.k_proj").reshape(-1, heads, hd)
        v = lin(a, pre + "self_attn.v_proj").reshape(-1, heads, hd)
        out = np.empty_like(q)
        for hh in range(heads):
            sc = q[:, hh] @ k[:, hh].T / math.sqrt(hd)
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            out[:, hh] = (sc / sc.sum(-1, keepdims=True)) @ v[:, hh]
        x = x + lin(out.reshape(-1, h), pre + "self_attn.out_proj")
        x = x + lin(gelu_tanh(lin(ln(x, pre + "layer_norm2"), pre + "mlp.fc1")), pre + "mlp.fc2")
    last = ln(x, T + "post_layernorm")
    side = int(round(math.sqrt(spec["mm_tokens_per_image"])))
    k = g // side
    pooled = last.reshape(side, k, side, k, h).mean(axis=(1, 3)).reshape(side * side, h)
    normed = pooled / np.sqrt((pooled * pooled).mean(-1, keepdims=True) + eps) * (1.0 + sd[P + "mm_soft_emb_norm.weight"])
    tokens = normed @ sd[P + "mm_input_projection_weight"]
    assert tokens.shape == (side * side, text_hidden)
    return last, tokens


def image_prompt(spec, vocab):
    """bos, n_before text ids, <start_of_image>, the image tokens, <end_of_image>, n_after text
    ids (text ids drawn from [MIN_TOKEN_ID, boi) by a seeded numpy generator)."""
    ip = spec["image_prompt"]
    rng = np.random.default_rng(ip["token_seed"])
    lo, hi = MIN_TOKEN_ID, min(spec["boi_token_index"], spec["eoi_token_index"], spec["image_token_index"])
    before = rng.integers(lo, hi, size=ip["n_before"])
    after = rng.integers(lo, hi, size=ip["n_after"])
    image = [spec["boi_token_index"]] + [spec["image_token_index"]] * spec["mm_tokens_per_image"] + [spec["eoi_token_index"]]
    return np.array([1] + list(before) + image + list(after), dtype=np.int32)


def image_references(model, cfg, weights, folder, tensors, torch, transformers, device):
    """Adds to `tensors`, for each image i of FAMILIES["gemma3-mm"]["images"]:
      image_pixel_values_<i>  float32 [3, S, S]      Gemma3ImageProcessor (the PIL one) of the file
      image_patches_<i>       float32 [n, h]         the vision tower's last hidden state
      image_features_<i>      float32 [T_img, hidden] the projector's soft tokens
      image_logits_<i>        float32 [T, vocab]     Gemma3ForConditionalGeneration on image_tokens
                                                     with pixel_values and token_type_ids
    and image_tokens int32 [T] (the prompt), image_greedy_tokens_0 int32 [n_greedy] and
    image_greedy_margins_0 (a loop of full forwards with image 0). Writes the processor's
    preprocessor_config.json into `folder`. Returns the report (with "problems")."""
    spec = FAMILIES["gemma3-mm"]
    here = os.path.dirname(os.path.abspath(__file__))
    images_dir = os.path.join(here, "..", "tests", "fixtures", "vision", "images")
    from PIL import Image

    S = spec["vision_config"]["image_size"]
    processor = transformers.Gemma3ImageProcessor(size={"height": S, "width": S})
    processor.save_pretrained(folder)
    sd = {n: t.detach().double().cpu().numpy() for n, t in model.state_dict().items()}
    inner = getattr(model, "model", model)
    tower = getattr(inner, "vision_tower", None) or model.vision_tower
    projector = getattr(inner, "multi_modal_projector", None) or model.multi_modal_projector
    prompt = image_prompt(spec, cfg["vocab_size"])
    tensors["image_tokens"] = torch.from_numpy(prompt.copy())
    image_id = spec["image_token_index"]
    rows = np.nonzero(prompt == image_id)[0]
    groups = np.where(prompt == image_id, 0, -1)
    report = {"prompt": prompt.tolist(), "images": spec["images"], "problems": []}

    def forward(ids_np, pv):
        ids = torch.from_numpy(ids_np.astype(np.int64))[None].to(device)
        tt = (ids == image_id).long()
        common = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pv, "use_cache": False}
        try:
            out = model(**common, token_type_ids=tt)
        except TypeError:  # a transformers that names them mm_token_type_ids
            out = model(**common, mm_token_type_ids=tt)
        return out.logits[0].float()

    with torch.no_grad():
        for i, name in enumerate(spec["images"]):
            with Image.open(os.path.join(images_dir, name)) as im:
                pv_np = processor(images=im, return_tensors="np")["pixel_values"].astype(np.float32)
            pv = torch.from_numpy(pv_np).to(device)
            patches = tower(pixel_values=pv).last_hidden_state
            features = projector(patches)
            logits = forward(prompt, pv)
            tensors[f"image_pixel_values_{i}"] = torch.from_numpy(pv_np[0].copy())
            tensors[f"image_patches_{i}"] = patches[0].float().cpu().contiguous()
            tensors[f"image_features_{i}"] = features[0].float().cpu().contiguous()
            tensors[f"image_logits_{i}"] = logits.cpu().contiguous()
            # The independent float64 forward: the encoder from its definition, then the text
            # model with the soft tokens in place, under each reading of the image mask.
            last64, feat64 = siglip_projector_f64(spec, cfg["hidden_size"], sd, pv_np[0])
            image_rows = {int(r): feat64[j] for j, r in enumerate(rows)}
            entry = {
                "numpy_f64_max_abs_patches_diff": float(np.abs(last64 - patches[0].double().cpu().numpy()).max()),
                "numpy_f64_max_abs_features_diff": float(np.abs(feat64 - features[0].double().cpu().numpy()).max()),
            }
            for label, layers in (("all_layers", ("sliding_attention", "full_attention")),
                                  ("sliding_layers_only", ("sliding_attention",)), ("causal_only", ())):
                ref64 = gemma3_forward(cfg, weights, prompt, image_rows=image_rows, groups=groups, group_layers=layers)
                entry[f"numpy_f64_logits_diff_image_mask_{label}"] = float(np.abs(ref64 - logits.cpu().numpy()).max())
            no_tt = model(input_ids=torch.from_numpy(prompt.astype(np.int64))[None].to(device), pixel_values=pv,
                          use_cache=False).logits[0].float()
            entry["logits_diff_without_token_type_ids"] = float((no_tt - logits).abs().max())
            report[f"image_{i}"] = entry
            print(f"gemma3-mm image {i} ({name}): {json.dumps(entry)}")
        d01 = float((tensors["image_logits_0"] - tensors["image_logits_1"]).abs().max())
        report["logits_diff_between_images"] = d01
        pv0 = tensors["image_pixel_values_0"][None].to(device)
        seq = torch.from_numpy(prompt.astype(np.int64))[None].to(device)
        g_tokens, g_margins = [], []
        for _ in range(spec["image_prompt"]["n_greedy"]):
            last = forward(seq[0].cpu().numpy(), pv0)[-1]
            top = torch.topk(last, 2)
            g_tokens.append(int(top.indices[0]))
            g_margins.append(float(top.values[0] - top.values[1]))
            seq = torch.cat([seq, top.indices[:1][None]], dim=1)
        tensors["image_greedy_tokens_0"] = torch.tensor(g_tokens, dtype=torch.int32)
        tensors["image_greedy_margins_0"] = torch.tensor(g_margins, dtype=torch.float32)
        report["greedy_margin_min"] = min(g_margins)
        pan_and_scan_references(spec, prompt, processor_size=S, images_dir=images_dir, tensors=tensors,
                                forward=forward, torch=torch, transformers=transformers, device=device, report=report)
    e0 = report["image_0"]
    if not e0["numpy_f64_max_abs_features_diff"] < 1e-3:
        report["problems"].append(f"numpy float64 image features differ from transformers: {e0}")
    best = min(("all_layers", "sliding_layers_only", "causal_only"),
               key=lambda k: e0[f"numpy_f64_logits_diff_image_mask_{k}"])
    report["image_mask_matching_transformers"] = best
    if best != "all_layers" or not e0["numpy_f64_logits_diff_image_mask_all_layers"] < 1e-2:
        report["problems"].append(f"transformers' image mask is not the one Osprey implements (all layers): {e0}")
    if not e0["logits_diff_without_token_type_ids"] > 1e-4:
        report["problems"].append("token_type_ids changed nothing: the image block's bidirectional mask was not applied")
    if not d01 > 1e-2:
        report["problems"].append(f"a different image hardly changes the logits ({d01})")
    return report


def pan_and_scan_references(spec, prompt, processor_size, images_dir, tensors, forward, torch, transformers, device,
                            report):
    """Adds, for each image i of spec["pan_and_scan_images"], Gemma3ImageProcessor's (the PIL
    one's) output with do_pan_and_scan on and crops of at least 16 pixels:
      pas_pixel_values_<i>  float32 [1 + n, 3, S, S]  the image, then its n crops
      pas_num_crops_<i>     int32 [1]                 n
    and, for image 0's views in one prompt (the image prompt's run of image tokens repeated
    once per view, each with its begin and end tokens, as Gemma3Processor lays out an image with
    crops, without its words between them):
      pas_tokens  int32 [T]   pas_logits  float32 [T, vocab]."""
    from PIL import Image

    S = processor_size
    pas = transformers.Gemma3ImageProcessor(size={"height": S, "width": S}, do_pan_and_scan=True,
                                            pan_and_scan_min_crop_size=16, pan_and_scan_max_num_crops=4,
                                            pan_and_scan_min_ratio_to_activate=1.2)
    views0 = None
    for i, name in enumerate(spec["pan_and_scan_images"]):
        with Image.open(os.path.join(images_dir, name)) as im:
            out = pas(images=im, return_tensors="np")
        pv = np.asarray(out["pixel_values"], dtype=np.float32)
        n = int(np.asarray(out["num_crops"]).reshape(-1)[0])
        if pv.shape[0] != 1 + n:
            report["problems"].append(f"pan-and-scan {name}: {pv.shape[0]} views for {n} crops")
        tensors[f"pas_pixel_values_{i}"] = torch.from_numpy(pv.copy())
        tensors[f"pas_num_crops_{i}"] = torch.tensor([n], dtype=torch.int32)
        report[f"pan_and_scan_{i}"] = {"image": name, "num_crops": n}
        if i == 0:
            views0 = pv
    image_id, boi, eoi = spec["image_token_index"], spec["boi_token_index"], spec["eoi_token_index"]
    first = int(np.nonzero(prompt == boi)[0][0])
    last = int(np.nonzero(prompt == eoi)[0][0])
    run = list(prompt[first:last + 1])
    ids = np.array(list(prompt[:first]) + run * views0.shape[0] + list(prompt[last + 1:]), dtype=np.int32)
    tensors["pas_tokens"] = torch.from_numpy(ids.copy())
    tensors["pas_logits"] = forward(ids, torch.from_numpy(views0).to(device)).cpu().contiguous()


# ----------------------------------------------------------------------------------------
# without torch: the numpy forward as the reference


def write_safetensors_numpy(path, tensors):
    """tensors: name -> (safetensors dtype "BF16" | "F32" | "I32", numpy array); a BF16
    array is float32 holding bf16-exact values. Written in the given order."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (dtype, a) in tensors.items():
        if dtype == "BF16":
            data = (np.ascontiguousarray(a, dtype=np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        else:
            data = np.ascontiguousarray(a, dtype={"F32": "<f4", "I32": "<i4"}[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for b in blobs:
            f.write(b)


def write_family_numpy(family, out_root):
    """The folder as write_family lays it out, without torch: config.json as this script
    states it, the bf16 weights under their checkpoint names, and the float64 numpy forward
    (logits rounded to float32, greedy continuations) as the reference. reference.json says
    "reference": "numpy-float64"; a run with transformers (the default) replaces the folder."""
    spec = FAMILIES[family]
    cfg = config_of(family)
    if cfg["model_type"] not in CAUSAL_LM_CLASSES:
        raise RuntimeError(f"{family}: --numpy-reference covers the families of write_family")
    folder = os.path.join(out_root, family)
    os.makedirs(folder, exist_ok=True)
    config = {"architectures": [CAUSAL_LM_CLASSES[cfg["model_type"]][1]], **cfg, "dtype": "bfloat16"}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]}, f, indent=2)
        f.write("\n")
    weights = make_weights(family)
    write_safetensors_numpy(
        os.path.join(folder, "model.safetensors"), {n: ("BF16", weights[n]) for n in sorted(weights)}
    )

    seqs = make_token_sequences(cfg["vocab_size"], sequence_lengths_of(family))
    tensors, all_margins, greedy_all, greedy_sequences = {}, [], [], []
    for i, s in enumerate(seqs):
        logits = numpy_forward(cfg, weights, s)
        if not np.isfinite(logits).all():
            raise RuntimeError(f"{family}: non-finite logits for sequence {i}")
        g_tokens, g_margins = numpy_greedy(cfg, weights, s, N_GREEDY)
        tensors[f"tokens_{i}"] = ("I32", s)
        tensors[f"logits_{i}"] = ("F32", logits.astype(np.float32))
        tensors[f"greedy_prompt_{i}"] = ("I32", s)
        tensors[f"greedy_tokens_{i}"] = ("I32", g_tokens.astype(np.int32))
        tensors[f"greedy_margins_{i}"] = ("F32", g_margins.astype(np.float32))
        all_margins.append(top2_margins(logits))
        greedy_all.append(g_margins)
        greedy_sequences.append(np.concatenate([s, g_tokens]))
        print(f"{family} seq {i} T={len(s)}: greedy margin median {np.median(g_margins):.3f} min {g_margins.min():.4f}")
    write_safetensors_numpy(os.path.join(folder, "reference.safetensors"), tensors)

    report = {
        "family": family,
        "reference": "numpy-float64",
        "regenerate": f"python3 tools/make_fixtures.py --families {family} --out OUT (torch + transformers, "
        "on a GPU machine), then copy OUT/" + family + " here",
        "compute": "float64 numpy forward of the bf16 weights (make_fixtures.py numpy_forward), logits rounded to "
        "float32; no transformers in this run",
        "config_arguments": {k: v for k, v in cfg.items() if k != "model_type"},
        "config_json_written": config,
        "tensor_name_patterns_written": name_patterns(weights),
        "weight_seed": spec["seed"],
        "weight_std": spec["std"],
        "weight_init": "numpy default_rng(weight_seed) standard_normal * std, rounded to bf16; "
        "norm weights 1 + std_norm * N(0,1), the final norm's times final_norm_scale; "
        "seeds picked (numpy float64 sweep) for clear greedy margins and router gaps",
        "token_seed": TOKEN_SEED,
        "token_range": [MIN_TOKEN_ID, cfg["vocab_size"]],
        "sequence_lengths": list(sequence_lengths_of(family)),
        "greedy": f"{N_GREEDY} tokens by a loop of full forwards (no cache), eos ignored; "
        "greedy_prompt_<i> equals tokens_<i>",
        "logit_margin_stats": stats(np.concatenate(all_margins)),
        "greedy_margin_stats": stats(np.concatenate(greedy_all)),
        "rope_inv_freq_expected": rope_inv_freq(cfg).tolist(),
    }
    if moe.is_moe_config(cfg):
        report["routing"] = routing_report(cfg, weights, seqs + greedy_sequences)
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"{family}: greedy margins {json.dumps(report['greedy_margin_stats'])}")
    if "routing" in report:
        print(f"{family}: routing {json.dumps(report['routing'])}")
    print(f"{family}: files {sorted(os.listdir(folder))}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output folder (one subfolder per family)")
    ap.add_argument("--numpy-only", action="store_true", help="print numpy-forward margins only")
    ap.add_argument(
        "--numpy-reference",
        action="store_true",
        help="write the folders with the numpy float64 forward as the reference (no torch)",
    )
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated subset")
    args = ap.parse_args()
    families = [f for f in args.families.split(",") if f]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        ap.error(f"unknown families {unknown}; known: {sorted(FAMILIES)}")
    if args.numpy_only:
        numpy_only(families)
        return 0
    if not args.out:
        ap.error("--out is required")
    if args.numpy_reference:
        for family in families:
            write_family_numpy(family, args.out)
        return 0

    import torch
    import transformers

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device}")
    failed = []
    for family in families:
        try:
            if spec_of(family)["config"]["model_type"] in CAUSAL_LM_CLASSES:
                write_family(family, args.out, torch, transformers, device)
            else:
                write_family_hybrid(family, args.out, torch, transformers, device)
        except Exception:
            traceback.print_exc()
            failed.append(family)
    if failed:
        print(f"FAILED: {failed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
