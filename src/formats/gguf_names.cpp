#include "formats/gguf_names.h"

#include <utility>

namespace osprey {
namespace {

// (GGUF, Hugging Face) names of a block's modules, after "blk.N." and "model.layers.N.";
// ffn_norm, whose meaning depends on the family, is handled apart.
constexpr std::pair<const char*, const char*> kLayerModules[] = {
    {"attn_norm", "input_layernorm"},        {"attn_q", "self_attn.q_proj"},
    {"attn_k", "self_attn.k_proj"},          {"attn_v", "self_attn.v_proj"},
    {"attn_output", "self_attn.o_proj"},     {"attn_q_norm", "self_attn.q_norm"},
    {"attn_k_norm", "self_attn.k_norm"},     {"ffn_gate", "mlp.gate_proj"},
    {"ffn_up", "mlp.up_proj"},               {"ffn_down", "mlp.down_proj"},
    {"post_ffw_norm", "post_feedforward_layernorm"},
};

// (GGUF, Hugging Face) names of the tensors outside the blocks.
constexpr std::pair<const char*, const char*> kGlobal[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

// kLayerModules read one way (GGUF to Hugging Face when to_hf) or the other; "" when absent.
std::string lookup(const std::string& module, bool to_hf) {
  for (const auto& [g, hf] : kLayerModules)
    if (module == (to_hf ? g : hf)) return to_hf ? hf : g;
  return "";
}

std::string hf_module(const std::string& module, bool sandwich) {
  if (module == "ffn_norm") return sandwich ? "pre_feedforward_layernorm" : "post_attention_layernorm";
  if (module == "post_attention_norm") return "post_attention_layernorm";
  return lookup(module, true);
}

std::string gguf_module(const std::string& module, bool sandwich) {
  if (module == "post_attention_layernorm") return sandwich ? "post_attention_norm" : "ffn_norm";
  if (module == "pre_feedforward_layernorm") return "ffn_norm";
  return lookup(module, false);
}

}  // namespace

std::string hf_tensor_name(const std::string& name, bool sandwich) {
  for (const auto& [g, hf] : kGlobal)
    if (name == g) return hf;
  if (name.rfind("blk.", 0) != 0) return name;
  const size_t dot = name.find('.', 4), last = name.rfind('.');
  if (dot == std::string::npos || dot == 4 || last <= dot) return name;
  const std::string layer = name.substr(4, dot - 4);
  if (layer.find_first_not_of("0123456789") != std::string::npos || layer.size() > 9) return name;
  const std::string module = hf_module(name.substr(dot + 1, last - dot - 1), sandwich);
  if (module.empty()) return name;
  return "model.layers." + std::to_string(std::stol(layer)) + "." + module + name.substr(last);
}

std::string gguf_tensor_name(const std::string& name, bool sandwich) {
  for (const auto& [g, hf] : kGlobal)
    if (name == hf) return g;
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return "";
  const size_t dot = name.find('.', prefix.size()), last = name.rfind('.');
  if (dot == std::string::npos || last <= dot) return "";
  const std::string module = gguf_module(name.substr(dot + 1, last - dot - 1), sandwich);
  if (module.empty()) return "";
  return "blk." + name.substr(prefix.size(), dot - prefix.size()) + "." + module + name.substr(last);
}

}  // namespace osprey
