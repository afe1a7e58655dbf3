#pragma once
// Conversion of a Hugging Face safetensors checkpoint into an MLX affine-quantized one, in the
// layout mlx-lm's converter writes: `<module>.weight` (u32), `.scales`, `.biases` for every
// linear layer and embedding whose input size the group divides, everything else copied in
// the chosen dtype, config.json with "quantization" and "quantization_config", and shards of
// at most `shard_bytes` with model.safetensors.index.json. `osprey convert` is its front end.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "formats/safetensors.h"

namespace osprey {

class ConfigReader;

// One source tensor and what becomes of it.
struct ConvertStep {
  std::string source;
  bool quantize = false;
  std::vector<TensorSpec> outputs;  // quantized: weight, scales, biases; else the one copy
  size_t nbytes() const {
    size_t n = 0;
    for (const auto& o : outputs) n += o.nbytes();
    return n;
  }
};

struct ConvertPlan {
  std::vector<ConvertStep> steps;           // in the source's order
  std::vector<std::vector<size_t>> shards;  // indices into steps, in order, one list per output file
  size_t total_bytes = 0;                   // of all outputs
};

// What becomes of each tensor of `st`, and the output files: shards in order, each at most
// shard_bytes (a larger single tensor gets a shard of its own). Rotary inv_freq buffers are
// dropped (recomputed from the config). Throws InvalidInput for unsupported bits or group size.
ConvertPlan plan_conversion(const SafeTensors& st, int bits, int group_size, DType dtype, size_t shard_bytes);

// The dtype for the scales and dense tensors when none is asked for: the source's 16-bit float
// type, or bfloat16 for a float32 checkpoint.
DType default_convert_dtype(const SafeTensors& st);

// The file name of shard i of n ("model.safetensors" when n == 1).
std::string shard_file_name(size_t i, size_t n);

// What convert writes: MLX affine (above), or FP8 e4m3 in the compressed-tensors layout of the
// hub's "-FP8-dynamic" checkpoints: every 2-D `.weight` but the embeddings and lm_head becomes
// F8_E4M3 [out, in] with `.weight_scale` [out, 1] (one scale per output row, in `dtype`;
// formats/hub_quant.h's quantize_fp8_rows), activations dynamic per token, lm_head in "ignore".
enum class ConvertTarget { mlx, fp8 };

// The FP8 counterpart of plan_conversion (bits and group size do not apply).
ConvertPlan plan_fp8_conversion(const SafeTensors& st, DType dtype, size_t shard_bytes);

struct ConvertParams {
  ConvertTarget target = ConvertTarget::mlx;
  int bits = 4;
  int group_size = 64;
  std::optional<DType> dtype;  // default_convert_dtype when not set
  // fp8: declare FP8 activations quantized per token at run time (W8A8), or none (weights-only
  // FP8: activations stay 16-bit, "input_activations": null).
  bool fp8_activations = true;
  size_t shard_bytes = size_t(5120) << 20;
  std::function<void(size_t, size_t)> progress;  // (source bytes done, total), per tensor
};

struct ConvertSummary {
  size_t n_quantized = 0, n_dense = 0, bytes = 0, n_files = 0;
  DType dtype = DType::bf16;
};

// Throws InvalidInput when the checkpoint in `src` (its config and tensors) is already quantized.
void check_not_quantized(const std::filesystem::path& src, const ConfigReader& config, const SafeTensors& st);

// Converts the checkpoint in `src` into the existing, empty folder `dst` (safetensors,
// config.json, and the tokenizer and generation files copied). Throws InvalidInput for an
// already quantized source; IoError when a file cannot be read or written. On an error,
// `dst` may hold partial files.
ConvertSummary convert_checkpoint(const std::filesystem::path& src, const std::filesystem::path& dst,
                                  const ConvertParams& params);

}  // namespace osprey
