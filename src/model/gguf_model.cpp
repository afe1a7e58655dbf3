#include "model/gguf_model.h"

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "core/error.h"
#include "core/file_read.h"

namespace osprey {
namespace {

using nlohmann::json;

// What an architecture's GGUF keys become: the Hugging Face model_type whose reader parses
// the config, and how the converter laid its tensors out.
struct GgufArch {
  const char* arch;        // general.architecture
  const char* model_type;  // the family that reads it
  TensorLayout layout;
  double default_rope_theta;
};

// NOTE: llama.cpp's converter permutes Llama's q/k rows (its rope rotates interleaved pairs)
// and adds one to Gemma's norm weights (its RMSNorm scales by w); the others keep the
// Hugging Face layout. Mistral's checkpoints convert to the llama architecture.
const GgufArch kGgufArchs[] = {
    {"llama", "llama", {true, false}, 10000.0},
    {"qwen2", "qwen2", {false, false}, 1e6},
    {"qwen3", "qwen3", {false, false}, 1e6},
    {"gemma3", "gemma3_text", {false, true}, 1e6},
    {"cohere2", "cohere2", {false, false}, 10000.0},
};

std::string supported_archs() {
  std::string s;
  for (const GgufArch& a : kGgufArchs) s += (s.empty() ? "" : ", ") + std::string(a.arch);
  return s;
}

// GGUF's per-layer tensor names, after "blk.N.", and the Hugging Face module they are.
std::string layer_tensor_name(const std::string& rest, bool sandwich) {
  static const std::map<std::string, std::string> common = {
      {"attn_norm", "input_layernorm"},        {"attn_q", "self_attn.q_proj"},
      {"attn_k", "self_attn.k_proj"},          {"attn_v", "self_attn.v_proj"},
      {"attn_output", "self_attn.o_proj"},     {"attn_q_norm", "self_attn.q_norm"},
      {"attn_k_norm", "self_attn.k_norm"},     {"ffn_gate", "mlp.gate_proj"},
      {"ffn_up", "mlp.up_proj"},               {"ffn_down", "mlp.down_proj"},
      {"post_attention_norm", "post_attention_layernorm"},
      {"post_ffw_norm", "post_feedforward_layernorm"},
  };
  const size_t dot = rest.rfind('.');
  if (dot == std::string::npos) return "";
  const std::string module = rest.substr(0, dot), suffix = rest.substr(dot);
  if (module == "ffn_norm") return (sandwich ? "pre_feedforward_layernorm" : "post_attention_layernorm") + suffix;
  auto it = common.find(module);
  return it == common.end() ? "" : it->second + suffix;
}

// The Hugging Face name of a GGUF tensor; the GGUF name itself when it has none (the family
// then names it as a tensor it does not read).
std::string hf_tensor_name(const std::string& name, bool sandwich) {
  if (name == "token_embd.weight") return "model.embed_tokens.weight";
  if (name == "output_norm.weight") return "model.norm.weight";
  if (name == "output.weight") return "lm_head.weight";
  if (name.rfind("blk.", 0) == 0) {
    const size_t dot = name.find('.', 4);
    if (dot == std::string::npos || dot == 4) return name;
    const std::string layer = name.substr(4, dot - 4);
    if (layer.find_first_not_of("0123456789") != std::string::npos || layer.size() > 9) return name;
    const std::string rest = layer_tensor_name(name.substr(dot + 1), sandwich);
    if (rest.empty()) return name;
    return "model.layers." + std::to_string(std::stol(layer)) + "." + rest;
  }
  return name;
}

// Copies an integer key into the config when present.
void copy_int(const GgufFile& g, const std::string& key, json& config, const char* field) {
  if (g.has(key)) config[field] = g.get_uint(key);
}

}  // namespace

bool is_gguf_path(const std::filesystem::path& path) {
  return path.extension() == ".gguf" && regular_file_exists(path);
}

GgufCheckpoint read_gguf_checkpoint(const GgufFile& g) {
  const std::string where = g.path().string();
  const std::string arch_name = g.get_string("general.architecture");
  const GgufArch* arch = nullptr;
  for (const GgufArch& a : kGgufArchs)
    if (arch_name == a.arch) arch = &a;
  if (!arch)
    throw Unsupported(where + ": general.architecture \"" + arch_name + "\" is not supported (supported: " +
                      supported_archs() + ")");
  const std::string A = arch_name + ".";
  const bool sandwich = arch_name == "gemma3";

  // Tensors: dense ones under their Hugging Face names; rope_freqs becomes rope factors.
  std::vector<TensorInfo> infos;
  std::vector<double> rope_factors;
  for (const GgufTensorInfo& t : g.tensors()) {
    const auto dtype = gguf_dense_dtype(t.type);
    if (!dtype || !is_float(*dtype))
      throw Unsupported(where + ": tensor " + t.name + " is " + gguf_type_name(uint32_t(t.type)) +
                        ", which Osprey does not read yet (GGUF tensors of type F32, F16 and BF16 load; "
                        "convert the model to F16 or BF16, or load its safetensors checkpoint)");
    if (t.name == "rope_freqs.weight") {
      const Array f = ops::cast(g.tensor_array(t), DType::f32);
      for (int64_t i = 0; i < f.numel(); ++i) rope_factors.push_back(f.data<float>()[i]);
      continue;
    }
    TensorInfo ti;
    ti.name = hf_tensor_name(t.name, sandwich);
    ti.dtype = *dtype;
    ti.shape = t.shape;
    ti.file_index = 0;
    ti.byte_offset = t.byte_offset;
    ti.nbytes = t.nbytes;
    infos.push_back(std::move(ti));
  }
  const GgufTensorInfo* embd = g.tensor("token_embd.weight");
  if (!embd || embd->shape.n != 2) throw InvalidInput(where + ": missing the 2-D tensor token_embd.weight");

  // Every layer has tensors: a block count past the tensor count is refused before anything
  // is sized by it.
  const uint64_t block_count = g.get_uint(A + "block_count");
  if (block_count == 0 || block_count > g.tensors().size())
    throw InvalidInput(where + ": " + A + "block_count is " + std::to_string(block_count) + ", but the file holds " +
                       std::to_string(g.tensors().size()) + " tensors");

  json c = json::object();
  c["model_type"] = arch->model_type;
  c["vocab_size"] = embd->shape[0];
  c["hidden_size"] = g.get_uint(A + "embedding_length");
  c["intermediate_size"] = g.get_uint(A + "feed_forward_length");
  c["num_hidden_layers"] = block_count;
  c["num_attention_heads"] = g.get_uint(A + "attention.head_count");
  copy_int(g, A + "attention.head_count_kv", c, "num_key_value_heads");
  copy_int(g, A + "context_length", c, "max_position_embeddings");
  if (g.has(A + "attention.key_length")) {
    c["head_dim"] = g.get_uint(A + "attention.key_length");
    if (g.has(A + "attention.value_length") &&
        g.get_uint(A + "attention.value_length") != g.get_uint(A + "attention.key_length"))
      throw Unsupported(where + ": " + A + "attention.value_length differs from " + A +
                        "attention.key_length (Osprey's attention has one head size)");
  }
  if (g.has(A + "attention.layer_norm_rms_epsilon"))
    c["rms_norm_eps"] = g.get_float(A + "attention.layer_norm_rms_epsilon");
  if (g.has(A + "attention.layer_norm_epsilon")) c["layer_norm_eps"] = g.get_float(A + "attention.layer_norm_epsilon");
  c["tie_word_embeddings"] = g.tensor("output.weight") == nullptr;

  // Rotary embeddings: base, scaling by type and factor, or per-frequency factors.
  json rope = json::object();
  rope["rope_theta"] = g.has(A + "rope.freq_base") ? g.get_float(A + "rope.freq_base") : arch->default_rope_theta;
  rope["rope_type"] = "default";
  const std::string scaling = g.has(A + "rope.scaling.type") ? g.get_string(A + "rope.scaling.type") : "none";
  if (scaling == "linear") {
    rope["rope_type"] = "linear";
    rope["factor"] = g.get_float(A + "rope.scaling.factor");
  } else if (scaling != "none") {
    throw Unsupported(where + ": " + A + "rope.scaling.type \"" + scaling + "\" is not supported (none, linear are)");
  }
  if (!rope_factors.empty()) {
    if (scaling != "none") throw Unsupported(where + ": both rope_freqs.weight and " + A + "rope.scaling.type are set");
    rope["rope_type"] = "factors";
    rope["factors"] = rope_factors;
  }

  // Sliding-window layers: the window, and which layers slide (an array of bools, or every
  // n-th layer full; the architecture's pattern when the file states none, as llama.cpp has it).
  const int64_t n_layers = int64_t(block_count);
  auto layer_types = [&](int64_t default_pattern) {
    std::vector<bool> sliding;
    const std::string key = A + "attention.sliding_window_pattern";
    const GgufValue* v = g.find(key);
    if (v && v->type == GgufValueType::array) {
      for (int64_t b : g.get_int_array(key)) sliding.push_back(b != 0);
      if (int64_t(sliding.size()) != n_layers)
        throw InvalidInput(where + ": " + key + " has " + std::to_string(sliding.size()) + " entries for " +
                           std::to_string(n_layers) + " layers");
    } else {
      const int64_t pattern = v ? int64_t(g.get_uint(key)) : default_pattern;
      if (pattern < 1) throw InvalidInput(where + ": " + key + " must be at least 1");
      for (int64_t i = 0; i < n_layers; ++i) sliding.push_back((i + 1) % pattern != 0);
    }
    json types = json::array();
    for (bool s : sliding) types.push_back(s ? "sliding_attention" : "full_attention");
    return types;
  };

  const std::string model_type = arch->model_type;
  if (arch_name == "llama") {
    c["rope_parameters"] = rope;
    if (g.has(A + "attention.sliding_window")) {  // a Mistral checkpoint with a window
      c["model_type"] = "mistral";
      c["sliding_window"] = g.get_uint(A + "attention.sliding_window");
    }
  } else if (arch_name == "qwen2" || arch_name == "qwen3") {
    c["rope_parameters"] = rope;
  } else if (arch_name == "gemma3") {
    c["sliding_window"] = g.get_uint(A + "attention.sliding_window");
    c["layer_types"] = layer_types(6);
    json local = {{"rope_type", "default"},
                  {"rope_theta", g.has(A + "rope.freq_base_swa") ? g.get_float(A + "rope.freq_base_swa") : 10000.0}};
    c["rope_parameters"] = {{"full_attention", rope}, {"sliding_attention", local}};
    if (g.has(A + "final_logit_softcapping")) c["final_logit_softcapping"] = g.get_float(A + "final_logit_softcapping");
    if (g.has(A + "attn_logit_softcapping")) c["attn_logit_softcapping"] = g.get_float(A + "attn_logit_softcapping");
    // The attention scale: the file's, else llama.cpp's rule (hidden / heads for the 62-layer
    // 27B model, the head size otherwise).
    const int64_t hidden = c["hidden_size"].get<int64_t>(), heads = c["num_attention_heads"].get<int64_t>();
    double scalar = c.contains("head_dim") ? c["head_dim"].get<double>() : double(hidden / std::max<int64_t>(heads, 1));
    if (n_layers == 62 && heads > 0) scalar = double(hidden / heads);
    if (g.has(A + "attention.scale")) {
      const double s = g.get_float(A + "attention.scale");
      if (!(s > 0) || !std::isfinite(s)) throw InvalidInput(where + ": " + A + "attention.scale must be positive");
      scalar = 1.0 / (s * s);
    }
    c["query_pre_attn_scalar"] = scalar;
  } else if (arch_name == "cohere2") {
    c["sliding_window"] = g.get_uint(A + "attention.sliding_window");
    c["layer_types"] = layer_types(4);
    c["rope_parameters"] = rope;
    if (g.has(A + "logit_scale")) c["logit_scale"] = g.get_float(A + "logit_scale");
  }

  // Special tokens: eos, and the end-of-turn token, which ends a reply too.
  json eos = json::array();
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"})
    if (g.has(key)) eos.push_back(g.get_uint(key));
  if (!eos.empty()) c["eos_token_id"] = eos;
  if (g.has("tokenizer.ggml.bos_token_id")) c["bos_token_id"] = g.get_uint("tokenizer.ggml.bos_token_id");

  std::vector<std::shared_ptr<Buffer>> buffers = {g.buffer()};
  return GgufCheckpoint{ConfigReader(std::move(c), where + " (GGUF metadata)"),
                        SafeTensors::adopt(g.path(), std::move(buffers), std::move(infos), arch->layout)};
}

}  // namespace osprey
