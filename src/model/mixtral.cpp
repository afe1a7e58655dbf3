// Mixtral: Mistral's attention (a sliding window over every layer when `sliding_window` is
// set) with a sparse mixture-of-experts block (model/moe.h) on every layer:
// `num_local_experts` experts of intermediate_size, each token's top `num_experts_per_tok`
// weighted by a softmax over their logits. The Hub's checkpoints name the block
// `block_sparse_moe` (experts' w1 gate, w3 up, w2 down); transformers 5 fuses the experts
// under `mlp` (model/moe.h's MoeTensorNames).
#include <memory>

#include "model/llama.h"
#include "model/moe.h"

namespace osprey {
namespace {

MoeTensorNames mixtral_names(const std::string& p) {
  MoeTensorNames n;
  n.router = p + "block_sparse_moe.gate";
  n.experts = p + "block_sparse_moe.experts.";
  n.gate = "w1";
  n.up = "w3";
  n.down = "w2";
  n.fused_router = p + "mlp.gate";
  n.fused_gate_up = p + "mlp.experts.gate_up_proj";
  n.fused_down = p + "mlp.experts.down_proj";
  return n;
}

}  // namespace

void register_mixtral_family() {
  register_family("mixtral", [](const ConfigReader& c, const SafeTensors& st, const LoadOptions& o) {
    DecoderSpec spec = parse_llama_config(c, 1000000.0);
    read_every_layer_window(c, spec);
    const MoeConfig moe = read_moe_config(c, "intermediate_size", MoeWeighting::softmax_chosen);
    spec.feed_forward = [moe](const FeedForwardContext& ctx) -> std::unique_ptr<FeedForward> {
      return std::make_unique<MoeBlock>(ctx, moe, mixtral_names(ctx.prefix));
    };
    return build_decoder(spec, st, o);
  });
}

}  // namespace osprey
