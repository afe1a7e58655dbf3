#include "formats/gguf_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#include "core/half.h"
#include "formats/config_reader.h"
#include "formats/convert.h"
#include "formats/family_formats.h"
#include "formats/gguf_blocks.h"
#include "formats/gguf_names.h"
#include "formats/safetensors.h"

namespace osprey {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kAlignment = 32;

// ggml's nearest_int: round half to even (the default rounding mode).
int nearest_int(float v) { return int(std::nearbyint(v)); }

// make_qkx2_quants of ggml-quants.c (nmin -1, delta 0.1, 20 steps, squared error): the scale
// and minimum of one 32-value sub-block and its codes in [0, nmax].
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                       uint8_t* Laux, float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0], sum_w = weights[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, uint8_t(0));
    *the_min = -min;
    return 0.f;
  }
  float iscale = float(nmax) / (max - min), scale = 1 / iscale, best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = uint8_t(std::max(0, std::min(nmax, l)));
    const float diff = scale * float(L[i]) + min - x[i];
    best_error += weights[i] * (diff * diff);
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * float(is) + float(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min))));
      Laux[i] = uint8_t(l);
      const float w = weights[i];
      sum_l += w * float(l);
      sum_l2 += w * float(l) * float(l);
      sum_xl += w * float(l) * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float mad = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * float(Laux[i]) + this_min - x[i];
        mad += weights[i] * (diff * diff);
      }
      if (mad < best_error) {
        std::copy(Laux, Laux + n, L);
        best_error = mad;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

}  // namespace

std::optional<GgufOutType> parse_gguf_outtype(std::string_view name) {
  if (name == "f16") return GgufOutType::f16;
  if (name == "bf16") return GgufOutType::bf16;
  if (name == "q8_0") return GgufOutType::q8_0;
  if (name == "q4_0") return GgufOutType::q4_0;
  if (name == "q4_k") return GgufOutType::q4_k;
  return std::nullopt;
}

void gguf_quantize_q8_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n; b += 32, out += 34) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b + j]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    const uint16_t dh = f32_to_f16(d);
    std::memcpy(out, &dh, 2);
    for (int j = 0; j < 32; ++j) out[2 + j] = uint8_t(int8_t(std::round(x[b + j] * id)));
  }
}

void gguf_quantize_q4_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n; b += 32, out += 18) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j)
      if (amax < std::fabs(x[b + j])) amax = std::fabs(x[b + j]), max = x[b + j];
    const float d = max / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
    const uint16_t dh = f32_to_f16(d);
    std::memcpy(out, &dh, 2);
    for (int j = 0; j < 16; ++j) {
      const float x0 = x[b + j] * id, x1 = x[b + 16 + j] * id;
      const uint8_t q0 = uint8_t(std::min(15, int(int8_t(x0 + 8.5f))));
      const uint8_t q1 = uint8_t(std::min(15, int(int8_t(x1 + 8.5f))));
      out[2 + j] = uint8_t(q0 | (q1 << 4));
    }
  }
}

void gguf_quantize_q4_k(const float* x, int64_t n, uint8_t* out) {
  uint8_t L[256], Laux[32];
  float weights[32], mins[8], scales[8];
  for (int64_t b = 0; b < n; b += 256, out += 144, x += 256) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      float sum_x2 = 0;
      for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
      const float av_x = std::sqrt(sum_x2 / 32);
      for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
      scales[j] = make_qkx2_quants(32, 15, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -1.f, 0.1f, 20);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f, inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t* sc = out + 4;
    std::memset(sc, 0, 12);
    for (int j = 0; j < 8; ++j) {
      const uint8_t ls = uint8_t(std::min(63, nearest_int(inv_scale * scales[j])));
      const uint8_t lm = uint8_t(std::min(63, nearest_int(inv_min * mins[j])));
      if (j < 4) {
        sc[j] = ls;
        sc[j + 4] = lm;
      } else {
        sc[j + 4] = uint8_t((ls & 0xF) | ((lm & 0xF) << 4));
        sc[j - 4] |= uint8_t((ls >> 4) << 6);
        sc[j] |= uint8_t((lm >> 4) << 6);
      }
    }
    const uint16_t dh = f32_to_f16(max_scale / 63.f), mh = f32_to_f16(max_min / 63.f);
    std::memcpy(out, &dh, 2);
    std::memcpy(out + 2, &mh, 2);
    for (int j = 0; j < 8; ++j) {
      uint8_t s, m;
      gguf_k_scale_min(sc, j, s, m);
      const float d = f16_to_f32(dh) * float(s);
      if (d == 0) continue;
      const float dm = f16_to_f32(mh) * float(m);
      for (int ii = 0; ii < 32; ++ii)
        L[32 * j + ii] = uint8_t(std::max(0, std::min(15, nearest_int((x[32 * j + ii] + dm) / d))));
    }
    uint8_t* q = out + 16;
    for (int j = 0; j < 256; j += 64, q += 32)
      for (int l = 0; l < 32; ++l) q[l] = uint8_t(L[j + l] | (L[j + l + 32] << 4));
  }
}

namespace {

// A metadata section under construction: the pairs, serialized as GGUF v3 stores them.
class GgufKv {
 public:
  void u32(const std::string& k, uint64_t v) { head(k, GgufValueType::u32), put<uint32_t>(uint32_t(v)); }
  void f32(const std::string& k, double v) { head(k, GgufValueType::f32), put<float>(float(v)); }
  void boolean(const std::string& k, bool v) { head(k, GgufValueType::boolean), put<uint8_t>(v ? 1 : 0); }
  void str(const std::string& k, const std::string& v) { head(k, GgufValueType::string), string(v); }
  void strings(const std::string& k, const std::vector<std::string>& v) {
    head(k, GgufValueType::array), put<uint32_t>(uint32_t(GgufValueType::string)), put<uint64_t>(v.size());
    for (const std::string& x : v) string(x);
  }
  void i32s(const std::string& k, const std::vector<int32_t>& v) {
    head(k, GgufValueType::array), put<uint32_t>(uint32_t(GgufValueType::i32)), put<uint64_t>(v.size());
    for (int32_t x : v) put<int32_t>(x);
  }
  void f32s(const std::string& k, const std::vector<float>& v) {
    head(k, GgufValueType::array), put<uint32_t>(uint32_t(GgufValueType::f32)), put<uint64_t>(v.size());
    for (float x : v) put<float>(x);
  }
  void bools(const std::string& k, const std::vector<bool>& v) {
    head(k, GgufValueType::array), put<uint32_t>(uint32_t(GgufValueType::boolean)), put<uint64_t>(v.size());
    for (bool b : v) put<uint8_t>(b ? 1 : 0);
  }
  void string(const std::string& s) {
    put<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  std::vector<uint8_t> bytes;
  uint64_t count = 0;

 private:
  void head(const std::string& k, GgufValueType t) {
    string(k);
    put<uint32_t>(uint32_t(t));
    ++count;
  }
};

// convert_hf_to_gguf's permute(): each head's rows, halves (i, i + d/2), to interleaved pairs.
Array permute_rows(const Array& w, int64_t n_head) {
  const int64_t rows = w.shape()[0], cols = w.shape()[1], d = rows / n_head;
  Array out = Array::empty(w.shape(), DType::f32);
  const float* s = w.data<float>();
  float* o = out.data<float>();
  int64_t r_out = 0;
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t j = 0; j < d / 2; ++j)
      for (int64_t half = 0; half < 2; ++half, ++r_out)
        std::memcpy(o + r_out * cols, s + (h * d + half * (d / 2) + j) * cols, size_t(cols) * 4);
  return out;
}

// convert_hf_to_gguf's Llama 3 rope_freqs: one factor per rotary frequency.
std::vector<float> llama3_rope_factors(const json& rope, int64_t head_dim) {
  const double base = rope.at("rope_theta").get<double>(), factor = rope.at("factor").get<double>();
  const double low = rope.at("low_freq_factor").get<double>(), high = rope.at("high_freq_factor").get<double>();
  const double old = rope.at("original_max_position_embeddings").get<double>();
  const double low_wavelen = old / low, high_wavelen = old / high;
  std::vector<float> out;
  for (int64_t i = 0; i < head_dim; i += 2) {
    const float freq = float(1.0 / std::pow(base, double(float(double(i) / double(head_dim)))));
    const double wavelen = 2 * M_PI / double(freq);
    if (wavelen < high_wavelen) out.push_back(1.0f);
    else if (wavelen > low_wavelen) out.push_back(float(factor));
    else {
      const double smooth = (old / wavelen - low) / (high - low);
      out.push_back(float(1 / ((1 - smooth) / factor + smooth)));
    }
  }
  return out;
}

struct OutTensor {
  std::string source, name;
  GgufType type = GgufType::F32;
  Shape shape;
  std::vector<uint8_t> data;
};

GgufType matrix_type(GgufOutType t, const std::string& name, int64_t cols) {
  const bool embd_or_output = name == "token_embd.weight" || name == "output.weight";
  switch (t) {
    case GgufOutType::f16: return GgufType::F16;
    case GgufOutType::bf16: return GgufType::BF16;
    case GgufOutType::q8_0: return cols % 32 == 0 ? GgufType::Q8_0 : GgufType::F16;
    case GgufOutType::q4_0: return cols % 32 == 0 && !embd_or_output ? GgufType::Q4_0 : GgufType::F16;
    case GgufOutType::q4_k:
      if (embd_or_output) return GgufType::F16;
      return cols % 256 == 0 ? GgufType::Q4_K : cols % 32 == 0 ? GgufType::Q4_0 : GgufType::F16;
  }
  return GgufType::F16;
}

std::vector<uint8_t> encode(const Array& w, GgufType type) {
  const float* x = w.data<float>();
  const int64_t n = w.numel();
  std::vector<uint8_t> out;
  if (type == GgufType::F32) {
    out.resize(size_t(n) * 4);
    std::memcpy(out.data(), x, out.size());
  } else if (type == GgufType::F16) {
    out.resize(size_t(n) * 2);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = f32_to_f16(x[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  } else if (type == GgufType::BF16) {
    out.resize(size_t(n) * 2);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = f32_to_bf16(x[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  } else {
    const GgufBlock b = *gguf_block(uint32_t(type));
    out.resize(size_t(n / b.elements * b.bytes));
    if (type == GgufType::Q8_0) gguf_quantize_q8_0(x, n, out.data());
    else if (type == GgufType::Q4_0) gguf_quantize_q4_0(x, n, out.data());
    else gguf_quantize_q4_k(x, n, out.data());
  }
  return out;
}

uint32_t file_type(GgufOutType t) {
  switch (t) {
    case GgufOutType::f16: return 1;   // MOSTLY_F16
    case GgufOutType::bf16: return 32; // MOSTLY_BF16
    case GgufOutType::q8_0: return 7;  // MOSTLY_Q8_0
    case GgufOutType::q4_0: return 2;  // MOSTLY_Q4_0
    case GgufOutType::q4_k: return 15; // MOSTLY_Q4_K_M
  }
  return 1;
}

// The hyperparameters llama.cpp reads for `arch` from the Hugging Face config.
// NOTE: one function past the usual length: the keys read best in one list, arch by arch.
void write_hparams(GgufKv& kv, const ConfigReader& c, const FamilyFormats& family, GgufOutType t,
                   const std::string& name, std::vector<float>& rope_freqs) {
  const std::string arch = family.gguf_arch;
  const std::string A = arch + ".";
  const int64_t n_head = c.get_int("num_attention_heads"), hidden = c.get_int("hidden_size");
  const int64_t head_dim = c.get_int("head_dim", hidden / std::max<int64_t>(n_head, 1));
  json rope = c.has("rope_parameters") ? c.json().at("rope_parameters") : json::object();
  json local = json::object();
  if (rope.contains("full_attention")) {
    local = rope.value("sliding_attention", json::object());
    rope = rope.at("full_attention");
  }
  if (!rope.contains("rope_theta") && c.has("rope_theta")) rope["rope_theta"] = c.get_float("rope_theta");
  if (c.has("rope_scaling") && c.json().at("rope_scaling").is_object())
    for (const auto& [k, v] : c.json().at("rope_scaling").items()) rope[k] = v;
  const std::string rope_type = rope.value("rope_type", rope.value("type", std::string("default")));

  kv.str("general.architecture", arch);
  kv.str("general.name", name);
  kv.u32("general.file_type", file_type(t));
  kv.u32("general.quantization_version", 2);
  kv.u32(A + "vocab_size", uint64_t(c.get_int("vocab_size")));
  kv.u32(A + "context_length", uint64_t(c.get_int("max_position_embeddings")));
  kv.u32(A + "embedding_length", uint64_t(hidden));
  kv.u32(A + "feed_forward_length", uint64_t(c.get_int("intermediate_size")));
  kv.u32(A + "block_count", uint64_t(c.get_int("num_hidden_layers")));
  kv.u32(A + "attention.head_count", uint64_t(n_head));
  kv.u32(A + "attention.head_count_kv", uint64_t(c.get_int("num_key_value_heads", n_head)));
  kv.u32(A + "attention.key_length", uint64_t(head_dim));
  kv.u32(A + "attention.value_length", uint64_t(head_dim));
  kv.u32(A + "rope.dimension_count", uint64_t(head_dim));
  kv.f32(A + "rope.freq_base", rope.value("rope_theta", family.gguf_rope_theta));
  if (family.layer_norm)
    kv.f32(A + "attention.layer_norm_epsilon", c.get_float("layer_norm_eps"));
  else
    kv.f32(A + "attention.layer_norm_rms_epsilon", c.get_float("rms_norm_eps"));
  if (family.logit_scale) kv.f32(A + "logit_scale", c.get_float("logit_scale", 1.0));
  if (rope_type == "linear") {
    kv.str(A + "rope.scaling.type", "linear");
    kv.f32(A + "rope.scaling.factor", rope.at("factor").get<double>());
  } else if (rope_type == "llama3" && family.rope_freqs) {
    rope_freqs = llama3_rope_factors(rope, head_dim);
  } else if (rope_type != "default") {
    throw Unsupported(c.where() + ": rope type \"" + rope_type +
                      "\" is not written to GGUF (default, linear, and llama3 for Llama are)");
  }
  if (family.window != GgufWindow::none && c.has("sliding_window"))
    kv.u32(A + "attention.sliding_window", uint64_t(c.get_int("sliding_window")));
  if (family.window == GgufWindow::pattern && c.has("layer_types")) {
    std::vector<bool> pattern;
    for (const std::string& lt : c.get_string_list("layer_types")) pattern.push_back(lt == "sliding_attention");
    kv.bools(A + "attention.sliding_window_pattern", pattern);
  }
  if (family.attention_scale)
    kv.f32(A + "attention.scale", std::pow(c.get_float("query_pre_attn_scalar", double(head_dim)), -0.5));
  if (family.local_rope_base) kv.f32(A + "rope.freq_base_swa", local.value("rope_theta", 10000.0));
  if (family.softcapping) {
    if (c.has("final_logit_softcapping"))
      kv.f32(A + "final_logit_softcapping", c.get_float("final_logit_softcapping"));
    if (c.has("attn_logit_softcapping")) kv.f32(A + "attn_logit_softcapping", c.get_float("attn_logit_softcapping"));
  }
}

// Special ids and the chat template, from config.json and tokenizer_config.json.
void write_specials(GgufKv& kv, const fs::path& src, const ConfigReader& c) {
  auto first_id = [](const json& v) -> std::optional<uint64_t> {
    if (v.is_number_unsigned()) return v.get<uint64_t>();
    if (v.is_array() && !v.empty() && v[0].is_number_unsigned()) return v[0].get<uint64_t>();
    return std::nullopt;
  };
  if (c.has("bos_token_id"))
    if (auto id = first_id(c.json().at("bos_token_id"))) kv.u32("tokenizer.ggml.bos_token_id", *id);
  if (c.has("eos_token_id"))
    if (auto id = first_id(c.json().at("eos_token_id"))) kv.u32("tokenizer.ggml.eos_token_id", *id);
  if (c.has("pad_token_id"))
    if (auto id = first_id(c.json().at("pad_token_id"))) kv.u32("tokenizer.ggml.padding_token_id", *id);
  const fs::path tc = src / "tokenizer_config.json";
  std::error_code ec;
  if (!fs::exists(tc, ec)) return;
  const ConfigReader t = ConfigReader::load(tc);
  if (t.has("add_bos_token")) kv.boolean("tokenizer.ggml.add_bos_token", t.get_bool("add_bos_token", false));
  if (t.has("add_eos_token")) kv.boolean("tokenizer.ggml.add_eos_token", t.get_bool("add_eos_token", false));
  if (t.has("chat_template") && t.json().at("chat_template").is_string())
    kv.str("tokenizer.chat_template", t.get_string("chat_template"));
}

// A BPE tokenizer.json as convert_hf_to_gguf.py writes it: tokens by id, token types (special
// added tokens control, other added tokens user-defined, ids no token holds unused), and
//  - byte-level BPE (tokenizer.ggml.model gpt2): tokenizer.ggml.pre and the merges;
//  - SentencePiece BPE (byte_fallback, as Gemma's; tokenizer.ggml.model llama): <unk> unknown,
//    <0xXX> pieces byte, and scores. The converter reads those from tokenizer.model, which
//    Hugging Face folders need not hold; here a piece's score is minus the rank of the first
//    merge that forms it (0 for a piece no merge forms), so that merging by score, as
//    llama.cpp and Osprey's GGUF reader do, applies the merges in tokenizer.json's order.
// False when there is no tokenizer.json or the family has no byte-level pre-tokenizer name.
bool write_bpe_vocab(GgufKv& kv, const fs::path& src, const FamilyFormats& family) {
  const fs::path path = src / "tokenizer.json";
  std::error_code ec;
  if (!fs::exists(path, ec)) return false;
  const json tj = ConfigReader::load(path).json();
  const json& m = tj.at("model");
  if (m.value("type", std::string()) != "BPE" || !m.contains("vocab") || !m.contains("merges"))
    throw Unsupported(path.string() + ": model.type is not a BPE with vocab and merges");
  const bool spm = m.value("byte_fallback", false);
  const char* pre = family.gguf_pre;
  if (!spm && !pre) return false;
  std::map<int64_t, std::pair<std::string, int32_t>> by_id;
  for (const auto& [text, id] : m.at("vocab").items()) by_id[id.get<int64_t>()] = {text, 1};
  for (const auto& a : tj.value("added_tokens", json::array()))
    by_id[a.at("id").get<int64_t>()] = {a.at("content").get<std::string>(), a.value("special", false) ? 3 : 4};
  if (by_id.empty() || by_id.begin()->first < 0) throw InvalidInput(path.string() + ": no tokens, or a negative id");
  const int64_t n = by_id.rbegin()->first + 1;
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int64_t i = 0; i < n; ++i) {
    auto it = by_id.find(i);
    tokens.push_back(it == by_id.end() ? "[PAD" + std::to_string(i) + "]" : it->second.first);
    types.push_back(it == by_id.end() ? 5 : it->second.second);
  }
  if (spm) {
    std::map<std::string, int64_t> id_of;
    for (int64_t i = 0; i < n; ++i)
      if (types[size_t(i)] != 5) id_of.emplace(tokens[size_t(i)], i);
    const std::string unk = m.value("unk_token", std::string());
    for (int64_t i = 0; i < n; ++i) {
      const std::string& t = tokens[size_t(i)];
      if (!unk.empty() && t == unk) types[size_t(i)] = 2;
      if (t.size() == 6 && t.rfind("<0x", 0) == 0 && t[5] == '>') types[size_t(i)] = 6;
    }
    std::vector<float> scores(size_t(n), 0.0f);
    std::vector<bool> formed(size_t(n), false);
    const json& pairs = m.at("merges");
    for (size_t r = 0; r < pairs.size(); ++r) {
      const json& x = pairs[r];
      std::string whole;
      if (x.is_string()) {
        const std::string s = x.get<std::string>();
        const size_t sp = s.find(' ');
        whole = sp == std::string::npos ? std::string() : s.substr(0, sp) + s.substr(sp + 1);
      } else {
        whole = x.at(0).get<std::string>() + x.at(1).get<std::string>();
      }
      const auto it = id_of.find(whole);
      if (it == id_of.end())
        throw InvalidInput(path.string() + ": merge " + std::to_string(r) + " (" + x.dump() +
                           ") forms no token of the vocabulary");
      if (!formed[size_t(it->second)]) formed[size_t(it->second)] = true, scores[size_t(it->second)] = -float(r + 1);
    }
    // A dummy prefix is a Prepend of U+2581 in the normalizer (Gemma 3 has none).
    const std::string norm = tj.value("normalizer", json()).dump();
    kv.str("tokenizer.ggml.model", "llama");
    kv.strings("tokenizer.ggml.tokens", tokens);
    kv.f32s("tokenizer.ggml.scores", scores);
    kv.i32s("tokenizer.ggml.token_type", types);
    kv.boolean("tokenizer.ggml.add_space_prefix", norm.find("\"Prepend\"") != std::string::npos);
    return true;
  }
  std::vector<std::string> merges;
  for (const auto& x : m.at("merges"))
    merges.push_back(x.is_string() ? x.get<std::string>() : x.at(0).get<std::string>() + " " + x.at(1).get<std::string>());
  kv.str("tokenizer.ggml.model", "gpt2");
  kv.str("tokenizer.ggml.pre", pre);
  kv.strings("tokenizer.ggml.tokens", tokens);
  kv.i32s("tokenizer.ggml.token_type", types);
  kv.strings("tokenizer.ggml.merges", merges);
  return true;
}

void write_all(std::ofstream& f, const void* p, size_t n, const fs::path& dst) {
  f.write(static_cast<const char*>(p), std::streamsize(n));
  if (!f) throw IoError(dst.string() + ": write failed");
}

}  // namespace

GgufConvertSummary convert_to_gguf(const fs::path& src, const fs::path& dst, GgufOutType type,
                                   const std::function<void(size_t, size_t)>& progress) {
  const ConfigReader config = ConfigReader::load(src / "config.json");
  const std::string model_type = config.get_string("model_type");
  const FamilyFormats* family = family_formats(model_type);
  if (!family || !family->gguf_arch)
    throw Unsupported(config.where() + ": model_type \"" + model_type + "\" is not written to GGUF (" +
                      (family && family->no_gguf_because ? std::string(family->no_gguf_because) + "; " : "") +
                      "supported: " + gguf_model_types_supported() + ")");
  const SafeTensors st = SafeTensors::open(src);
  check_not_quantized(src, config, st);
  const std::string a = family->gguf_arch;
  const bool interleave_qk = family->gguf_layout.qk_rows_interleaved;
  const bool fold_norm_offset = family->gguf_layout.norm_unit_offset_folded;

  GgufKv kv;
  std::vector<float> rope_freqs;
  write_hparams(kv, config, *family, type, src.filename().string(), rope_freqs);
  write_specials(kv, src, config);
  const bool vocab = write_bpe_vocab(kv, src, *family);

  // Tensor table first (names, types, shapes, offsets), so every tensor is encoded up front:
  // the checkpoints this writes fit in memory as their output does.
  std::vector<OutTensor> out;
  if (!rope_freqs.empty()) {
    OutTensor t{"", "rope_freqs.weight", GgufType::F32, Shape{int64_t(rope_freqs.size())}, {}};
    t.data.resize(rope_freqs.size() * 4);
    std::memcpy(t.data.data(), rope_freqs.data(), t.data.size());
    out.push_back(std::move(t));
  }
  const int64_t n_head = config.get_int("num_attention_heads");
  const int64_t n_kv = config.get_int("num_key_value_heads", n_head);
  const size_t total = st.total_bytes();
  size_t done = 0;
  GgufConvertSummary s;
  for (const std::string& hf : st.names()) {
    if (hf.ends_with("rotary_emb.inv_freq")) continue;
    const std::string g = gguf_tensor_name(hf, family->sandwich_norms);
    if (g.empty())
      throw Unsupported(src.string() + ": tensor " + hf + " has no llama.cpp name for architecture " + a);
    Array w = ops::cast(st.get(hf), DType::f32);
    if (!is_float(st.info(hf).dtype)) throw InvalidInput(src.string() + ": tensor " + hf + " is not a float tensor");
    if (interleave_qk && g.ends_with("attn_q.weight")) w = permute_rows(w, n_head);
    if (interleave_qk && g.ends_with("attn_k.weight")) w = permute_rows(w, n_kv);
    OutTensor t{hf, g, GgufType::F32, w.shape(), {}};
    if (w.shape().n == 1) {
      if (fold_norm_offset && hf.ends_with("norm.weight")) {
        Array c = Array::empty(w.shape(), DType::f32);
        for (int64_t i = 0; i < w.numel(); ++i) c.data<float>()[i] = w.data<float>()[i] + 1.0f;
        w = c;
      }
    } else if (w.shape().n == 2) {
      t.type = matrix_type(type, g, w.shape()[1]);
      if (t.type != GgufType::F16 && t.type != GgufType::BF16) ++s.n_quantized;
    } else {
      throw Unsupported(src.string() + ": tensor " + hf + " has " + std::to_string(w.shape().n) +
                        " dimensions (1 or 2 are written)");
    }
    t.data = encode(w, t.type);
    out.push_back(std::move(t));
    done += st.info(hf).nbytes;
    if (progress) progress(done, total);
  }

  GgufKv head;
  head.bytes = {'G', 'G', 'U', 'F'};
  head.put<uint32_t>(3);
  head.put<uint64_t>(out.size());
  head.put<uint64_t>(kv.count);
  head.bytes.insert(head.bytes.end(), kv.bytes.begin(), kv.bytes.end());
  uint64_t offset = 0;
  for (const OutTensor& t : out) {
    head.string(t.name);
    head.put<uint32_t>(uint32_t(t.shape.n));
    for (int i = t.shape.n - 1; i >= 0; --i) head.put<uint64_t>(uint64_t(t.shape[i]));  // ne[0] innermost
    head.put<uint32_t>(uint32_t(t.type));
    head.put<uint64_t>(offset);
    offset += (t.data.size() + kAlignment - 1) / kAlignment * kAlignment;
  }
  head.bytes.resize((head.bytes.size() + kAlignment - 1) / kAlignment * kAlignment, 0);

  std::ofstream f(dst, std::ios::binary | std::ios::trunc);
  if (!f) throw IoError(dst.string() + ": cannot create the file");
  write_all(f, head.bytes.data(), head.bytes.size(), dst);
  const std::vector<uint8_t> pad(kAlignment, 0);
  for (const OutTensor& t : out) {
    write_all(f, t.data.data(), t.data.size(), dst);
    write_all(f, pad.data(), (kAlignment - t.data.size() % kAlignment) % kAlignment, dst);
  }
  f.close();
  if (!f) throw IoError(dst.string() + ": write failed");
  std::error_code ec;
  s.tokenizer_left_out = !vocab && fs::exists(src / "tokenizer.json", ec);
  s.n_tensors = out.size();
  s.bytes = size_t(head.bytes.size() + offset);
  return s;
}

}  // namespace osprey
