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
  const WeightSlice s = resolve_slice(slice, name, rows, cols);
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

LinearWeight WeightLoader::load_linear(const LinearRequest& r) {
  const QuantMethod& method = quant_method_for(weights_, quant_, r.prefix);
  LinearWeight w = method.load(*this, r);
  // A linear group's parts are finished after the stacking, which makes the stacked weight's own.
  if (!defer_finish_) method_of(w).finish(w, *this, r.table);
  return w;
}

LinearWeight WeightLoader::linear(const std::string& prefix, int64_t out, int64_t in, std::optional<DType> dtype,
                                  const WeightSlice& slice) {
  return load_linear(LinearRequest{prefix, out, in, dtype, slice, false});
}

LinearWeight WeightLoader::table(const std::string& prefix, int64_t out, int64_t in) {
  return load_linear(LinearRequest{prefix, out, in, std::nullopt, WeightSlice{}, true});
}

Device WeightLoader::device() const { return options_.device; }

std::optional<bool> WeightLoader::keep_fp8() const { return options_.keep_fp8; }

bool WeightLoader::cpu_tiles_only() const { return options_.cpu_tiles_only; }

void WeightLoader::converted(size_t source_bytes, size_t held_bytes) {
  done_ += source_bytes;
  if (options_.progress) options_.progress(done_, total_);
  converted_delta_ += int64_t(held_bytes) - int64_t(source_bytes);
}

void WeightLoader::count_weights(int64_t n, std::optional<QuantSetting> quant) {
  params_ += uint64_t(n);
  if (quant) quant_weights_[{quant->bits, quant->group_size}] += n;
}

Array WeightLoader::shared(const Array& host) {
  const auto* bytes = static_cast<const uint8_t*>(host.raw());
  auto [it, fresh] =
      shared_.try_emplace({host.dtype(), std::vector<uint8_t>(bytes, bytes + host.nbytes())});
  if (fresh) it->second = ops::to_device(host, options_.device);
  return it->second;
}

LinearGroup WeightLoader::linear_group(const std::vector<GroupPart>& parts, int64_t in, std::optional<DType> dtype,
                                       bool with_bias) {
  LinearGroup g;
  // The parts wait for the stacking, which makes the stacked weight's own CPU tiles.
  defer_finish_ = true;
  try {
    for (const GroupPart& p : parts) {
      const WeightSlice slice = p.rows >= 0 ? WeightSlice::by_rows(p.row0, p.rows) : WeightSlice{};
      g.parts.push_back(linear(p.prefix, p.out, in, dtype, slice));
      g.outs.push_back(p.rows >= 0 ? p.rows : p.out);
    }
  } catch (...) {
    defer_finish_ = false;
    throw;
  }
  defer_finish_ = false;
  for (const GroupPart& p : parts)
    g.biases.push_back(with_bias ? vector_f32(p.prefix + ".bias", p.out, p.row0, p.rows) : Array());
  if (ops::device_traits(options_.device).stack_shared_input_linears) stack_linear_group(g);
  for (LinearWeight& w : g.parts) method_of(w).finish(w, *this, false);
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
