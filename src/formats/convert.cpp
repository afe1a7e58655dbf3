#include "formats/convert.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "backend/quant.h"
#include "core/error.h"
#include "formats/config_reader.h"
#include "formats/hub_quant.h"
#include "formats/quantize.h"

namespace osprey {
namespace {
namespace fs = std::filesystem;

const char* const kCopiedFiles[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                                    "special_tokens_map.json"};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}


}  // namespace

void check_not_quantized(const fs::path& src, const ConfigReader& config, const SafeTensors& st) {
  for (const char* key : {"quantization", "quantization_config"})
    if (config.has(key))
      throw InvalidInput(config.where() + ": the checkpoint is already quantized (it has \"" + key +
                         "\"); convert takes a float16, bfloat16 or float32 checkpoint");
  for (const auto& name : st.names())
    if (st.info(name).dtype == DType::u32 || ends_with(name, ".scales"))
      throw InvalidInput(src.string() + ": tensor " + name +
                         " is already quantized; convert takes a float16, bfloat16 or float32 checkpoint");
}

namespace {

void write_json(const fs::path& path, const nlohmann::json& j) {
  std::ofstream out(path, std::ios::trunc);
  out << j.dump(4) << "\n";
  if (!out) throw IoError(path.string() + ": write failed");
}

}  // namespace

namespace {

// Splits the steps into shards of at most shard_bytes (a larger single step gets its own).
void plan_shards(ConvertPlan& plan, size_t shard_bytes) {
  const std::vector<ConvertStep>& steps = plan.steps;
  plan.shards.emplace_back();
  size_t in_shard = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const size_t n = steps[i].nbytes();
    if (in_shard > 0 && in_shard + n > shard_bytes) {
      plan.shards.emplace_back();
      in_shard = 0;
    }
    plan.shards.back().push_back(i);
    in_shard += n;
    plan.total_bytes += n;
  }
}

bool fp8_target(const std::string& name, const TensorInfo& ti) {
  return ends_with(name, ".weight") && ti.shape.n == 2 && is_float(ti.dtype) &&
         name.find("embed") == std::string::npos && name.find("lm_head") == std::string::npos;
}

}  // namespace

ConvertPlan plan_fp8_conversion(const SafeTensors& st, DType dtype, size_t shard_bytes) {
  ConvertPlan plan;
  for (const auto& name : st.names()) {
    if (ends_with(name, ".rotary_emb.inv_freq")) continue;  // recomputed from the config
    const TensorInfo& ti = st.info(name);
    ConvertStep s;
    s.source = name;
    if (fp8_target(name, ti)) {
      s.quantize = true;
      TensorSpec codes{name, DType::u8, ti.shape};
      codes.float8_e4m3 = true;
      s.outputs.push_back(codes);
      s.outputs.push_back({name + "_scale", dtype, Shape{ti.shape[0], 1}});
    } else {
      s.outputs.push_back({name, is_float(ti.dtype) ? dtype : ti.dtype, ti.shape});
    }
    plan.steps.push_back(std::move(s));
  }
  plan_shards(plan, shard_bytes);
  return plan;
}

ConvertPlan plan_conversion(const SafeTensors& st, int bits, int group_size, DType dtype, size_t shard_bytes) {
  if (!supported_quant_bits(bits)) throw InvalidInput("convert: " + std::to_string(bits) + "-bit is not supported (2, 3, 4, 6 or 8)");
  if (!supported_group_size(group_size))
    throw InvalidInput("convert: group size " + std::to_string(group_size) + " is not supported (32, 64 or 128)");
  ConvertPlan plan;
  std::vector<ConvertStep>& steps = plan.steps;
  for (const auto& name : st.names()) {
    if (ends_with(name, ".rotary_emb.inv_freq")) continue;  // recomputed from the config
    const TensorInfo& ti = st.info(name);
    ConvertStep s;
    s.source = name;
    if (ends_with(name, ".weight") && ti.shape.n == 2 && is_float(ti.dtype) && ti.shape[1] % group_size == 0) {
      const std::string prefix = name.substr(0, name.size() - 7);
      const int64_t out = ti.shape[0], in = ti.shape[1];
      s.quantize = true;
      s.outputs.push_back({name, DType::u32, Shape{out, in * bits / 32}});
      s.outputs.push_back({prefix + ".scales", dtype, Shape{out, in / group_size}});
      s.outputs.push_back({prefix + ".biases", dtype, Shape{out, in / group_size}});
    } else {
      s.outputs.push_back({name, is_float(ti.dtype) ? dtype : ti.dtype, ti.shape});
    }
    steps.push_back(std::move(s));
  }
  plan_shards(plan, shard_bytes);
  return plan;
}

DType default_convert_dtype(const SafeTensors& st) {
  for (const auto& name : st.names()) {
    const TensorInfo& ti = st.info(name);
    if (ti.shape.n == 2 && (ti.dtype == DType::f16 || ti.dtype == DType::bf16)) return ti.dtype;
  }
  return DType::bf16;
}

std::string shard_file_name(size_t i, size_t n) {
  if (n == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

ConvertSummary convert_checkpoint(const fs::path& src, const fs::path& dst, const ConvertParams& p) {
  const ConfigReader config = ConfigReader::load(src / "config.json");
  const SafeTensors st = SafeTensors::open(src);
  check_not_quantized(src, config, st);
  const DType dtype = p.dtype.value_or(default_convert_dtype(st));
  const bool fp8 = p.target == ConvertTarget::fp8;
  const ConvertPlan plan = fp8 ? plan_fp8_conversion(st, dtype, p.shard_bytes)
                               : plan_conversion(st, p.bits, p.group_size, dtype, p.shard_bytes);
  size_t source_total = 0;
  for (const ConvertStep& s : plan.steps) source_total += st.info(s.source).nbytes;

  ConvertSummary sum;
  sum.dtype = dtype;
  nlohmann::json weight_map = nlohmann::json::object();
  size_t source_done = 0;
  for (size_t i = 0; i < plan.shards.size(); ++i) {
    const std::string file = shard_file_name(i, plan.shards.size());
    std::vector<TensorSpec> specs;
    for (size_t si : plan.shards[i])
      for (const auto& spec : plan.steps[si].outputs) {
        specs.push_back(spec);
        weight_map[spec.name] = file;
      }
    SafeTensorsWriter writer(dst / file, std::move(specs), {{"format", fp8 ? "pt" : "mlx"}});
    for (size_t si : plan.shards[i]) {
      const ConvertStep& s = plan.steps[si];
      const Array a = st.get(s.source);
      if (s.quantize && fp8) {
        const Fp8Rows q = quantize_fp8_rows(a, dtype);
        writer.write(s.outputs[0].name, q.codes);
        writer.write(s.outputs[1].name, q.scales);
        ++sum.n_quantized;
      } else if (s.quantize) {
        const QuantizedMatrix q = quantize_affine(a, p.bits, p.group_size, dtype);
        writer.write(s.outputs[0].name, q.packed);
        writer.write(s.outputs[1].name, q.scales);
        writer.write(s.outputs[2].name, q.biases);
        ++sum.n_quantized;
      } else {
        writer.write(s.outputs[0].name, a.dtype() == s.outputs[0].dtype ? a : ops::cast(a, s.outputs[0].dtype));
        ++sum.n_dense;
      }
      source_done += st.info(s.source).nbytes;
      if (p.progress) p.progress(source_done, source_total);
    }
    writer.close();
  }
  if (plan.shards.size() > 1)
    write_json(dst / "model.safetensors.index.json",
               {{"metadata", {{"total_size", plan.total_bytes}}}, {"weight_map", weight_map}});

  nlohmann::json cfg = config.json();
  if (fp8) {
    const nlohmann::json scheme = {{"num_bits", 8}, {"type", "float"}, {"symmetric", true}};
    nlohmann::json weights = scheme, acts = scheme;
    weights["strategy"] = "channel";
    weights["dynamic"] = false;
    acts["strategy"] = "token";
    acts["dynamic"] = true;
    if (!p.fp8_activations) acts = nullptr;  // weights-only FP8
    cfg["quantization_config"] = {
        {"quant_method", "compressed-tensors"},
        {"format", "float-quantized"},
        {"quantization_status", "compressed"},
        {"ignore", {"lm_head"}},
        {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", acts}}}}}};
  } else {
    const nlohmann::json quant = {{"group_size", p.group_size}, {"bits", p.bits}};
    cfg["quantization"] = quant;
    cfg["quantization_config"] = quant;
  }
  for (const char* key : {"torch_dtype", "dtype"})
    if (cfg.contains(key) && cfg[key].is_string()) cfg[key] = dtype == DType::f16 ? "float16" : "bfloat16";
  write_json(dst / "config.json", cfg);
  for (const char* name : kCopiedFiles)
    if (fs::exists(src / name)) fs::copy_file(src / name, dst / name);
  sum.bytes = plan.total_bytes;
  sum.n_files = plan.shards.size();
  return sum;
}

}  // namespace osprey
