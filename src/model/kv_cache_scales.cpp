#include "model/kv_cache_scales.h"

#include <cmath>

#include "core/error.h"
#include "core/half.h"
#include "core/log.h"
#include "formats/config_reader.h"
#include "formats/safetensors.h"
#include "model/weight_loader.h"

namespace osprey {
namespace {

// The forms of one side's scale tensor for layer prefix p ("model.layers.3."), in the order
// they are looked for; the last, kv_scale, serves both sides.
std::vector<std::string> scale_names(const std::string& p, char side) {
  const std::string s(1, side);
  return {p + "self_attn." + s + "_scale", p + "self_attn." + s + "_proj." + s + "_scale",
          p + "self_attn." + s + "_proj.output_scale", p + "self_attn.kv_scale"};
}

// The one form of a side's scale that the checkpoint has, "" when none.
std::string find_scale(const SafeTensors& st, const std::string& p, char side) {
  std::string found;
  for (const std::string& name : scale_names(p, side)) {
    if (!st.contains(name)) continue;
    if (!found.empty())
      throw InvalidInput(st.source().string() + ": both " + found + " and " + name +
                         " are in the checkpoint: one KV-cache scale per layer and side is expected");
    found = name;
  }
  return found;
}

// A scale tensor's values as f32, this rank's heads, checked.
std::vector<float> read_scale(const SafeTensors& st, const std::string& name, const KVScaleLayout& l) {
  const TensorInfo& ti = st.info(name);
  const std::string at = st.source().string() + ": " + name;
  if (ti.float8_e4m3 || (ti.dtype != DType::f32 && ti.dtype != DType::f16 && ti.dtype != DType::bf16))
    throw InvalidInput(at + " must be a float32, float16 or bfloat16 KV-cache scale, got " +
                       (ti.float8_e4m3 ? std::string("float8_e4m3") : std::string(dtype_name(ti.dtype))));
  const int64_t n = ti.shape.numel();
  if (n != 1 && n != l.n_kv_heads)
    throw InvalidInput(at + " holds " + std::to_string(n) + " values: a KV-cache scale is one value or one per kv head (" +
                       std::to_string(l.n_kv_heads) + ")");
  const Array a = st.get(name);
  std::vector<float> all(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float x = 0.0f;
    switch (ti.dtype) {
      case DType::f16: x = f16_to_f32(a.data<uint16_t>()[i]); break;
      case DType::bf16: x = bf16_to_f32(a.data<uint16_t>()[i]); break;
      default: x = a.data<float>()[i]; break;
    }
    if (!std::isfinite(x) || !(x > 0.0f))
      throw InvalidInput(at + "[" + std::to_string(i) + "] is " + std::to_string(x) +
                         ": a KV-cache scale must be finite and greater than 0");
    all[size_t(i)] = x;
  }
  if (n == 1) return all;
  return std::vector<float>(all.begin() + l.kv_head0, all.begin() + l.kv_head0 + l.n_local_kv_heads);
}

}  // namespace

KVCacheScheme parse_kv_cache_scheme(const ConfigReader& config) {
  KVCacheScheme s;
  const auto qc = config.get_object("quantization_config");
  if (!qc) return s;
  if (qc->has("kv_cache_scheme")) {
    const auto k = qc->get_object("kv_cache_scheme");
    if (!k) qc->fail("kv_cache_scheme", "expected an object or null, got " + qc->json()["kv_cache_scheme"].dump());
    s.where = k->where();
    if (k->get_int("num_bits", 8) != 8 || k->get_string("type", "float") != "float")
      throw Unsupported(s.where + ": only 8-bit float (fp8 e4m3) KV-cache scales are supported, got " + k->json().dump());
    if (k->get_bool("dynamic", false))
      throw Unsupported(s.where + ": field \"dynamic\": dynamic KV-cache scales are not supported (Osprey's fp8 cache "
                                  "takes a checkpoint's static scales, or each row's own without them)");
    const std::string strategy = k->get_string("strategy", "tensor");
    if (strategy != "tensor" && strategy != "attn_head")
      throw Unsupported(s.where + ": field \"strategy\": \"" + strategy +
                        "\" KV-cache scales are not supported (\"tensor\" or \"attn_head\")");
    s.declared = true;
  } else if (qc->has("kv_cache_quant_algo")) {
    s.where = qc->where() + ": kv_cache_quant_algo";
    const std::string algo = qc->get_string("kv_cache_quant_algo");
    if (algo != "FP8")
      throw Unsupported(s.where + ": \"" + algo + "\" KV-cache quantization is not supported (\"FP8\")");
    s.declared = true;
  }
  return s;
}

std::vector<LayerKVScales> read_kv_cache_scales(WeightLoader& w, const SafeTensors& st, const KVCacheScheme& scheme,
                                                const KVScaleLayout& l) {
  std::vector<std::string> k_names, v_names;
  int64_t with = 0, first_with = -1;
  for (int64_t i = 0; i < l.n_layers; ++i) {
    const std::string p = l.prefix + "layers." + std::to_string(i) + ".";
    k_names.push_back(find_scale(st, p, 'k'));
    v_names.push_back(find_scale(st, p, 'v'));
    if (!k_names.back().empty() || !v_names.back().empty()) {
      ++with;
      if (first_with < 0) first_with = i;
    }
  }
  const std::string layer0 = l.prefix + "layers.0.self_attn.";
  if (with == 0) {
    if (scheme.declared)
      throw InvalidInput(scheme.where + " declares fixed KV-cache scales, but " + st.source().string() + " has no " +
                         layer0 + "k_scale (nor k_proj.k_scale, k_proj.output_scale or kv_scale)");
    return {};
  }
  std::vector<LayerKVScales> out(static_cast<size_t>(l.n_layers));
  bool per_head = false;
  for (int64_t i = 0; i < l.n_layers; ++i) {
    const std::string p = l.prefix + "layers." + std::to_string(i) + ".self_attn.";
    for (char side : {'k', 'v'}) {
      const std::string& name = side == 'k' ? k_names[size_t(i)] : v_names[size_t(i)];
      if (name.empty())
        throw InvalidInput(st.source().string() + ": " + p + side + "_scale is missing (layer " +
                           std::to_string(first_with) +
                           " has KV-cache scales, and every layer's keys and values need theirs)");
      std::vector<float>& dst = side == 'k' ? out[size_t(i)].k : out[size_t(i)].v;
      dst = read_scale(st, name, l);
      per_head = per_head || st.info(name).shape.numel() > 1;
      w.ignore(name);
    }
  }
  log_info(st.source().string() + ": k_scale and v_scale of " + std::to_string(l.n_layers) + " layers (" +
           (per_head ? "per kv head" : "one per tensor") +
           "): the fixed scales of an fp8 KV cache (--cache-type-k / --cache-type-v fp8); an f16, bf16 or q8_0 cache "
           "does not use them");
  return out;
}

void apply_kv_cache_scales(KVCacheParams& params, const LayerKVScales& s) {
  params.k_scales = params.key_dtype() == DType::fp8_e4m3 ? s.k : std::vector<float>{};
  params.v_scales = params.value_dtype() == DType::fp8_e4m3 ? s.v : std::vector<float>{};
}

}  // namespace osprey
