#pragma once
// A quantization method per format (docs/design.md, "Quantized weights"): one class owns a
// format's detection from the checkpoint, the loading and repacking of a linear layer's tensors,
// its tensor-parallel slicing, the stacking of layers that read one input, and (as the
// backend's LinearKernel) the kernels it calls. A LinearWeight is the handle of one method.
//
// The methods (one file each: quant_dense.cpp, quant_affine.cpp, quant_gguf.cpp, quant_awq.cpp,
// quant_gptq.cpp, quant_fp8.cpp) are listed in one table, quant_registry.cpp; detection walks it. A new format
// is its method's file, its kernels (or those of a payload it shares) and a registry line.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backend/quant.h"
#include "core/array.h"
#include "formats/hub_quant.h"

namespace osprey {

class SafeTensors;
class ConfigReader;
struct TensorInfo;

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
  // A GGUF checkpoint (formats/gguf_model.h): each repacked module's block type ("Q4_K"), from
  // the "quantization" object's "gguf_types"; its method is that type's (formats/quant_gguf.h).
  std::map<std::string, std::string> gguf_types;

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

// One linear layer to load: the module `prefix` ("model.layers.0.self_attn.q_proj"), its
// [out, in] shape, the model's float dtype when known, and the part of it this rank loads.
struct LinearRequest {
  std::string prefix;
  int64_t out = 0, in = 0;
  std::optional<DType> dtype;
  WeightSlice slice;  // as asked: each method checks it against its layout (resolve_slice)
  bool table = false;  // an embedding table, which the embedding op also reads by rows
};

// The loader's side of a method's load (model/weight_loader.h implements it): the checkpoint,
// its quantization, where weights go, and the books of what was read.
class LinearLoader {
 public:
  virtual const SafeTensors& tensors() const = 0;
  virtual const QuantConfig& quant() const = 0;
  virtual Device device() const = 0;
  // LoadOptions::keep_fp8 (ops::keep_fp8_weights's `want`).
  virtual std::optional<bool> keep_fp8() const = 0;
  // LoadOptions::cpu_tiles_only.
  virtual bool cpu_tiles_only() const = 0;
  // A float matrix as WeightLoader::matrix reads it (checked, sliced, placed, counted).
  virtual Array matrix(const std::string& name, int64_t rows, int64_t cols, std::optional<DType> dtype,
                       const WeightSlice& slice) = 0;
  // A CPU array (a view of the map or a slice of one) on the device; its bytes count as read.
  virtual Array place(const Array& a) = 0;
  // Marks a checkpoint tensor as read (WeightLoader::require_all_read).
  virtual void mark_read(const std::string& name) = 0;
  // A layer converted at load: `source_bytes` of the checkpoint were read, `held_bytes` are kept.
  virtual void converted(size_t source_bytes, size_t held_bytes) = 0;
  // Counts `n` loaded weights, `quant` being their affine setting when they are affine codes.
  virtual void count_weights(int64_t n, std::optional<QuantSetting> quant) = 0;
  // `host` on the device, once per distinct content: equal arrays share one copy.
  virtual Array shared(const Array& host) = 0;
  // True the first time `key` is asked in this load (log lines said once per checkpoint).
  virtual bool first_time(const std::string& key) = 0;

 protected:
  ~LinearLoader() = default;
};

// A quantization method: detection, loading and stacking on top of the kernel half. One
// immutable object per method (the registry's), shared across threads.
class QuantMethod : public LinearKernel {
 public:
  // Whether module `prefix` of the checkpoint is in this method's layout (its tensors' names
  // and dtypes, and the config's quantization method). The registry asks in its order, and the
  // first method that claims a module loads it.
  virtual bool claims(const SafeTensors& st, const QuantConfig& quant, const std::string& prefix) const = 0;
  // Loads (reads, repacks, slices and places on loader.device()) the layer `r`. Errors
  // (InvalidInput) name the tensor. The result may be of another method (an FP8 layer
  // dequantized at load is dense).
  virtual LinearWeight load(LinearLoader& loader, const LinearRequest& r) const = 0;
  // Called once on a loaded weight that is final (not waiting to be stacked): CPU repacks, pages
  // given back. `table`: an embedding table. The default does nothing.
  virtual void finish(LinearWeight& w, LinearLoader& loader, bool table) const;
  // Whether `b` may be stacked under `a` (both of this method, the same input width): the
  // same storage kind and settings. The default: never.
  virtual bool stacks_with(const LinearWeight& a, const LinearWeight& b) const;
  // The parts' rows stacked in order into one weight of this method, on their device (parts for
  // which stacks_with holds pairwise). The default throws Unsupported.
  virtual LinearWeight stack(const std::vector<LinearWeight>& parts) const;
};

// The registry: every method, in detection order (formats/quant_registry.cpp).
const std::vector<const QuantMethod*>& quant_methods();
// The method that loads module `prefix`: the first of the registry that claims it. InvalidInput
// naming the tensor and the config when none does (a layout the config does not declare).
const QuantMethod& quant_method_for(const SafeTensors& st, const QuantConfig& quant, const std::string& prefix);
// The whole method of a weight (every LinearKernel is a QuantMethod's). Requires w.defined().
const QuantMethod& method_of(const LinearWeight& w);

// The methods whose payloads other methods produce, and their handles.
const QuantMethod& dense_method();   // Array [out, in] f32 | f16 | bf16
const QuantMethod& affine_method();  // QuantizedMatrix (MLX affine)
const QuantMethod& fp8_method();     // Fp8Matrix
inline LinearWeight dense_weight(Array w) { return LinearWeight(dense_method(), std::move(w)); }
inline LinearWeight affine_weight(QuantizedMatrix q) { return LinearWeight(affine_method(), std::move(q)); }
inline LinearWeight fp8_weight(Fp8Matrix m) { return LinearWeight(fp8_method(), std::move(m)); }

// For the methods' files: `slice` checked against a [rows, cols] tensor `name` (InvalidInput
// naming it), returned with both counts resolved.
WeightSlice resolve_slice(const WeightSlice& slice, const std::string& name, int64_t rows, int64_t cols);
// Rows [row0, row0 + rows) and columns [col0, col0 + cols) of the CPU matrix `a` [R, C] (any
// element type, contiguous): a view when whole rows are taken, else a contiguous copy that
// reads only those columns of each row.
Array slice_2d(const Array& a, int64_t row0, int64_t rows, int64_t col0, int64_t cols);
// The arrays' rows stacked into a new array on their device (same dtype and row width).
Array stack_rows(const std::vector<Array>& parts);
// "[begin, begin + count)", for errors.
std::string range_str(int64_t begin, int64_t count);
// "bits-bit with group size g", for errors.
std::string setting_str(const QuantSetting& s);
// "dtype[shape]", for errors.
std::string tensor_str(const TensorInfo& ti);

}  // namespace osprey
