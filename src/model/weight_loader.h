#pragma once
// Makes a family's weight arrays from a checkpoint, once, at load: checks each tensor's
// dtype and shape against what the config implies (errors name the tensor), places it on
// the target device, and reports progress. A linear layer is loaded by its quantization
// method (formats/quant_method.h), which the registry detects from the module's tensors;
// QuantConfig, parse_quant_config and WeightSlice are declared there.
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend/quant.h"
#include "core/array.h"
#include "formats/quant_method.h"
#include "model/linear_group.h"
#include "model/model.h"

namespace osprey {

class SafeTensors;

class WeightLoader : private LinearLoader {
 public:
  WeightLoader(const SafeTensors& weights, const LoadOptions& options, QuantConfig quant = {});

  // A [rows, cols] float matrix (f32, f16 or bf16); `dtype`, when given, must match too.
  // On the CPU the array points into the memory map (zero copy); on CUDA it is uploaded once.
  // `slice`: the part of it to load (the checks are of the whole tensor). A row slice is a
  // view of the map; a column slice is a contiguous copy of the columns, read row by row.
  Array matrix(const std::string& name, int64_t rows, int64_t cols, std::optional<DType> dtype = std::nullopt,
               const WeightSlice& slice = {}) override;
  // A [n, rows, cols] float tensor (f32, f16 or bf16; `dtype`, when given, must match) as n
  // [rows, cols] matrices: on the CPU views of the memory map, on CUDA each uploaded once
  // (a mixture of experts' fused expert weights).
  std::vector<Array> matrices(const std::string& name, int64_t n, int64_t rows, int64_t cols,
                              std::optional<DType> dtype = std::nullopt);
  // A [n] float vector, converted to a float32 copy (norm weights, biases); `count` >= 0:
  // elements [first, first + count) only (the bias of a layer split by its outputs).
  Array vector_f32(const std::string& name, int64_t n, int64_t first = 0, int64_t count = -1);
  // The [out, in] weight of the module `prefix` ("model.layers.0.self_attn.q_proj"; an
  // embedding table loads the same way), loaded by the first method of the registry that
  // claims the module's tensors (formats/quant_method.h: AWQ's and GPTQ's `.qweight`, FP8's
  // float8_e4m3fn `.weight`, MLX affine's u32 `.weight` with `.scales` and `.biases`, else dense
  // `.weight`, checked as matrix() with `dtype`). Errors (InvalidInput) name the tensor.
  // `slice`: the rows or columns of the [out, in] weight to load; each method says how its
  // layout splits (quantized weights by columns only on whole groups, GPTQ with desc_act not by
  // columns; InvalidInput naming the tensor, the columns and the group otherwise).
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
  Array place(const Array& a) override;
  LinearWeight load_linear(const LinearRequest& r);

  // LinearLoader: what the methods' load reads and reports.
  const SafeTensors& tensors() const override { return weights_; }
  const QuantConfig& quant() const override { return quant_; }
  Device device() const override;
  std::optional<bool> keep_fp8() const override;
  bool cpu_tiles_only() const override;
  void mark_read(const std::string& name) override { read_.insert(name); }
  void converted(size_t source_bytes, size_t held_bytes) override;
  void count_weights(int64_t n, std::optional<QuantSetting> quant) override;
  Array shared(const Array& host) override;
  bool first_time(const std::string& key) override { return once_.insert(key).second; }

  const SafeTensors& weights_;
  const LoadOptions& options_;
  QuantConfig quant_;
  std::set<std::string> read_;  // tensors read or ignored
  std::map<std::pair<int, int>, int64_t> quant_weights_;  // (bits, group size) -> weights loaded
  bool defer_finish_ = false;  // linear_group: parts are finished after stacking, or not at all
  size_t total_ = 0;
  size_t done_ = 0;
  int64_t converted_delta_ = 0;  // bytes of the arrays converted at load minus their source bytes
  uint64_t params_ = 0;
  std::map<std::pair<DType, std::vector<uint8_t>>, Array> shared_;  // shared(): by content
  std::set<std::string> once_;  // first_time()'s keys
};

}  // namespace osprey
