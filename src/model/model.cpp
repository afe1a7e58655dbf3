#include "model/model.h"

#include <algorithm>

#include "backend/ops.h"
#include "core/error.h"

namespace osprey {

namespace {

// positions_in, or cache.offset() .. + n - 1 on `device` when undefined; checked against n.
Array step_positions(const Array& positions_in, int64_t n, int64_t pos0, const Device& device) {
  Array positions = positions_in;
  if (!positions.defined()) {
    positions = Array::empty({n}, DType::i32);
    for (int64_t i = 0; i < n; ++i) positions.data<int32_t>()[i] = int32_t(pos0 + i);
    positions = ops::to_device(positions, device);
  } else if (positions.numel() != n || !(positions.device() == device)) {
    throw InvalidInput("forward: positions " + describe(positions) + " do not match " + std::to_string(n) +
                       " tokens on " + device.str());
  }
  return positions;
}

}  // namespace

Array Model::forward(const Array& tokens, const Array& positions_in, SequenceCache& cache, bool all_logits) {
  const int64_t n = tokens.numel();
  if (n <= 0) throw InvalidInput("forward: no tokens");
  if (info_.embedding_only)
    throw Unsupported(info_.model_type + " checkpoint is a bare base model (no lm_head: an embedding model); it "
                      "gives hidden states (POST /v1/embeddings), not logits");
  const Array positions = step_positions(positions_in, n, cache.offset(), info_.device);
  return forward_tokens(ops::to_device(tokens, info_.device), positions, cache, all_logits);
}

Array Model::forward(const Array& tokens_in, SequenceCache& cache, bool all_logits, std::span<const ImageSpan> images) {
  const int64_t n = tokens_in.numel(), p0 = cache.offset();
  if (n <= 0) throw InvalidInput("forward: no tokens");
  std::vector<ImageSpan> inside;
  for (const ImageSpan& s : images) {
    const int64_t len = s.embeds.defined() ? s.embeds.dim(0) : 0;
    if (len <= 0 || s.embeds.ndim() != 2 || s.embeds.dim(1) != info_.hidden_size || s.embeds.dtype() != DType::f32)
      throw InvalidInput("forward: an image's soft tokens must be float32 [n, " + std::to_string(info_.hidden_size) +
                         "], got " + (s.embeds.defined() ? describe(s.embeds) : std::string("none")));
    if (s.pos0 + len <= p0 || s.pos0 >= p0 + n) continue;
    if (s.pos0 < p0 || s.pos0 + len > p0 + n)
      throw InvalidInput("forward: the image at positions [" + std::to_string(s.pos0) + ", " +
                         std::to_string(s.pos0 + len) + ") is split by a pass over [" + std::to_string(p0) + ", " +
                         std::to_string(p0 + n) + "): an image's tokens go in one pass");
    if (!inside.empty() && s.pos0 < inside.back().pos0 + inside.back().embeds.dim(0))
      throw InvalidInput("forward: image spans overlap or are out of order");
    inside.push_back(s);
  }
  if (inside.empty()) return forward(tokens_in, cache, all_logits);
  // The image rows' ids are never embedded (an image token id may lie outside the vocabulary,
  // as transformers allows): 0 in their place, in a host copy.
  Array tokens = ops::cast(ops::to_host(tokens_in), DType::i32);
  for (const ImageSpan& s : inside)
    std::fill(tokens.data<int32_t>() + (s.pos0 - p0), tokens.data<int32_t>() + (s.pos0 - p0 + s.embeds.dim(0)), 0);
  const Array positions = step_positions(Array(), n, p0, info_.device);
  return forward_images(ops::to_device(tokens, info_.device), positions, cache, all_logits, inside);
}

Array Model::forward_images(const Array&, const Array&, SequenceCache&, bool, std::span<const ImageSpan>) {
  throw Unsupported(info_.model_type + " takes no image input (a text-only model)");
}

Array Model::forward_hidden(const Array& tokens, SequenceCache& cache) {
  const int64_t n = tokens.numel();
  if (n <= 0) throw InvalidInput("forward_hidden: no tokens");
  const Array positions = step_positions(Array(), n, cache.offset(), info_.device);
  return hidden_tokens(ops::to_device(tokens, info_.device), positions, cache);
}

Array Model::hidden_tokens(const Array&, const Array&, SequenceCache&) {
  throw Unsupported("hidden states (embeddings) are not available from a " + info_.model_type + " model here");
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
