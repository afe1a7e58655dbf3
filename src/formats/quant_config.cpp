// config.json's quantization settings (formats/quant_method.h) and the helpers the methods'
// files share: slices, stacking, and the words of their errors.
#include <cstring>
#include <filesystem>

#include "backend/ops.h"
#include "backend/quant_args.h"
#include "core/error.h"
#include "core/file_read.h"
#include "formats/config_reader.h"
#include "formats/quant_method.h"
#include "formats/safetensors.h"

namespace osprey {
namespace {

QuantSetting parse_setting(const ConfigReader& c) {
  QuantSetting s;
  s.bits = int(c.get_int("bits"));
  s.group_size = int(c.get_int("group_size"));
  if (!supported_quant_bits(s.bits)) c.fail("bits", "must be 2, 3, 4, 6 or 8, got " + std::to_string(s.bits));
  if (!supported_quant_group(s.bits, s.group_size))
    c.fail("group_size", "must be 32, 64 or 128 (or 16 with 8 bits), got " + std::to_string(s.group_size));
  return s;
}

}  // namespace

std::optional<QuantSetting> QuantConfig::for_module(const std::string& module) const {
  auto it = overrides.find(module);
  return it != overrides.end() ? it->second : global;
}

QuantConfig parse_quant_config(const ConfigReader& config) {
  QuantConfig q;
  const char* key = config.has("quantization")          ? "quantization"
                    : config.has("quantization_config") ? "quantization_config"
                                                        : nullptr;
  if (!key) {
    const std::filesystem::path modelopt = std::filesystem::path(config.where()).parent_path() / "hf_quant_config.json";
    if (!config.where().empty() && regular_file_exists(modelopt)) {
      q.hub = parse_modelopt_quant(modelopt);
      q.where = q.hub.where;
    }
    return q;
  }
  const ConfigReader c = *config.get_object(key);
  q.where = c.where();
  if (c.has("quant_method")) {
    q.hub = parse_hub_quant(c, c.get_string("quant_method"));
    return q;
  }
  if (c.has("mode") && c.get_string("mode") != "affine")
    throw Unsupported(q.where + ": mode \"" + c.get_string("mode") + "\" is not supported (only \"affine\")");
  q.global = parse_setting(c);
  for (const auto& [module, value] : c.json().items()) {
    if (module == "bits" || module == "group_size" || module == "mode") continue;
    if (module == "gguf_types") {
      if (!value.is_object()) c.fail(module, "must map modules to GGUF block types, got " + value.dump());
      for (const auto& [m, type] : value.items()) {
        if (!type.is_string()) c.fail(module, "the block type of " + m + " must be a string, got " + type.dump());
        q.gguf_types[m] = type.get<std::string>();
      }
      continue;
    }
    if (value.is_boolean())
      q.overrides[module] = value.get<bool>() ? q.global : std::nullopt;
    else if (value.is_object())
      q.overrides[module] = parse_setting(ConfigReader(value, q.where + ": " + module));
    else
      c.fail(module, "a per-module override must be {\"group_size\": G, \"bits\": B} or false, got " + value.dump());
  }
  return q;
}

std::string setting_str(const QuantSetting& s) {
  return std::to_string(s.bits) + "-bit with group size " + std::to_string(s.group_size);
}

std::string tensor_str(const TensorInfo& ti) { return std::string(dtype_name(ti.dtype)) + ti.shape.str(); }

std::string range_str(int64_t begin, int64_t count) {
  return "[" + std::to_string(begin) + ", " + std::to_string(begin + count) + ")";
}

WeightSlice resolve_slice(const WeightSlice& slice, const std::string& name, int64_t rows, int64_t cols) {
  WeightSlice s = slice;
  if (s.rows >= 0 && s.cols >= 0)
    throw InvalidInput("tensor " + name + ": a weight is split by rows or by columns, not both");
  if (s.rows < 0) s.row0 = 0, s.rows = rows;
  if (s.cols < 0) s.col0 = 0, s.cols = cols;
  if (s.row0 < 0 || s.row0 + s.rows > rows || s.col0 < 0 || s.col0 + s.cols > cols)
    throw InvalidInput("tensor " + name + ": rows " + range_str(s.row0, s.rows) + " and columns " +
                       range_str(s.col0, s.cols) + " are outside its [" + std::to_string(rows) + ", " +
                       std::to_string(cols) + "]");
  return s;
}

Array slice_2d(const Array& a, int64_t row0, int64_t rows, int64_t col0, int64_t cols) {
  if (col0 == 0 && cols == a.dim(1)) return a.slice_rows(row0, row0 + rows);
  Array out = Array::empty({rows, cols}, a.dtype());
  const size_t item = a.itemsize(), row_bytes = size_t(a.dim(1)) * item;
  const auto* src = static_cast<const uint8_t*>(a.raw()) + size_t(row0) * row_bytes + size_t(col0) * item;
  auto* dst = static_cast<uint8_t*>(out.raw());
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + size_t(r) * cols * item, src + size_t(r) * row_bytes, cols * item);
  return out;
}

Array stack_rows(const std::vector<Array>& parts) {
  int64_t rows = 0;
  for (const Array& a : parts) rows += a.dim(0);
  Array out = Array::empty({rows, parts[0].dim(1)}, parts[0].dtype(), parts[0].device());
  int64_t at = 0;
  for (const Array& a : parts) {
    ops::copy_into(out.slice_rows(at, at + a.dim(0)), a);
    at += a.dim(0);
  }
  return out;
}

void QuantMethod::finish(LinearWeight&, LinearLoader&, bool) const {}

bool QuantMethod::stacks_with(const LinearWeight&, const LinearWeight&) const { return false; }

LinearWeight QuantMethod::stack(const std::vector<LinearWeight>&) const {
  throw Unsupported(std::string("stacking: weights of quantization method ") + name() + " do not stack");
}

}  // namespace osprey
