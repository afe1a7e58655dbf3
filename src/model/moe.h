#pragma once
// A sparse mixture-of-experts block (Qwen3-MoE, Mixtral), given to the decoder as a layer's
// feed-forward block (model/feed_forward.h). A router [n_experts, hidden] scores each token;
// the token goes to its top_k experts, each a gated MLP silu(h W_gate) * (h W_up) W_down of
// width expert_width, and its output is their sum weighted as `weighting` says.
//
// The routing is decided on the host: the router logits come back from the device, and only
// the chosen experts' weights are read (a decode step reads top_k experts of each layer).
// NOTE: that readback is a synchronisation per layer on a device, and the block's step cannot be
// recorded and replayed (FeedForward::replayable); a grouped kernel that reads the choices on
// the device is the way past both.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/quant.h"
#include "model/feed_forward.h"
#include "model/linear_group.h"

namespace osprey {

class ConfigReader;

// How the chosen experts' weights are made from the router logits l [n_experts].
enum class MoeWeighting {
  // p = softmax(l) over all experts; each chosen expert weighs its p as it is (Qwen3-MoE with
  // norm_topk_prob false).
  softmax_all,
  // The chosen p divided by their sum, which equals a softmax over the chosen logits alone
  // (Mixtral; Qwen3-MoE with norm_topk_prob true).
  softmax_chosen,
};

struct MoeConfig {
  int64_t n_experts = 0;
  int64_t top_k = 0;
  int64_t expert_width = 0;  // each expert's intermediate size
  MoeWeighting weighting = MoeWeighting::softmax_chosen;
};

// Reads the experts from config.json: their number as `num_experts` (the Hub's Qwen3-MoE
// configs) or `num_local_experts` (Mixtral's, and what transformers 5 writes for several
// families), either spelling, both only when equal; `num_experts_per_tok` in [1, experts];
// the expert width from `width_key`. Throws InvalidInput naming the field.
MoeConfig read_moe_config(const ConfigReader& c, const std::string& width_key, MoeWeighting weighting);

// The routing of n tokens.
struct MoeRouting {
  int64_t n_tokens = 0;
  int64_t top_k = 0;
  std::vector<int32_t> experts;  // [n_tokens * top_k]: token t's experts, highest logit first
  std::vector<float> weights;    // [n_tokens * top_k]: their weights, in the same order
};

// Routes n tokens from their router logits [n, n_experts] (host memory, row-major), in double
// precision. The chosen experts are the top_k logits (softmax is monotonic, so these are the
// top_k probabilities); equal logits go to the lower expert index, as torch.topk orders them
// on these sizes. A NaN logit ranks below every other (its token's weights come out NaN, and
// so do the model's logits).
MoeRouting route_tokens(std::span<const float> logits, int64_t n_experts, int64_t top_k, MoeWeighting weighting);

// Where one layer's router and experts sit in a checkpoint. The per-expert form (what the
// Hub's checkpoints and save_pretrained write): `router` + ".weight" [n_experts, hidden], and
// for expert e the modules experts + e + "." + gate / up / down ([width, hidden], [width,
// hidden], [hidden, width]). transformers 5's fused form: `fused_router` + ".weight", and the
// tensors fused_gate_up [n_experts, 2 width, hidden] (gate rows, then up rows) and fused_down
// [n_experts, hidden, width]. The fused form is read when fused_gate_up is in the checkpoint.
struct MoeTensorNames {
  std::string router;
  std::string experts;
  std::string gate, up, down;
  std::string fused_router;
  std::string fused_gate_up, fused_down;
};

class MoeBlock final : public FeedForward {
 public:
  // Loads one layer's router and experts (each expert as WeightLoader::linear reads it: dense
  // or quantized, on the CPU views of the mapped file). Throws InvalidInput naming a missing
  // or misshapen tensor.
  MoeBlock(const FeedForwardContext& c, const MoeConfig& config, const MoeTensorNames& names);

  // h [n, hidden] f32 -> [n, hidden] f32. Each token's experts are summed in ascending expert
  // order, so a token's output does not depend on the other tokens of the batch where the
  // linear layers are batch-invariant (ops::set_batch_invariant).
  Array forward(const Array& h) const override;
  bool replayable() const override { return false; }

  const MoeConfig& config() const { return config_; }

 private:
  MoeConfig config_;
  LinearWeight router_;               // [n_experts, hidden]
  std::vector<LinearGroup> gate_up_;  // per expert: gate, up [width, hidden] (or stacked)
  std::vector<LinearWeight> down_;    // per expert: [hidden, width]
};

}  // namespace osprey
