#include "model/model.h"

#include "backend/ops.h"
#include "core/error.h"

namespace osprey {

Array Model::forward(const Array& tokens, const Array& positions_in, SequenceCache& cache, bool all_logits) {
  const int64_t n = tokens.numel(), pos0 = cache.offset();
  if (n <= 0) throw InvalidInput("forward: no tokens");
  Array positions = positions_in;
  if (!positions.defined()) {
    positions = Array::empty({n}, DType::i32);
    for (int64_t i = 0; i < n; ++i) positions.data<int32_t>()[i] = int32_t(pos0 + i);
    positions = ops::to_device(positions, info_.device);
  } else if (positions.numel() != n || !(positions.device() == info_.device)) {
    throw InvalidInput("forward: positions " + describe(positions) + " do not match " + std::to_string(n) +
                       " tokens on " + info_.device.str());
  }
  return forward_tokens(ops::to_device(tokens, info_.device), positions, cache, all_logits);
}

SequenceCache Model::make_cache(const KVCacheParams& options) const {
  KVCacheParams p = options;
  p.device = info_.device;
  std::vector<std::unique_ptr<KVCache>> layers;
  for (int64_t i = 0; i < info_.n_layers; ++i) layers.push_back(make_kv_cache(layer_cache_params(i, p)));
  return SequenceCache(std::move(layers));
}

KVCacheParams Model::kv_params(int64_t layer, const KVCacheParams& options) const {
  if (layer < 0 || layer >= info_.n_layers)
    throw InvalidInput("layer " + std::to_string(layer) + " is outside [0, " + std::to_string(info_.n_layers) + ")");
  KVCacheParams p = options;
  p.device = info_.device;
  return layer_cache_params(layer, p);
}

}  // namespace osprey
