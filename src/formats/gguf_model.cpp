#include "formats/gguf_model.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "core/error.h"
#include "core/file_read.h"
#include "core/half.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "formats/family_formats.h"
#include "formats/gguf_blocks.h"
#include "formats/gguf_names.h"
#include "formats/quant_gguf.h"

namespace osprey {
namespace {

using nlohmann::json;

// One quantized matrix [rows, cols] repacked: its three arrays' bytes in a store of its own, at
// 64-byte aligned offsets, and their TensorInfos under `name`'s module. A store per matrix: a
// CPU weight that keeps its tiles alone (ops::keep_tiles_only) lets its store go once loaded.
// NOTE: mapped anonymous memory, not the heap: a freed store goes back to the system at once
// (a heap's freed middle would stay resident).
class RepackStore {
 public:
  explicit RepackStore(size_t size) : size_(std::max<size_t>(size, 1)) {
    void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw OutOfMemory("cannot map " + std::to_string(size_) + " bytes for a repacked GGUF tensor");
    data_ = static_cast<uint8_t*>(p);
  }
  ~RepackStore() { ::munmap(data_, size_); }
  RepackStore(const RepackStore&) = delete;
  RepackStore& operator=(const RepackStore&) = delete;
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Offsets of n1, n2, n3 bytes at 64-byte alignment, and the total.
struct StoreLayout {
  size_t at[3], total;
  StoreLayout(size_t n1, size_t n2, size_t n3) {
    const auto up = [](size_t v) { return (v + 63) / 64 * 64; };
    at[0] = 0;
    at[1] = up(n1);
    at[2] = at[1] + up(n2);
    total = at[2] + n3;
  }
};

void add_info(std::vector<TensorInfo>& infos, const std::string& name, DType dt, Shape shape, size_t file_index,
              size_t at, size_t n) {
  TensorInfo ti;
  ti.name = name;
  ti.dtype = dt;
  ti.shape = shape;
  ti.file_index = file_index;
  ti.byte_offset = at;
  ti.nbytes = n;
  infos.push_back(std::move(ti));
}

void check_matrix(const GgufFile& g, const GgufTensorInfo& t) {
  if (t.shape.n != 2)
    throw InvalidInput(g.path().string() + ": tensor " + t.name + " is a " + gguf_type_name(uint32_t(t.type)) +
                       " tensor of " + std::to_string(t.shape.n) + " dimensions (a matrix is expected)");
  // An empty matrix holds no bytes, so the file's size bounds nothing of its other dimension
  // (which sizes the repacked arrays): refused, as no model has one.
  if (t.shape[0] <= 0 || t.shape[1] <= 0)
    throw InvalidInput(g.path().string() + ": tensor " + t.name + " is an empty matrix [" +
                       std::to_string(t.shape[0]) + ", " + std::to_string(t.shape[1]) + "]");
}

// Appends the matrix's store to `buffers` (its file_index) and its arrays to `infos`.
// `method`: the block type's (formats/quant_gguf.h), which turns each block into affine groups.
void repack_blocks(const GgufFile& g, const GgufTensorInfo& t, const GgufBlockMethod& method,
                   const std::string& hf_name, std::vector<std::shared_ptr<Buffer>>& buffers,
                   std::vector<TensorInfo>& infos) {
  const std::string where = g.path().string() + ": tensor " + t.name;
  check_matrix(g, t);
  const int bits = method.repacked_bits(), group = method.repacked_group();
  const int64_t rows = t.shape[0], cols = t.shape[1], groups = cols / group;
  const GgufBlock block = *gguf_block(uint32_t(t.type));
  const int64_t blocks_per_row = cols / block.elements, groups_per_block = block.elements / group;
  const std::string module = hf_name.size() > 7 && hf_name.compare(hf_name.size() - 7, 7, ".weight") == 0
                                 ? hf_name.substr(0, hf_name.size() - 7)
                                 : hf_name;
  const size_t packed_bytes = size_t(rows) * size_t(cols) * size_t(bits) / 8;
  const size_t scale_bytes = size_t(rows) * size_t(groups) * 2;
  const StoreLayout layout(packed_bytes, scale_bytes, scale_bytes);
  const size_t p_at = layout.at[0], s_at = layout.at[1], b_at = layout.at[2];
  auto owned = std::make_shared<RepackStore>(layout.total);
  uint8_t* const bytes = owned->data();
  const uint8_t* src = g.file()->data() + t.byte_offset;
  std::vector<uint8_t> codes(static_cast<size_t>(block.elements));
  std::vector<uint16_t> sc(static_cast<size_t>(groups_per_block)), bs(static_cast<size_t>(groups_per_block));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < blocks_per_row; ++k) {
      method.affine_groups(src + (size_t(r) * size_t(blocks_per_row) + size_t(k)) * size_t(block.bytes), codes.data(),
                           sc.data(), bs.data());
      for (int64_t j = 0; j < groups_per_block; ++j)
        if ((sc[j] & 0x7C00) == 0x7C00 || (bs[j] & 0x7C00) == 0x7C00)
          throw InvalidInput(where + ": a block's scale or minimum (row " + std::to_string(r) +
                             ") is not a finite float16 in Osprey's affine layout");
      const size_t first = size_t(r) * size_t(cols) + size_t(k) * size_t(block.elements);
      uint8_t* out = bytes + p_at + first * size_t(bits) / 8;
      if (bits == 8) {
        std::memcpy(out, codes.data(), codes.size());
      } else {
        for (size_t i = 0; i < codes.size() / 2; ++i) out[i] = uint8_t(codes[2 * i] | (codes[2 * i + 1] << 4));
      }
      const size_t at = (size_t(r) * size_t(groups) + size_t(k) * size_t(groups_per_block)) * 2;
      std::memcpy(bytes + s_at + at, sc.data(), sc.size() * 2);
      std::memcpy(bytes + b_at + at, bs.data(), bs.size() * 2);
    }
  }
  // The blocks are read once, here: their pages, which this pass brought in, go back to the file.
  release_mapped_pages(src, size_t(t.nbytes));
  const size_t file_index = buffers.size();
  buffers.push_back(std::make_shared<Buffer>(bytes, layout.total, Device::cpu(),
                                             [keep = std::move(owned)](void*, size_t, bool) {}));
  add_info(infos, module + ".weight", DType::u32, {rows, cols * bits / 32}, file_index, p_at, packed_bytes);
  add_info(infos, module + ".scales", DType::f16, {rows, groups}, file_index, s_at, scale_bytes);
  add_info(infos, module + ".biases", DType::f16, {rows, groups}, file_index, b_at, scale_bytes);
}

// "F32, F16, BF16, Q8_0, ... and Q6_K": the dense types and those of the registry's block methods.
std::string types_read() {
  std::vector<std::string> names = {"F32", "F16", "BF16"};
  for (const QuantMethod* m : quant_methods())
    if (dynamic_cast<const GgufBlockMethod*>(m)) names.push_back(m->name());
  std::string list;
  for (size_t i = 0; i < names.size(); ++i) list += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return list;
}

// Copies an integer key into the config when present.
void copy_int(const GgufFile& g, const std::string& key, json& config, const char* field) {
  if (g.has(key)) config[field] = g.get_uint(key);
}

// A GGUF file's tensors as a SafeTensors source's: dense ones under their Hugging Face names
// (views of the mapping), the quantized ones repacked by their block type's method
// (formats/quant_gguf.h); rope_freqs becomes rope factors.
struct GgufReadTensors {
  std::vector<TensorInfo> infos;
  // Buffer 0: the file's mapping (dense tensors are views of it); then one per repacked matrix.
  std::vector<std::shared_ptr<Buffer>> buffers;
  std::vector<double> rope_factors;
  std::map<std::string, std::pair<int, int>> module_quant;  // repacked modules -> bits, group size
  std::map<std::string, std::string> module_types;           // repacked modules -> block type ("Q4_K")
  std::map<std::string, int> converted;                     // "Q4_K repacked to 4-bit affine" -> tensors
};

GgufReadTensors gguf_read_tensors(const GgufFile& g, bool sandwich) {
  const std::string where = g.path().string();
  GgufReadTensors out;
  out.buffers = {g.buffer()};
  for (const GgufTensorInfo& t : g.tensors()) {
    const std::string type_name = gguf_type_name(uint32_t(t.type));
    if (const GgufBlockMethod* method = gguf_block_method(t.type)) {
      const std::string hf = hf_tensor_name(t.name, sandwich);
      repack_blocks(g, t, *method, hf, out.buffers, out.infos);
      const std::string module = hf.substr(0, hf.size() - std::min<size_t>(hf.size(), 7));
      out.module_quant[module] = {method->repacked_bits(), method->repacked_group()};
      out.module_types[module] = method->name();
      ++out.converted[type_name + " repacked to " + std::to_string(method->repacked_bits()) + "-bit affine (group " +
                      std::to_string(method->repacked_group()) + ")"];
      continue;
    }
    const auto dtype = gguf_dense_dtype(t.type);
    if (!dtype || !is_float(*dtype))
      throw Unsupported(where + ": tensor " + t.name + " is " + type_name +
                        ", which Osprey does not read (GGUF tensors of type " + types_read() +
                        " load; requantize the file to one of them, or load the safetensors checkpoint)");
    if (t.name == "rope_freqs.weight") {
      const Array f = ops::cast(g.tensor_array(t), DType::f32);
      for (int64_t i = 0; i < f.numel(); ++i) out.rope_factors.push_back(f.data<float>()[i]);
      continue;
    }
    TensorInfo ti;
    ti.name = hf_tensor_name(t.name, sandwich);
    ti.dtype = *dtype;
    ti.shape = t.shape;
    ti.file_index = 0;
    ti.byte_offset = t.byte_offset;
    ti.nbytes = t.nbytes;
    out.infos.push_back(std::move(ti));
  }
  return out;
}

// Rotary embeddings: base, scaling by type and factor, or per-frequency factors.
json gguf_read_rope(const GgufFile& g, const std::string& A, const FamilyFormats& family,
                    const std::vector<double>& rope_factors) {
  const std::string where = g.path().string();
  json rope = json::object();
  rope["rope_theta"] = g.has(A + "rope.freq_base") ? g.get_float(A + "rope.freq_base") : family.gguf_rope_theta;
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
  return rope;
}

// Sliding-window layers: which layers slide (an array of bools, or every n-th layer full; the
// family's period when the file states none, as llama.cpp has it).
json gguf_layer_types(const GgufFile& g, const std::string& A, int64_t n_layers, int64_t default_pattern) {
  const std::string where = g.path().string();
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
}

// The keys of the family's row beyond the shared ones (formats/family_formats.h), into `c`.
void gguf_read_family_keys(const GgufFile& g, const std::string& A, const FamilyFormats& family, const json& rope,
                           int64_t n_layers, json& c) {
  const std::string where = g.path().string();
  if (family.local_rope_base) {
    json local = {{"rope_type", "default"},
                  {"rope_theta", g.has(A + "rope.freq_base_swa") ? g.get_float(A + "rope.freq_base_swa") : 10000.0}};
    c["rope_parameters"] = {{"full_attention", rope}, {"sliding_attention", local}};
  } else {
    c["rope_parameters"] = rope;
  }
  if (family.window == GgufWindow::every_layer && g.has(A + "attention.sliding_window"))
    c["sliding_window"] = g.get_uint(A + "attention.sliding_window");
  if (family.window == GgufWindow::pattern) {
    c["sliding_window"] = g.get_uint(A + "attention.sliding_window");
    c["layer_types"] = gguf_layer_types(g, A, n_layers, family.window_pattern);
  }
  if (family.softcapping) {
    if (g.has(A + "final_logit_softcapping")) c["final_logit_softcapping"] = g.get_float(A + "final_logit_softcapping");
    if (g.has(A + "attn_logit_softcapping")) c["attn_logit_softcapping"] = g.get_float(A + "attn_logit_softcapping");
  }
  if (family.attention_scale) {
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
  }
  if (family.logit_scale && g.has(A + "logit_scale")) c["logit_scale"] = g.get_float(A + "logit_scale");
}

// Repacked weights: the most common (bits, group size) as the global setting, the others per module.
json gguf_quantization(const std::map<std::string, std::pair<int, int>>& module_quant) {
  std::map<std::pair<int, int>, int> count;
  for (const auto& [module, bg] : module_quant) ++count[bg];
  std::pair<int, int> global{0, 0};
  for (const auto& [bg, n] : count)
    if (global.first == 0 || n > count[global]) global = bg;
  json q = {{"group_size", global.second}, {"bits", global.first}};
  for (const auto& [module, bg] : module_quant)
    if (bg != global) q[module] = {{"group_size", bg.second}, {"bits", bg.first}};
  return q;
}

}  // namespace

bool is_gguf_path(const std::filesystem::path& path) {
  return path.extension() == ".gguf" && regular_file_exists(path);
}

// One pass over the file: the tensors, then the keys every family shares, then the keys of the
// family's row.
GgufCheckpoint read_gguf_checkpoint(const GgufFile& g) {
  const std::string where = g.path().string();
  const std::string arch_name = g.get_string("general.architecture");
  const std::string A = arch_name + ".";
  const FamilyFormats* family = family_formats_of_gguf_arch(arch_name, g.has(A + "attention.sliding_window"));
  if (!family)
    throw Unsupported(where + ": general.architecture \"" + arch_name + "\" is not supported (supported: " +
                      gguf_archs_supported() + ")");
  if (g.has(A + "expert_count") && g.get_uint(A + "expert_count") > 0)
    throw Unsupported(where + ": " + A + "expert_count is " + std::to_string(g.get_uint(A + "expert_count")) +
                      ": GGUF files of a mixture of experts are not read yet (load the safetensors checkpoint)");

  GgufReadTensors tensors = gguf_read_tensors(g, family->sandwich_norms);
  const GgufTensorInfo* embd = g.tensor("token_embd.weight");
  if (!embd || embd->shape.n != 2) throw InvalidInput(where + ": missing the 2-D tensor token_embd.weight");

  // Every layer has tensors: a block count past the tensor count is refused before anything
  // is sized by it.
  const uint64_t block_count = g.get_uint(A + "block_count");
  if (block_count == 0 || block_count > g.tensors().size())
    throw InvalidInput(where + ": " + A + "block_count is " + std::to_string(block_count) + ", but the file holds " +
                       std::to_string(g.tensors().size()) + " tensors");

  json c = json::object();
  c["model_type"] = family->model_type;
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

  const json rope = gguf_read_rope(g, A, *family, tensors.rope_factors);
  gguf_read_family_keys(g, A, *family, rope, int64_t(block_count), c);

  // Special tokens: eos, and the end-of-turn token, which ends a reply too.
  json eos = json::array();
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"})
    if (g.has(key)) eos.push_back(g.get_uint(key));
  if (!eos.empty()) c["eos_token_id"] = eos;
  if (g.has("tokenizer.ggml.bos_token_id")) c["bos_token_id"] = g.get_uint("tokenizer.ggml.bos_token_id");

  if (!tensors.module_quant.empty()) {
    c["quantization"] = gguf_quantization(tensors.module_quant);
    // Each module's method is its block type's (formats/quant_gguf.h).
    c["quantization"]["gguf_types"] = tensors.module_types;
  }

  if (!tensors.converted.empty()) {
    std::string what;
    for (const auto& [how, n] : tensors.converted) what += (what.empty() ? "" : ", ") + std::to_string(n) + " " + how;
    log_info(where + ": quantized tensors converted at load (docs/gguf.md): " + what);
  }

  return GgufCheckpoint{ConfigReader(std::move(c), where + " (GGUF metadata)"),
                        SafeTensors::adopt(g.path(), std::move(tensors.buffers), std::move(tensors.infos),
                                            family->gguf_layout)};
}

}  // namespace osprey
