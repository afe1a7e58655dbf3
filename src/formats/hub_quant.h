#pragma once
// The quantized checkpoint formats of the Hugging Face hub that Osprey reads by converting at
// load (docs/design.md, "Quantized weights"):
//   - AWQ (quant_method "awq", version "gemm") and GPTQ (quant_method "gptq", 4 or 8 bits,
//     desc_act with g_idx, checkpoint_format "gptq" or "gptq_v2") are repacked exactly into
//     the MLX affine layout of backend/quant.h (scale = s, bias = -s * z rounded to the
//     scales' dtype), so that the 4-bit kernels serve them;
//   - FP8 e4m3 weights (compressed-tensors, fbgemm_fp8, fp8 with block scales, ModelOpt) are
//     read as FP8 (load_fp8) or dequantized to bfloat16 (dequantize_fp8); which one, per device,
//     is the backend's policy (ops::keep_fp8_weights).
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "backend/quant.h"
#include "core/array.h"

namespace osprey {

class SafeTensors;
class ConfigReader;

enum class HubQuantMethod { none, awq, gptq, fp8 };

struct HubQuant {
  HubQuantMethod method = HubQuantMethod::none;
  std::string name;  // as the config names it ("awq", "gptq", "compressed-tensors", ...)
  std::string where;  // the config object, for errors
  // awq and gptq
  int bits = 0;
  int group_size = 0;   // -1: one group per row
  int zero_offset = 0;  // added to the stored zero points (1 for GPTQ's "gptq" checkpoint format)
  // fp8: the block of a 2-D weight_scale[_inv] ([rows, cols] of the weight per scale)
  int64_t block_rows = 128, block_cols = 128;
  // fp8: whether the checkpoint declares FP8 activations (quantized per token at run time).
  // false: weights-only FP8 (compressed-tensors "input_activations": null), whose activations
  // stay 16-bit. Declared static or per-tensor activation scales are run per token, the finer
  // scheme (the log says so).
  bool fp8_activations = true;
  std::string fp8_activation_note;  // non-empty: how the declared scheme is run, for the log

  bool present() const { return method != HubQuantMethod::none; }
};

// Reads quantization_config `c` whose "quant_method" is `method` (awq, gptq,
// compressed-tensors, fbgemm_fp8, fp8, modelopt). Unsupported (naming the field) for a
// method, version, format or scheme Osprey does not read; InvalidInput for a malformed field.
HubQuant parse_hub_quant(const ConfigReader& c, const std::string& method);
// ModelOpt's hf_quant_config.json, read from `path` (its "quantization" object).
HubQuant parse_modelopt_quant(const std::filesystem::path& path);

// An AWQ or GPTQ layer `prefix` ([out, in]) repacked into the MLX layout, on the CPU.
// `perm`, when defined (GPTQ desc_act with a non-trivial g_idx): i32 [in], input j of the
// repacked matrix is input perm[j] of the layer, so that x must be gathered by it first.
struct RepackedInt {
  QuantizedMatrix q;
  Array perm;
  std::vector<std::string> tensors;  // the checkpoint tensors it read
  size_t source_bytes = 0;
};
RepackedInt repack_int_quant(const SafeTensors& st, const HubQuant& hq, const std::string& prefix, int64_t out,
                             int64_t in, std::optional<DType> dtype);

// An FP8 layer `prefix` (`<prefix>.weight` float8_e4m3fn [out, in] with `.weight_scale` or
// `.weight_scale_inv`: one scale, one per output row, or one per block) dequantized to
// `to` (f32 | f16 | bf16), on the CPU. Errors (InvalidInput) name the tensor.
struct DequantizedFp8 {
  Array w;
  std::vector<std::string> tensors;
  size_t source_bytes = 0;
};
DequantizedFp8 dequantize_fp8(const SafeTensors& st, const HubQuant& hq, const std::string& prefix, int64_t out,
                              int64_t in, DType to);

// The same layer kept as FP8 (backend/quant.h's Fp8Matrix, on the CPU): the codes as read and
// the scales as f32 [out, groups] (one group per row for per-tensor and per-row scales; for
// block scales, groups of gcd(in, block_cols) inputs, each taking its block's scale).
// Errors as dequantize_fp8's.
struct LoadedFp8 {
  Fp8Matrix m;
  std::vector<std::string> tensors;
  size_t source_bytes = 0;
};
LoadedFp8 load_fp8(const SafeTensors& st, const HubQuant& hq, const std::string& prefix, int64_t out, int64_t in);

// float8_e4m3fn -> float (NaN for the two NaN codes).
float e4m3_to_float(uint8_t v);
// float -> float8_e4m3fn: the nearest code, ties to the even code, saturating at +-448
// (the format has no infinities); NaN stays NaN.
uint8_t float_to_e4m3(double v);

// FP8 e4m3 with one scale per output row, the compressed-tensors "channel" strategy:
// scale_o = max_i |w[o, i]| / 448 rounded to `scale_dtype` (f32 | f16 | bf16; 1 for a zero
// row), codes = e4m3(w / scale) (the quotient in double). w: float [out, in] on the CPU.
struct Fp8Rows {
  Array codes;   // u8 [out, in]
  Array scales;  // [out, 1] scale_dtype
};
Fp8Rows quantize_fp8_rows(const Array& w, DType scale_dtype);

}  // namespace osprey
