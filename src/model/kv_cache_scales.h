#pragma once
// A checkpoint's own scales for an fp8 KV cache: the k_scale / v_scale tensors that
// llm-compressor (compressed-tensors' kv_cache_scheme), ModelOpt and FP8 checkpoints store per
// attention layer, one per tensor or one per kv head. A key is stored as e4m3(k / k_scale), a
// value as e4m3(v / v_scale) (saturating at 448), and reads back as scale * e4m3. With
// --cache-type-k / -v fp8 they are the layer's fixed scales (KVCacheParams::k_scales,
// v_scales) in place of each row's own amax / 448; another cache type does not use them (the
// load log says so).
//
// Tensor names, per layer N under the decoder's prefix, the first form of each side found:
//   layers.N.self_attn.k_scale          layers.N.self_attn.v_scale          (compressed-tensors, FP8)
//   layers.N.self_attn.k_proj.k_scale   layers.N.self_attn.v_proj.v_scale   (ModelOpt)
//   layers.N.self_attn.k_proj.output_scale  .v_proj.output_scale            (compressed-tensors' raw form)
//   layers.N.self_attn.kv_scale         (older files: one scale for both)
#include <cstdint>
#include <string>
#include <vector>

#include "kv/kv_cache.h"

namespace osprey {

class ConfigReader;
class SafeTensors;
class WeightLoader;

// What config.json declares: quantization_config.kv_cache_scheme ({"num_bits": 8, "type":
// "float", "dynamic": false, "strategy": "tensor" or "attn_head"}) or kv_cache_quant_algo
// "FP8" (ModelOpt's form in config.json).
struct KVCacheScheme {
  bool declared = false;
  std::string where;  // the declaring field, for errors
};

// Unsupported, naming the field, for a scheme Osprey does not read (integer, dynamic,
// per-channel scales, another width); InvalidInput for a malformed one.
KVCacheScheme parse_kv_cache_scheme(const ConfigReader& config);

// One layer's scales, this rank's kv heads: one value (every head), or one per kv head.
struct LayerKVScales {
  std::vector<float> k, v;
};

struct KVScaleLayout {
  std::string prefix;  // the decoder's tensor prefix ("model.")
  int64_t n_layers = 0;
  int64_t n_kv_heads = 0;  // the checkpoint's
  int64_t kv_head0 = 0, n_local_kv_heads = 0;  // this rank's heads (tensor parallelism)
};

// The scales of every layer, the tensors marked read in `w`; empty when the checkpoint has none
// and declares none. InvalidInput naming the tensor for a declared scheme without them, a layer
// without them while others have them, a key scale without its value scale, two forms of one
// scale, or a malformed one (not a float tensor, neither 1 nor n_kv_heads values, not finite
// and > 0).
std::vector<LayerKVScales> read_kv_cache_scales(WeightLoader& w, const SafeTensors& st, const KVCacheScheme& scheme,
                                                const KVScaleLayout& layout);

// params' k_scales / v_scales from `s` for each side whose type is fp8_e4m3; the others none.
void apply_kv_cache_scales(KVCacheParams& params, const LayerKVScales& s);

}  // namespace osprey
