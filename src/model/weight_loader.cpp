#include "model/weight_loader.h"

#include <cstring>

#include "backend/ops.h"
#include "backend/quant.h"
#include "backend/quant_args.h"
#include "core/env.h"
#include "core/error.h"
#include "core/file_read.h"
#include "core/log.h"
#include "formats/config_reader.h"
#include "formats/safetensors.h"

namespace osprey {
namespace {

std::string setting_str(const QuantSetting& s) {
  return std::to_string(s.bits) + "-bit with group size " + std::to_string(s.group_size);
}

std::string tensor_str(const TensorInfo& ti) { return std::string(dtype_name(ti.dtype)) + ti.shape.str(); }

std::string range_str(int64_t begin, int64_t count) {
  return "[" + std::to_string(begin) + ", " + std::to_string(begin + count) + ")";
}

// Checks `slice` against a [rows, cols] tensor `name`; returns it with both counts resolved.
WeightSlice resolve(const WeightSlice& slice, const std::string& name, int64_t rows, int64_t cols) {
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

// Rows [row0, row0 + rows) and columns [col0, col0 + cols) of the CPU matrix `a` [R, C] (any
// element type, contiguous): a view when whole rows are taken, else a contiguous copy that
// reads only those columns of each row.
Array slice_2d(const Array& a, int64_t row0, int64_t rows, int64_t col0, int64_t cols) {
  if (col0 == 0 && cols == a.dim(1)) return a.slice_rows(row0, row0 + rows);
  Array out = Array::empty({rows, cols}, a.dtype());
  const size_t item = a.itemsize(), row_bytes = size_t(a.dim(1)) * item;
  const auto* src = static_cast<const uint8_t*>(a.raw()) + size_t(row0) * row_bytes + size_t(col0) * item;
  auto* dst = static_cast<uint8_t*>(out.raw());
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + size_t(r) * cols * item, src + size_t(r) * row_bytes, cols * item);
  return out;
}

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
    if (value.is_boolean())
      q.overrides[module] = value.get<bool>() ? q.global : std::nullopt;
    else if (value.is_object())
      q.overrides[module] = parse_setting(ConfigReader(value, q.where + ": " + module));
    else
      c.fail(module, "a per-module override must be {\"group_size\": G, \"bits\": B} or false, got " + value.dump());
  }
  return q;
}

WeightLoader::WeightLoader(const SafeTensors& weights, const LoadOptions& options, QuantConfig quant)
    : weights_(weights), options_(options), quant_(std::move(quant)), total_(weights.total_bytes()) {
  if (quant_.hub.method != HubQuantMethod::fp8) return;
  // FP8 checkpoints' scales for FP8 attention (queries, probabilities): not used.
  // (Their k_scale / v_scale are the KV cache's: model/kv_cache_scales.h.)
  int n = 0;
  for (const std::string& name : weights_.names())
    for (const char* suffix : {".q_scale", ".prob_scale"})
      if (name.size() > std::strlen(suffix) && name.ends_with(suffix)) read_.insert(name), ++n;
  if (n)
    log_info(weights_.source().string() + ": " + std::to_string(n) +
             " FP8 attention scale tensor(s) (q_scale, prob_scale) are not used (attention does not run in FP8)");
}

void WeightLoader::touch(const Array& a) {
  // Fault the mapped pages in now, so the first forward pass is not the one that reads the
  // file, and so progress reflects the real reading.
  const auto* p = static_cast<const volatile uint8_t*>(a.raw());
  uint8_t sink = 0;
  for (size_t i = 0; i < a.nbytes(); i += 4096) sink ^= p[i];
  (void)sink;
  done_ += a.nbytes();
  if (options_.progress) options_.progress(done_, total_);
}

Array WeightLoader::place(const Array& a) {
  touch(a);
  return ops::to_device(a, options_.device);  // on the CPU: the mapped array itself
}

Array WeightLoader::matrix(const std::string& name, int64_t rows, int64_t cols, std::optional<DType> dtype,
                           const WeightSlice& slice) {
  const TensorInfo& ti = weights_.info(name);
  if (!is_float(ti.dtype))
    throw InvalidInput("tensor " + name + " is " + tensor_str(ti) +
                       ", but a float matrix (float32, float16 or bfloat16) is expected" +
                       (ti.dtype == DType::u32 ? " (a quantized weight needs .scales and .biases)" : ""));
  Array a = weights_.get(name, dtype.value_or(ti.dtype), {rows, cols});
  read_.insert(name);
  const WeightSlice s = resolve(slice, name, rows, cols);
  params_ += uint64_t(s.rows * s.cols);
  return place(slice_2d(a, s.row0, s.rows, s.col0, s.cols));
}

std::vector<Array> WeightLoader::matrices(const std::string& name, int64_t n, int64_t rows, int64_t cols,
                                          std::optional<DType> dtype) {
  const TensorInfo& ti = weights_.info(name);
  if (!is_float(ti.dtype))
    throw InvalidInput("tensor " + name + " is " + tensor_str(ti) +
                       ", but a float tensor (float32, float16 or bfloat16) is expected");
  const Array a = weights_.get(name, dtype.value_or(ti.dtype), {n, rows, cols});
  read_.insert(name);
  params_ += uint64_t(n * rows * cols);
  std::vector<Array> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(place(a.slice_rows(i, i + 1).reshape({rows, cols})));
  return out;
}

Array WeightLoader::vector_f32(const std::string& name, int64_t n, int64_t first, int64_t count) {
  const TensorInfo& ti = weights_.info(name);
  if (!is_float(ti.dtype))
    throw InvalidInput("tensor " + name + " is " + tensor_str(ti) + ", but a float vector is expected");
  Array a = weights_.get(name, ti.dtype, {n});
  if (count >= 0) {
    if (first < 0 || first + count > n)
      throw InvalidInput("tensor " + name + ": elements " + range_str(first, count) + " are outside its " +
                         std::to_string(n));
    a = a.slice_rows(first, first + count);
    n = count;
  }
  params_ += uint64_t(n);
  read_.insert(name);
  touch(a);
  return ops::to_device(ops::cast(a, DType::f32), options_.device);
}

LinearWeight WeightLoader::linear(const std::string& prefix, int64_t out, int64_t in, std::optional<DType> dtype,
                                  const WeightSlice& slice) {
  const std::string weight = prefix + ".weight";
  if (quant_.hub.present() && (weights_.contains(prefix + ".qweight") ||
                               (weights_.contains(weight) && weights_.info(weight).float8_e4m3)))
    return hub_linear(prefix, out, in, dtype, slice);
  const TensorInfo& ti = weights_.info(weight);
  if (ti.float8_e4m3)
    throw InvalidInput("tensor " + weight + " is float8_e4m3fn " + ti.shape.str() +
                       ", but config.json has no quantization_config naming an FP8 method (compressed-tensors, "
                       "fbgemm_fp8, fp8, modelopt) and there is no hf_quant_config.json");
  LinearWeight lw;
  if (ti.dtype == DType::u32 || weights_.contains(prefix + ".scales") || weights_.contains(prefix + ".biases")) {
    lw.quant = quantized(prefix, out, in, dtype, slice);
    params_ += uint64_t(lw.quant.scales.dim(0)) * uint64_t(lw.quant.scales.dim(1) * lw.quant.group_size);
    return lw;
  }
  if (auto it = quant_.overrides.find(prefix); it != quant_.overrides.end() && it->second)
    throw InvalidInput(quant_.where + " says " + prefix + " is " + setting_str(*it->second) + ", but tensor " +
                       weight + " is " + tensor_str(ti) + " without .scales and .biases");
  lw.dense = matrix(weight, out, in, dtype, slice);
  return lw;
}

LinearWeight WeightLoader::table(const std::string& prefix, int64_t out, int64_t in) {
  loading_table_ = true;
  try {
    LinearWeight lw = linear(prefix, out, in);
    loading_table_ = false;
    return lw;
  } catch (...) {
    loading_table_ = false;
    throw;
  }
}

LinearWeight WeightLoader::hub_linear(const std::string& prefix, int64_t out, int64_t in, std::optional<DType> dtype,
                                      const WeightSlice& slice) {
  const HubQuant& hq = quant_.hub;
  LinearWeight lw;
  const WeightSlice s = resolve(slice, prefix, out, in);
  if (weights_.contains(prefix + ".qweight")) {
    if (hq.method != HubQuantMethod::awq && hq.method != HubQuantMethod::gptq)
      throw InvalidInput("tensor " + prefix + ".qweight is an AWQ or GPTQ weight, but " + hq.where +
                         " names quant_method \"" + hq.name + "\"");
    RepackedInt r = repack_int_quant(weights_, hq, prefix, out, in, dtype);
    read_.insert(r.tensors.begin(), r.tensors.end());
    QuantizedMatrix& q = r.q;
    const int64_t group = q.group_size, per = 32 / q.bits;
    if (r.perm.defined() && (s.col0 != 0 || s.cols != in))
      throw InvalidInput("tensor " + prefix + ".g_idx orders the inputs for desc_act: a tensor-parallel rank's "
                         "columns " + range_str(s.col0, s.cols) + " of its " + std::to_string(in) +
                         " inputs cannot be split from it (use one rank)");
    if (s.col0 % group != 0 || s.cols % group != 0)
      throw InvalidInput("tensor " + prefix + ".qweight is quantized in groups of " + std::to_string(group) +
                         " inputs: a tensor-parallel rank's columns " + range_str(s.col0, s.cols) + " of its " +
                         std::to_string(in) + " inputs do not fall on whole groups (use fewer ranks)");
    q.packed = slice_2d(q.packed, s.row0, s.rows, s.col0 / per, s.cols / per);
    q.scales = slice_2d(q.scales, s.row0, s.rows, s.col0 / group, s.cols / group);
    q.biases = slice_2d(q.biases, s.row0, s.rows, s.col0 / group, s.cols / group);
    done_ += r.source_bytes;
    if (options_.progress) options_.progress(done_, total_);
    converted_delta_ += int64_t(q.nbytes()) - int64_t(r.source_bytes);
    q.packed = ops::to_device(q.packed, options_.device);
    q.scales = ops::to_device(q.scales, options_.device);
    q.biases = ops::to_device(q.biases, options_.device);
    if (r.perm.defined()) {
      std::vector<int32_t> key(r.perm.data<int32_t>(), r.perm.data<int32_t>() + in);
      auto [it, fresh] = perms_.try_emplace(std::move(key));
      if (fresh) it->second = ops::to_device(r.perm, options_.device);
      lw.in_perm = it->second;
    }
    quant_weights_[{q.bits, q.group_size}] += s.rows * s.cols;
    params_ += uint64_t(s.rows * s.cols);
    if (!defer_repack_) finish_cpu_tiles(q);
    lw.quant = std::move(q);
    return lw;
  }
  if (hq.method != HubQuantMethod::fp8)
    throw InvalidInput("tensor " + prefix + ".weight is float8_e4m3fn, but " + hq.where + " names quant_method \"" +
                       hq.name + "\"");
  // Static activation scales (W8A8 checkpoints): the weights run against unquantized activations.
  if (weights_.contains(prefix + ".input_scale")) read_.insert(prefix + ".input_scale");
  // FP8 stays FP8 where the backend's policy says (ops::keep_fp8_weights, from LoadOptions::
  // keep_fp8 and the scale groups); an embedding table is dequantized.
  std::optional<LoadedFp8> kept;
  if (!loading_table_ && ops::keep_fp8_weights(options_.device, options_.keep_fp8, 1)) {
    kept = load_fp8(weights_, hq, prefix, out, in);
    if (!ops::keep_fp8_weights(options_.device, options_.keep_fp8, kept->m.scales.dim(1))) kept.reset();
  }
  if (kept) {
    const LoadedFp8& f = *kept;
    read_.insert(f.tensors.begin(), f.tensors.end());
    const int64_t groups = f.m.scales.dim(1), group = in / groups;
    if (groups > 1 && (s.col0 % group != 0 || s.cols % group != 0))
      throw InvalidInput("tensor " + prefix + ".weight has FP8 block scales over groups of " + std::to_string(group) +
                         " inputs: a tensor-parallel rank's columns " + range_str(s.col0, s.cols) + " of its " +
                         std::to_string(in) + " inputs do not fall on whole groups (use fewer ranks)");
    if (!fp8_logged_) {
      log_info(weights_.source().string() + ": FP8 (" + hq.name + ", " +
               (hq.fp8_activations ? "FP8 activations declared" : "weights only") + ") weights stay FP8 on " +
               options_.device.str() + "; " + ops::fp8_kept_note(options_.device, groups, hq.fp8_activations) +
               (hq.fp8_activation_note.empty() ? "" : " (" + hq.fp8_activation_note + ")"));
      fp8_logged_ = true;
    }
    Fp8Matrix m;
    m.fp8_activations = hq.fp8_activations;
    m.codes = ops::to_device(slice_2d(f.m.codes, s.row0, s.rows, s.col0, s.cols), options_.device);
    m.scales = ops::to_device(
        slice_2d(f.m.scales, s.row0, s.rows, groups > 1 ? s.col0 / group : 0, groups > 1 ? s.cols / group : 1),
        options_.device);
    done_ += f.source_bytes;
    if (options_.progress) options_.progress(done_, total_);
    converted_delta_ += int64_t(m.nbytes()) - int64_t(f.source_bytes);
    params_ += uint64_t(s.rows * s.cols);
    lw.fp8 = std::move(m);
    return lw;
  }
  DequantizedFp8 d = dequantize_fp8(weights_, hq, prefix, out, in, dtype.value_or(DType::bf16));
  read_.insert(d.tensors.begin(), d.tensors.end());
  if (!fp8_logged_) {
    log_info(weights_.source().string() + ": FP8 (" + hq.name + ") weights are dequantized to " +
             dtype_name(dtype.value_or(DType::bf16)) + " at load" +
             ops::fp8_dequantized_note(options_.device) +
             "; activations are not quantized");
    fp8_logged_ = true;
  }
  Array w = slice_2d(d.w, s.row0, s.rows, s.col0, s.cols);
  done_ += d.source_bytes;
  if (options_.progress) options_.progress(done_, total_);
  converted_delta_ += int64_t(w.nbytes()) - int64_t(d.source_bytes);
  params_ += uint64_t(s.rows * s.cols);
  lw.dense = ops::to_device(w, options_.device);
  return lw;
}

QuantizedMatrix WeightLoader::quantized(const std::string& prefix, int64_t out, int64_t in,
                                        std::optional<DType> dtype, const WeightSlice& slice) {
  const std::string wname = prefix + ".weight", sname = prefix + ".scales", bname = prefix + ".biases";
  const TensorInfo& wi = weights_.info(wname);
  if (quant_.hub.present())
    throw InvalidInput("tensor " + wname + " is an MLX-quantized weight (" + tensor_str(wi) + "), but " + quant_.where +
                       " names quant_method \"" + quant_.hub.name + "\"");
  if (!quant_.present())
    throw InvalidInput("tensor " + wname + " is quantized (" + tensor_str(wi) +
                       (weights_.contains(sname) ? ", with " + sname : std::string()) +
                       "), but config.json has no \"quantization\" object");
  if (wi.dtype != DType::u32 || wi.shape.n != 2 || wi.shape[0] != out)
    throw InvalidInput("tensor " + wname + " is " + tensor_str(wi) + ", but a quantized weight must be uint32[" +
                       std::to_string(out) + ", " + std::to_string(in) + " * bits / 32]");
  const int64_t packed_in = wi.shape[1];
  const int bits = (packed_in * 32) % in == 0 ? int(packed_in * 32 / in) : 0;
  if (!supported_quant_bits(bits))
    throw InvalidInput("tensor " + wname + " is " + tensor_str(wi) + ": a packed width of " +
                       std::to_string(packed_in) + " words fits no supported bit count for " + std::to_string(in) +
                       " inputs (width * 32 / inputs must be 2, 3, 4, 6 or 8)");
  for (const std::string& name : {sname, bname})
    if (!weights_.contains(name))
      throw InvalidInput("missing tensor " + name + ": the quantized weight " + wname +
                         " needs both .scales and .biases (in " + weights_.source().string() + ")");
  const TensorInfo& si = weights_.info(sname);
  const TensorInfo& bi = weights_.info(bname);
  if ((si.dtype != DType::f16 && si.dtype != DType::bf16) || si.shape.n != 2 || si.shape[0] != out ||
      si.shape[1] <= 0)
    throw InvalidInput("tensor " + sname + " is " + tensor_str(si) + ", but float16 or bfloat16 [" +
                       std::to_string(out) + ", " + std::to_string(in) + " / group_size] is expected");
  if (dtype && si.dtype != *dtype)
    throw InvalidInput("tensor " + sname + " is " + tensor_str(si) + ", but the model's other weights are " +
                       dtype_name(*dtype));
  if (bi.dtype != si.dtype || !(bi.shape == si.shape))
    throw InvalidInput("tensor " + bname + " is " + tensor_str(bi) + ", but it must match " + sname + " (" +
                       tensor_str(si) + ")");
  const int64_t n_groups = si.shape[1];
  const int group = in % n_groups == 0 ? int(in / n_groups) : 0;
  if (!supported_quant_group(bits, group))
    throw InvalidInput("tensor " + sname + " is " + tensor_str(si) + ": " + std::to_string(n_groups) +
                       " groups per row " +
                       (group == 0 ? "do not divide the " + std::to_string(in) + " inputs"
                                   : "make a group size of " + std::to_string(group)) +
                       " (the group size must be 32, 64 or 128, or 16 with 8 bits, and divide the inputs)");
  const QuantSetting found{bits, group};
  const std::optional<QuantSetting> expected = quant_.for_module(prefix);
  if (!expected)
    throw InvalidInput("tensor " + wname + " is quantized, but " + quant_.where + " marks " + prefix +
                       " as not quantized (false)");
  if (!(*expected == found))
    throw InvalidInput("tensor " + wname + " is " + setting_str(found) + " by its shapes, but " + quant_.where +
                       " says " + setting_str(*expected) + " for " + prefix);
  QuantizedMatrix q;
  q.bits = bits;
  q.group_size = group;
  read_.insert({wname, sname, bname});
  const WeightSlice s = resolve(slice, wname, out, in);
  if (s.col0 % group != 0 || s.cols % group != 0)
    throw InvalidInput("tensor " + wname + " is quantized in groups of " + std::to_string(group) +
                       " inputs: a tensor-parallel rank's columns " + range_str(s.col0, s.cols) + " of its " +
                       std::to_string(in) + " inputs do not fall on whole groups (use fewer ranks, or a "
                       "checkpoint whose group size divides " + std::to_string(in) + " / ranks)");
  // A group of `group` inputs is group * bits / 32 packed words (whole words: every supported
  // group size is a multiple of 32) and one scale and one bias.
  const int64_t words = group * bits / 32;
  q.packed = place(slice_2d(weights_.get(wname), s.row0, s.rows, s.col0 / group * words, s.cols / group * words));
  q.scales = place(slice_2d(weights_.get(sname), s.row0, s.rows, s.col0 / group, s.cols / group));
  q.biases = place(slice_2d(weights_.get(bname), s.row0, s.rows, s.col0 / group, s.cols / group));
  quant_weights_[{bits, group}] += s.rows * s.cols;
  if (!defer_repack_) finish_cpu_tiles(q);
  return q;
}

void WeightLoader::finish_cpu_tiles(QuantizedMatrix& q) const {
  ops::repack_for_cpu(q);
  if (loading_table_ || !options_.cpu_tiles_only)
    ops::release_mapped_source(q);
  else
    ops::keep_tiles_only(q);
}

LinearGroup WeightLoader::linear_group(const std::vector<GroupPart>& parts, int64_t in, std::optional<DType> dtype,
                                       bool with_bias) {
  LinearGroup g;
  // The parts' CPU tiles wait for the stacking, which makes the stacked weight's own.
  defer_repack_ = true;
  try {
    for (const GroupPart& p : parts) {
      const WeightSlice slice = p.rows >= 0 ? WeightSlice::by_rows(p.row0, p.rows) : WeightSlice{};
      g.parts.push_back(linear(p.prefix, p.out, in, dtype, slice));
      g.outs.push_back(p.rows >= 0 ? p.rows : p.out);
    }
  } catch (...) {
    defer_repack_ = false;
    throw;
  }
  defer_repack_ = false;
  for (const GroupPart& p : parts)
    g.biases.push_back(with_bias ? vector_f32(p.prefix + ".bias", p.out, p.row0, p.rows) : Array());
  if (ops::device_traits(options_.device).stack_shared_input_linears) stack_linear_group(g);
  for (LinearWeight& w : g.parts)
    if (w.quantized()) finish_cpu_tiles(w.quant);
  return g;
}

bool WeightLoader::contains(const std::string& name) const { return weights_.contains(name); }

void WeightLoader::ignore(const std::string& name) { read_.insert(name); }

void WeightLoader::require_all_read(const std::string& family) const {
  std::vector<std::string> unread;
  for (const std::string& name : weights_.names())
    if (!read_.count(name)) unread.push_back(name);
  if (unread.empty()) return;
  std::string list;
  for (size_t i = 0; i < unread.size() && i < 5; ++i) list += (i ? ", " : "") + unread[i];
  if (unread.size() > 5) list += ", ...";
  throw InvalidInput(weights_.source().string() + ": " + std::to_string(unread.size()) + " tensor" +
                     (unread.size() == 1 ? "" : "s") + " that a " + family + " model does not use: " + list);
}

Array WeightLoader::constant(const Array& host) { return ops::to_device(host, options_.device); }

std::optional<QuantSetting> WeightLoader::dominant_quant() const {
  std::optional<QuantSetting> best;
  int64_t most = 0;
  for (const auto& [setting, n] : quant_weights_)
    if (n > most) {
      most = n;
      best = QuantSetting{setting.first, setting.second};
    }
  return best;
}

void WeightLoader::record_weights(ModelInfo& info, DType dt) const {
  info.weight_dtype = dt;
  info.weight_bytes = bytes_loaded();
  info.n_params = params_loaded();
  if (auto q = dominant_quant()) {
    info.quant_bits = q->bits;
    info.quant_group_size = q->group_size;
  }
}

void WeightLoader::finish() {
  // A checkpoint of another family relabelled (a Qwen2 one as llama runs without its q/k/v
  // biases) shows as tensors the family never read: name them.
  std::vector<std::string> unused;
  for (const std::string& name : weights_.names())
    if (!read_.count(name)) unused.push_back(name);
  if (!unused.empty()) {
    std::string names;
    for (size_t i = 0; i < unused.size() && i < 8; ++i) names += (i ? ", " : "") + unused[i];
    if (unused.size() > 8) names += ", ...";
    log_warn(weights_.source().string() + ": " + std::to_string(unused.size()) +
             " tensor(s) in the checkpoint are not used by this model_type (" + names +
             "); is config.json's model_type right?");
  }
  if (options_.progress) options_.progress(total_, total_);
  ops::release_cached_memory(options_.device);
}

}  // namespace osprey
