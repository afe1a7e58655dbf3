"""Mixture-of-experts parts of the fixture generator (make_fixtures.py): which layers are
sparse, the expert and router tensors as the Hugging Face checkpoints name them, the float64
MoE block of the numpy forward, and the fused expert tensors transformers 5 keeps in memory.

Routing, as transformers 5.17 defines it (Qwen3MoeTopKRouter, MixtralTopKRouter):
  probs = softmax(h @ gate.T) in float32 over all experts; the top num_experts_per_tok of
  them; divided by their sum when the config renormalizes (qwen3_moe: norm_topk_prob;
  mixtral: always, which equals a softmax over the chosen logits). Each token's output is
  sum_j w_j * down_e(silu(gate_e h) * up_e h) over its chosen experts e.
Ties among equal router logits go to the lowest expert index (a stable sort); softmax is
monotonic, so the top-k of the logits are the top-k of the probabilities.

Checkpoint names (what save_pretrained writes by default, the original format):
  qwen3_moe  model.layers.N.mlp.gate.weight [E, H]
             model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight
  mixtral    model.layers.N.block_sparse_moe.gate.weight [E, H]
             model.layers.N.block_sparse_moe.experts.E.{w1 (gate), w3 (up), w2 (down)}.weight
transformers 5 holds the experts fused in memory (and writes them so with
save_pretrained(save_original_format=False)):
  model.layers.N.mlp.experts.gate_up_proj [E, 2 I, H] (gate rows, then up rows)
  model.layers.N.mlp.experts.down_proj    [E, H, I]
and Mixtral's router as model.layers.N.mlp.gate.weight.
"""

import re

import numpy as np

MOE_MODEL_TYPES = ("qwen3_moe", "mixtral")


def is_moe_config(cfg):
    return cfg["model_type"] in MOE_MODEL_TYPES


def n_experts(cfg):
    return cfg.get("num_experts") or cfg.get("num_local_experts") or 0


def is_moe_layer(cfg, i):
    """Whether layer i has a sparse MoE block (else the dense MLP of intermediate_size)."""
    if cfg["model_type"] == "mixtral":
        return True
    return (
        i not in cfg.get("mlp_only_layers", [])
        and n_experts(cfg) > 0
        and (i + 1) % cfg.get("decoder_sparse_step", 1) == 0
    )


def expert_width(cfg):
    return cfg["moe_intermediate_size"] if cfg["model_type"] == "qwen3_moe" else cfg["intermediate_size"]


def renormalizes(cfg):
    return True if cfg["model_type"] == "mixtral" else bool(cfg.get("norm_topk_prob", False))


def router_name(cfg, p):
    return p + ("block_sparse_moe.gate.weight" if cfg["model_type"] == "mixtral" else "mlp.gate.weight")


def expert_names(cfg, p, e):
    """(gate, up, down) weight names of expert e of the layer with prefix p."""
    if cfg["model_type"] == "mixtral":
        q = f"{p}block_sparse_moe.experts.{e}."
        return q + "w1.weight", q + "w3.weight", q + "w2.weight"
    q = f"{p}mlp.experts.{e}."
    return q + "gate_proj.weight", q + "up_proj.weight", q + "down_proj.weight"


def draw_mlp(cfg, std, i, p, normal):
    """The MLP tensors of layer i (prefix p): dense or router + experts, drawn with
    normal(shape, std) (bf16-exact float32), in a fixed order."""
    hidden = cfg["hidden_size"]
    w = {}
    if not is_moe_layer(cfg, i):
        inter = cfg["intermediate_size"]
        w[p + "mlp.gate_proj.weight"] = normal((inter, hidden), std["gate"])
        w[p + "mlp.up_proj.weight"] = normal((inter, hidden), std["up"])
        w[p + "mlp.down_proj.weight"] = normal((hidden, inter), std["down"])
        return w
    inter = expert_width(cfg)
    w[router_name(cfg, p)] = normal((n_experts(cfg), hidden), std["router"])
    for e in range(n_experts(cfg)):
        gate, up, down = expert_names(cfg, p, e)
        w[gate] = normal((inter, hidden), std["gate"])
        w[up] = normal((inter, hidden), std["up"])
        w[down] = normal((hidden, inter), std["down"])
    return w


def route_f64(logits, k, renormalize):
    """logits [T, E] float64 -> (chosen [T, k] expert ids, weights [T, k], relative gap [T]).
    The gap is logit(k-th) - logit(k+1-th) over the row's standard deviation: how far the
    choice is from a tie (inf when every expert is chosen)."""
    order = np.argsort(-logits, axis=-1, kind="stable")  # equal logits: lowest index first
    chosen = order[:, :k]
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = z / z.sum(axis=-1, keepdims=True)
    w = np.take_along_axis(probs, chosen, axis=-1)
    if renormalize:
        w = w / w.sum(axis=-1, keepdims=True)
    if k < logits.shape[1]:
        kth = np.take_along_axis(logits, order[:, k - 1 : k], axis=-1)[:, 0]
        nxt = np.take_along_axis(logits, order[:, k : k + 1], axis=-1)[:, 0]
        gap = (kth - nxt) / logits.std(axis=-1)
    else:
        gap = np.full(logits.shape[0], np.inf)
    return chosen, w, gap


def moe_f64(cfg, f64, p, h, probe=None):
    """The MoE block of the layer with prefix p over h [T, hidden] float64. `probe`, a dict,
    collects the routing's relative gaps (`router_gaps`, one [T] array per layer call), choices
    (`router_choices`, sorted) and logits over each row's standard deviation (`router_logits`)."""
    k = cfg["num_experts_per_tok"]
    logits = h @ f64[router_name(cfg, p)].T
    chosen, w, gap = route_f64(logits, k, renormalizes(cfg))
    if probe is not None:
        probe.setdefault("router_gaps", []).append(gap)
        probe.setdefault("router_choices", []).append(np.sort(chosen, axis=-1))
        probe.setdefault("router_logits", []).append(logits / logits.std(axis=-1, keepdims=True))
    out = np.zeros_like(h)
    for e in np.unique(chosen):
        rows, slot = np.nonzero(chosen == e)
        gate, up, down = (f64[n] for n in expert_names(cfg, p, e))
        x = h[rows]
        g = x @ gate.T
        act = g / (1.0 + np.exp(-g)) * (x @ up.T)
        out[rows] += w[rows, slot][:, None] * (act @ down.T)
    return out


def mlp_f64(cfg, f64, i, p, h, probe=None):
    """Layer i's MLP over h [T, hidden] float64: the MoE block or the dense gated MLP."""
    if is_moe_layer(cfg, i):
        return moe_f64(cfg, f64, p, h, probe)
    g = h @ f64[p + "mlp.gate_proj.weight"].T
    act = g / (1.0 + np.exp(-g)) * (h @ f64[p + "mlp.up_proj.weight"].T)
    return act @ f64[p + "mlp.down_proj.weight"].T


# ----------------------------------------------------------------------------------------
# transformers 5's in-memory names


def model_state(cfg, weights, model_keys):
    """`weights` (checkpoint names -> arrays) under the names of a model whose state dict has
    `model_keys`: itself when every name is there (per-expert modules), else with each sparse
    layer's experts fused (gate_up_proj [E, 2I, H], down_proj [E, H, I]) and Mixtral's router
    moved to mlp.gate. Raises when the result does not name exactly the model's keys."""
    model_keys = set(model_keys)
    if set(weights) <= model_keys:
        return dict(weights)
    out = {}
    expert_name = re.compile(r"\.(mlp|block_sparse_moe)\.experts\.\d+\.")
    for name, value in weights.items():
        if expert_name.search(name):
            continue
        if ".block_sparse_moe.gate." in name:
            name = name.replace(".block_sparse_moe.gate.", ".mlp.gate.")
        out[name] = value
    for i in range(cfg["num_hidden_layers"]):
        if not is_moe_layer(cfg, i):
            continue
        p = f"model.layers.{i}."
        gates, ups, downs = zip(*(expert_names(cfg, p, e) for e in range(n_experts(cfg))))
        out[p + "mlp.experts.gate_up_proj"] = np.stack(
            [np.concatenate([weights[g], weights[u]], axis=0) for g, u in zip(gates, ups)]
        )
        out[p + "mlp.experts.down_proj"] = np.stack([weights[d] for d in downs])
    if set(out) != model_keys:
        raise RuntimeError(
            f"fused expert names differ from the model's: model-only {sorted(model_keys - set(out))[:8]}, "
            f"ours-only {sorted(set(out) - model_keys)[:8]}"
        )
    return out


def router_stats(probe):
    """Summary of the relative router gaps a forward collected (see route_f64)."""
    gaps = np.concatenate(probe.get("router_gaps", [np.array([np.inf])]))
    finite = gaps[np.isfinite(gaps)]
    if finite.size == 0:
        return {"n": int(gaps.size), "min": None}
    return {
        "n": int(gaps.size),
        "min": float(finite.min()),
        "p01": float(np.percentile(finite, 1)),
        "median": float(np.median(finite)),
        "count_below_1e-3": int((finite < 1e-3).sum()),
        "count_below_1e-2": int((finite < 1e-2).sum()),
    }
