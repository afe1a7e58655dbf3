#pragma once
// Makes a family's weight arrays from a checkpoint, once, at load: checks each tensor's
// dtype and shape against what the config implies (errors name the tensor), places it on
// the target device, and reports progress.
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend/quant.h"
#include "core/array.h"
#include "formats/hub_quant.h"
#include "model/linear_group.h"
#include "model/model.h"

namespace osprey {

class SafeTensors;
class ConfigReader;

struct QuantSetting {
  int bits = 0;
  int group_size = 0;
  bool operator==(const QuantSetting&) const = default;
};

// config.json's "quantization" object (or "quantization_config") of an MLX affine checkpoint:
// the global setting plus per-module overrides keyed by module path
// ("model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8}, or false = not quantized).
struct QuantConfig {
  std::optional<QuantSetting> global;  // nullopt: the checkpoint is not quantized
  std::map<std::string, std::optional<QuantSetting>> overrides;
  std::string where;  // "config.json: quantization", for errors
  // A hub format converted at load (formats/hub_quant.h): AWQ, GPTQ or FP8; `global` is then unset.
  HubQuant hub;

  bool present() const { return global.has_value(); }
  // The setting that applies to `module`: its override, else the global one.
  std::optional<QuantSetting> for_module(const std::string& module) const;
};

// Throws InvalidInput naming the field for unsupported bits or group sizes or a malformed
// override, and Unsupported for a quantization method, version or scheme Osprey does not read.
// A "quantization_config" with "quant_method" is a hub format (formats/hub_quant.h); without
// one, ModelOpt's hf_quant_config.json next to config.json (when `config` was loaded from a
// file) is read.
QuantConfig parse_quant_config(const ConfigReader& config);

// The part of a [out, in] weight that one tensor-parallel rank loads: rows [row0, row0 + rows)
// (a layer split by its outputs) or columns [col0, col0 + cols) (split by its inputs), not
// both; a count < 0 takes the whole dimension.
struct WeightSlice {
  int64_t row0 = 0, rows = -1;
  int64_t col0 = 0, cols = -1;

  static WeightSlice by_rows(int64_t row0, int64_t rows) { return {row0, rows, 0, -1}; }
  static WeightSlice by_cols(int64_t col0, int64_t cols) { return {0, -1, col0, cols}; }
  bool whole() const { return rows < 0 && cols < 0; }
};

class WeightLoader {
 public:
  WeightLoader(const SafeTensors& weights, const LoadOptions& options, QuantConfig quant = {});

  // A [rows, cols] float matrix (f32, f16 or bf16); `dtype`, when given, must match too.
  // On the CPU the array points into the memory map (zero copy); on CUDA it is uploaded once.
  // `slice`: the part of it to load (the checks are of the whole tensor). A row slice is a
  // view of the map; a column slice is a contiguous copy of the columns, read row by row.
  Array matrix(const std::string& name, int64_t rows, int64_t cols, std::optional<DType> dtype = std::nullopt,
               const WeightSlice& slice = {});
  // A [n, rows, cols] float tensor (f32, f16 or bf16; `dtype`, when given, must match) as n
  // [rows, cols] matrices: on the CPU views of the memory map, on CUDA each uploaded once
  // (a mixture of experts' fused expert weights).
  std::vector<Array> matrices(const std::string& name, int64_t n, int64_t rows, int64_t cols,
                              std::optional<DType> dtype = std::nullopt);
  // A [n] float vector, converted to a float32 copy (norm weights, biases); `count` >= 0:
  // elements [first, first + count) only (the bias of a layer split by its outputs).
  Array vector_f32(const std::string& name, int64_t n, int64_t first = 0, int64_t count = -1);
  // The [out, in] weight of the module `prefix` ("model.layers.0.self_attn.q_proj"; an
  // embedding table loads the same way): dense `<prefix>.weight` (checked as matrix(), with
  // `dtype`), or MLX-quantized when `<prefix>.scales` exists or the weight is uint32 —
  // `<prefix>.weight` u32 [out, in * bits / 32], `.scales` and `.biases` [out, in / group]
  // (f16 | bf16; `dtype`, when given, must match the scales). Bits follow from the packed
  // width, the group size from the scales' width; both must agree with the config's setting
  // for the module. Errors (InvalidInput) name the tensor.
  // `slice`: the rows or columns of the [out, in] weight to load. A quantized weight splits
  // by rows freely; by columns only on whole quantization groups (InvalidInput naming the
  // tensor, the columns and the group size otherwise).
  // Hub formats (formats/hub_quant.h): `<prefix>.qweight` of an AWQ or GPTQ checkpoint is
  // repacked into the MLX layout (with in_perm for GPTQ's desc_act; such a weight is not split
  // by columns); a float8_e4m3fn `<prefix>.weight` is dequantized to `dtype` (bfloat16 when
  // not given).
  LinearWeight linear(const std::string& prefix, int64_t out, int64_t in, std::optional<DType> dtype = std::nullopt,
                      const WeightSlice& slice = {});
  // linear() for a table that is also read by rows (token embeddings): an FP8 table is
  // dequantized on every device, as the embedding op does not take FP8.
  LinearWeight table(const std::string& prefix, int64_t out, int64_t in);

  // One part of a linear group: the module `prefix`, with `out` output features, of which
  // rows [row0, row0 + rows) are loaded (rows < 0: all of them).
  struct GroupPart {
    std::string prefix;
    int64_t out = 0;
    int64_t row0 = 0;
    int64_t rows = -1;
  };
  // Linear layers that read one [in]-wide input, each loaded as linear() (with `dtype`), with
  // their `<prefix>.bias` f32 [out] when `with_bias`. Stacked into one weight when the device
  // prefers that (ops::device_traits) and the parts allow it (model/linear_group.h).
  LinearGroup linear_group(const std::vector<GroupPart>& parts, int64_t in, std::optional<DType> dtype,
                           bool with_bias);
  // A float32 host array placed on the target device (constants a family computes at load).
  Array constant(const Array& host);

  // Whether the checkpoint has a tensor `name` (a family that reads one of two layouts).
  bool contains(const std::string& name) const;
  // Marks `name` as deliberately left unread (a vision tower's tensors in a checkpoint whose
  // language model alone is loaded), so that require_all_read() accepts it.
  void ignore(const std::string& name);
  // Throws InvalidInput naming the checkpoint's tensors that were neither read nor ignored
  // (the first few, and how many), so that no tensor is silently dropped.
  void require_all_read(const std::string& family) const;

  // The setting that covers the most quantized weights loaded so far; nullopt when none.
  std::optional<QuantSetting> dominant_quant() const;
  size_t bytes_loaded() const { return size_t(int64_t(done_) + converted_delta_); }
  // Weights loaded so far (a quantized matrix counts the weights it encodes).
  uint64_t params_loaded() const { return params_; }
  // Sets info's weight facts from what was loaded: dtype `dt`, bytes, parameters and the
  // dominant quantization setting.
  void record_weights(ModelInfo& info, DType dt) const;
  // Reports completion to the progress callback and returns the device memory that loading
  // left cached (parts of stacked weights) to the system. Tensors neither read nor ignored
  // are named in a warning (a family that must read every tensor calls require_all_read).
  void finish();

 private:
  void touch(const Array& a);
  Array place(const Array& a);
  LinearWeight hub_linear(const std::string& prefix, int64_t out, int64_t in, std::optional<DType> dtype,
                          const WeightSlice& slice);
  QuantizedMatrix quantized(const std::string& prefix, int64_t out, int64_t in, std::optional<DType> dtype,
                            const WeightSlice& slice);

  const SafeTensors& weights_;
  // The CPU tiles of a quantized weight just loaded (ops::repack_for_cpu); a weight only linear
  // reads then keeps the tiles alone (ops::keep_tiles_only), an embedding table keeps its packed
  // words with their mapped pages released (ops::release_mapped_source).
  void finish_cpu_tiles(QuantizedMatrix& q) const;
  const LoadOptions& options_;
  QuantConfig quant_;
  std::set<std::string> read_;  // tensors read or ignored
  std::map<std::pair<int, int>, int64_t> quant_weights_;  // (bits, group size) -> weights loaded
  bool defer_repack_ = false;  // linear_group: parts get their CPU tiles after stacking, or not at all
  size_t total_ = 0;
  size_t done_ = 0;
  int64_t converted_delta_ = 0;  // bytes of the arrays converted at load minus their source bytes
  uint64_t params_ = 0;
  std::map<std::vector<int32_t>, Array> perms_;  // input permutations, shared by equal content
  bool fp8_logged_ = false;
  bool loading_table_ = false;  // while table() loads: the embedding keeps its packed words
};

}  // namespace osprey
