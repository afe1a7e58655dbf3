// Qwen3-MoE: Qwen3's attention (per-head q/k RMSNorm before RoPE, head_dim from the config)
// with a sparse mixture-of-experts block (model/moe.h) in place of the MLP: on layer i when
// i is not in `mlp_only_layers` and (i + 1) is a multiple of `decoder_sparse_step`, else the
// dense MLP of intermediate_size. The router's softmax is over all experts; with
// norm_topk_prob (Qwen3MoeConfig's default: false) the chosen top-k are renormalized.
#include <memory>
#include <vector>

#include "core/error.h"
#include "model/llama.h"
#include "model/moe.h"

namespace osprey {
namespace {

// Which layers are sparse; errors name the field.
std::vector<bool> qwen3_moe_sparse_layers(const ConfigReader& c, int64_t n_layers) {
  const int64_t step = c.get_int("decoder_sparse_step", 1);
  if (step < 1 || step > INT32_MAX) c.fail("decoder_sparse_step", "must be a positive integer, got " + std::to_string(step));
  std::vector<bool> sparse(static_cast<size_t>(n_layers));
  for (int64_t i = 0; i < n_layers; ++i) sparse[size_t(i)] = (i + 1) % step == 0;
  if (c.has("mlp_only_layers")) {
    const nlohmann::json& v = c.json()["mlp_only_layers"];
    if (!v.is_array()) c.fail("mlp_only_layers", "expected a list of layer indices, got " + v.dump());
    for (const nlohmann::json& e : v) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= n_layers)
        c.fail("mlp_only_layers", e.dump() + " is not a layer index in [0, " + std::to_string(n_layers) + ")");
      sparse[size_t(e.get<int64_t>())] = false;
    }
  }
  return sparse;
}

MoeTensorNames qwen3_moe_names(const std::string& p) {
  MoeTensorNames n;
  n.router = n.fused_router = p + "mlp.gate";
  n.experts = p + "mlp.experts.";
  n.gate = "gate_proj";
  n.up = "up_proj";
  n.down = "down_proj";
  n.fused_gate_up = p + "mlp.experts.gate_up_proj";
  n.fused_down = p + "mlp.experts.down_proj";
  return n;
}

}  // namespace

void register_qwen3_moe_family() {
  register_family("qwen3_moe", [](const ConfigReader& c, const SafeTensors& st, const LoadOptions& o) {
    DecoderSpec spec = parse_llama_config(c, 1000000.0);
    spec.attention_bias = c.get_bool("attention_bias", false);
    spec.o_proj_bias = spec.attention_bias;
    spec.qk_norm = true;
    if (c.get_bool("use_sliding_window", false))
      throw Unsupported(c.where() + ": use_sliding_window=true is not supported for qwen3_moe");
    const MoeWeighting weighting =
        c.get_bool("norm_topk_prob", false) ? MoeWeighting::softmax_chosen : MoeWeighting::softmax_all;
    const MoeConfig moe = read_moe_config(c, "moe_intermediate_size", weighting);
    const std::vector<bool> sparse = qwen3_moe_sparse_layers(c, spec.n_layers);
    spec.feed_forward = [moe, sparse](const FeedForwardContext& ctx) -> std::unique_ptr<FeedForward> {
      if (!sparse[size_t(ctx.layer)]) return nullptr;
      return std::make_unique<MoeBlock>(ctx, moe, qwen3_moe_names(ctx.prefix));
    };
    return build_decoder(spec, st, o);
  });
}

}  // namespace osprey
