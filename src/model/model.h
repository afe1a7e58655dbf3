#pragma once
// A loaded model: weights in device arrays made once at load, a forward pass over one
// sequence's tokens and cache, and the per-layer cache choice. Families register by
// config.json's `model_type` (see registry.cpp).
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/array.h"
#include "kv/kv_cache.h"

namespace osprey {

class SafeTensors;
class ConfigReader;

struct ModelInfo {
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t n_layers = 0;
  int64_t max_position_embeddings = 0;
  std::vector<int32_t> eos_ids;   // config.json and generation_config.json, merged
  std::optional<int32_t> bos_id;
  DType weight_dtype = DType::f32;  // of the dense weights and of the quantized weights' scales
  // MLX affine quantization: the setting covering most quantized weights ("Q4 g64"); 0 when
  // the checkpoint is not quantized.
  int quant_bits = 0;
  int quant_group_size = 0;
  Device device = Device::cpu();  // where the weights, caches and logits live
  size_t weight_bytes = 0;
  uint64_t n_params = 0;  // weights loaded (a quantized matrix counts the weights it encodes)
  // A bare base model (Qwen3Model, LlamaModel: weights without the `model.` prefix and no
  // lm_head), as embedding checkpoints ship: forward() refuses, forward_hidden() serves.
  bool embedding_only = false;
};

class Communicator;

// An image's soft tokens in a prompt (Gemma 3): the rows at positions [pos0, pos0 + n) of the
// sequence take `embeds` in place of their tokens' embeddings, and see each other in both
// directions besides what the causal (and sliding-window) mask lets them see, as
// transformers' Gemma 3 does with token_type_ids.
struct ImageSpan {
  int64_t pos0 = 0;
  Array embeds;  // [n, hidden] f32 on the model's device
};

struct LoadOptions {
  Device device = Device::cpu();
  // Tensor parallelism (docs/design.md, "Tensor parallelism"): when set, the model is one
  // rank of comm->size(), loads only its slice of the weights and meets the other ranks
  // through `comm` in every forward pass. Not owned; it outlives the model. Null: the whole
  // model.
  Communicator* comm = nullptr;
  // FP8 checkpoints: true keeps the e4m3 weights where the device runs them (half the memory of
  // bf16), false dequantizes them to bf16 at load; unset, the backend's policy decides
  // (ops::keep_fp8_weights; docs/design.md, "FP8").
  std::optional<bool> keep_fp8;
  // CPU, 4- and 8-bit weights with tiles (ops::repack_for_cpu) that only linear() reads: true
  // keeps the tiles alone (ops::keep_tiles_only: resident memory about the weights' size once,
  // not twice); false keeps their packed words too, for code that reads the weights themselves
  // (ops::dequantize).
  bool cpu_tiles_only = true;
  // Called with (bytes done, bytes total) while weights load.
  std::function<void(size_t, size_t)> progress;
};

class Model {
 public:
  virtual ~Model() = default;
  const ModelInfo& info() const { return info_; }
  // load_model merges generation_config.json's eos ids in here.
  ModelInfo& mutable_info() { return info_; }

  // tokens [n] i32 (on the CPU or the model's device) at positions cache.offset() .. + n - 1;
  // appends their K/V to `cache`. `positions`, when defined, is an i32 [n] array on the model's
  // device holding exactly those positions: the step then reads them from that array, so the
  // engine may replay it at later positions (docs/design.md, "Graph capture and replay").
  // Returns logits f32 on the model's device:
  // [n, vocab] when all_logits, else [1, vocab] for the last token only.
  Array forward(const Array& tokens, const Array& positions, SequenceCache& cache, bool all_logits);
  Array forward(const Array& tokens, SequenceCache& cache, bool all_logits) {
    return forward(tokens, Array(), cache, all_logits);
  }
  // forward() over a prompt chunk holding images: `images` (by pos0, not overlapping) lists the
  // sequence's image spans; those that meet this chunk's positions [cache.offset(), + n) must lie
  // wholly inside it (an image is never split between two calls: InvalidInput otherwise), and
  // the tokens at their positions are not embedded (any id). Throws
  // Unsupported for a model without image input.
  Array forward(const Array& tokens, SequenceCache& cache, bool all_logits, std::span<const ImageSpan> images);
  // The same pass without the head: the final-normed hidden states of every token, f32
  // [n, hidden] on the model's device (what sentence-transformers' Transformer module hands
  // to Pooling). tokens [n] i32 at positions cache.offset() .. + n - 1; appends their K/V to
  // `cache`, so a long input may come in chunks. Throws Unsupported where the model does not
  // give them (a tensor-parallel model).
  Array forward_hidden(const Array& tokens, SequenceCache& cache);
  // One cache per layer, each as the family says (layer_cache_params) from `options` (step and
  // inplace; the rest is filled in) on the model's device.
  // (A tensor-parallel model's holds every rank's layers: engine/sharded_model.h.)
  virtual SequenceCache make_cache(const KVCacheParams& options) const;
  // What layer `layer`'s cache holds (K/V heads, head size, row type, window), for caches made
  // outside make_cache (the paged pool).
  KVCacheParams kv_params(int64_t layer, const KVCacheParams& options = {}) const;
  // Whether a forward pass's work can be recorded once and replayed for later steps of the same
  // shape: the same work in the same order, decided without reading values back to the host
  // (a mixture of experts' routing does), issued from one thread (not a tensor-parallel model's
  // ranks). The engine records decode steps only then.
  virtual bool replayable_step() const { return true; }

 protected:
  // The family's forward pass: tokens [n] i32 and positions [n] i32 (cache.offset() + i), both
  // on the model's device, n >= 1. Same contract as forward() otherwise.
  virtual Array forward_tokens(const Array& tokens, const Array& positions, SequenceCache& cache,
                               bool all_logits) = 0;
  // forward()'s pass over a chunk holding images: `images`, each wholly inside the chunk (pos0
  // absolute), in order. The default throws Unsupported naming the model type.
  virtual Array forward_images(const Array& tokens, const Array& positions, SequenceCache& cache, bool all_logits,
                               std::span<const ImageSpan> images);
  // forward_hidden's pass: tokens and positions as forward_tokens'. The default throws
  // Unsupported naming the model type.
  virtual Array hidden_tokens(const Array& tokens, const Array& positions, SequenceCache& cache);
  // The cache parameters of layer `layer` (make_kv_cache picks the cache type from them);
  // `params` has step, inplace and the device set.
  virtual KVCacheParams layer_cache_params(int64_t layer, const KVCacheParams& params) const = 0;

  ModelInfo info_;
};

// Loads `dir` (config.json, safetensors, generation_config.json). Throws IoError,
// InvalidInput or Unsupported (an unknown model_type is named).
std::unique_ptr<Model> load_model(const std::filesystem::path& dir, const LoadOptions& options = {});

// Family registration: one loader per model_type.
using FamilyLoader = std::function<std::unique_ptr<Model>(const ConfigReader& config, const SafeTensors& weights,
                                                          const LoadOptions& options)>;
void register_family(const std::string& model_type, FamilyLoader loader);
std::vector<std::string> registered_families();

}  // namespace osprey
