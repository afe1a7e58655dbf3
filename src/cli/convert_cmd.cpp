// osprey convert: a Hugging Face safetensors checkpoint -> an MLX affine-quantized one, in the
// layout mlx-lm's converter writes: `<module>.weight` (u32), `.scales`, `.biases` for every
// linear layer and embedding whose input size the group divides, everything else copied in
// the chosen dtype, config.json with "quantization" and "quantization_config", and shards
// of at most 5 GiB with model.safetensors.index.json. Tensors are converted one at a time.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "backend/quant.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/config_reader.h"
#include "model/quantize.h"
#include "model/safetensors.h"

namespace osprey::cli {
namespace {
namespace fs = std::filesystem;

struct ConvertOptions {
  std::string model;
  std::string output;
  int bits = 4;
  int group_size = 64;
  std::string dtype;
  int64_t shard_mib = 5120;
  int threads = -1;
};

// One source tensor and what becomes of it.
struct Step {
  std::string source;
  bool quantize = false;
  std::vector<TensorSpec> outputs;  // quantized: weight, scales, biases; else the one copy
  size_t nbytes() const {
    size_t n = 0;
    for (const auto& o : outputs) n += o.nbytes();
    return n;
  }
};

const char* const kCopiedFiles[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                                    "special_tokens_map.json"};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

DType parse_dtype(const std::string& name) {
  if (name == "float16" || name == "f16" || name == "fp16") return DType::f16;
  if (name == "bfloat16" || name == "bf16") return DType::bf16;
  throw InvalidInput("--dtype: \"" + name + "\" is not supported (float16 or bfloat16)");
}

// The source's dtype for the scales and dense tensors when --dtype is not given: its 16-bit
// float type, or bfloat16 for a float32 checkpoint.
DType default_dtype(const SafeTensors& st) {
  for (const auto& name : st.names()) {
    const TensorInfo& ti = st.info(name);
    if (ti.shape.n == 2 && (ti.dtype == DType::f16 || ti.dtype == DType::bf16)) return ti.dtype;
  }
  return DType::bf16;
}

std::vector<Step> plan(const SafeTensors& st, int bits, int group_size, DType dtype) {
  std::vector<Step> steps;
  for (const auto& name : st.names()) {
    if (ends_with(name, ".rotary_emb.inv_freq")) continue;  // recomputed from the config
    const TensorInfo& ti = st.info(name);
    Step s;
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
  return steps;
}

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

std::string shard_name(size_t i, size_t n) {
  if (n == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

void write_json(const fs::path& path, const nlohmann::json& j) {
  std::ofstream out(path, std::ios::trunc);
  out << j.dump(4) << "\n";
  if (!out) throw IoError(path.string() + ": write failed");
}

struct Summary {
  size_t n_quantized = 0, n_dense = 0, bytes = 0, n_files = 0;
};

Summary convert(const ConvertOptions& o, const fs::path& src, const fs::path& dst, const ConfigReader& config,
                const SafeTensors& st, DType dtype) {
  const std::vector<Step> steps = plan(st, o.bits, o.group_size, dtype);
  // Shards in order, each at most shard_mib MiB (a larger single tensor gets a shard of its own).
  const size_t limit = size_t(o.shard_mib) << 20;
  std::vector<std::vector<const Step*>> shards(1);
  size_t in_shard = 0, total = 0, source_total = 0;
  for (const Step& s : steps) {
    if (in_shard > 0 && in_shard + s.nbytes() > limit) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&s);
    in_shard += s.nbytes();
    total += s.nbytes();
    source_total += st.info(s.source).nbytes;
  }

  Summary sum;
  nlohmann::json weight_map = nlohmann::json::object();
  ProgressBar bar("converting " + src.filename().string());
  size_t source_done = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = shard_name(i, shards.size());
    std::vector<TensorSpec> specs;
    for (const Step* s : shards[i])
      for (const auto& spec : s->outputs) {
        specs.push_back(spec);
        weight_map[spec.name] = file;
      }
    SafeTensorsWriter writer(dst / file, std::move(specs), {{"format", "mlx"}});
    for (const Step* s : shards[i]) {
      const Array a = st.get(s->source);
      if (s->quantize) {
        const QuantizedMatrix q = quantize_affine(a, o.bits, o.group_size, dtype);
        writer.write(s->outputs[0].name, q.packed);
        writer.write(s->outputs[1].name, q.scales);
        writer.write(s->outputs[2].name, q.biases);
        ++sum.n_quantized;
      } else {
        writer.write(s->outputs[0].name, a.dtype() == s->outputs[0].dtype ? a : ops::cast(a, s->outputs[0].dtype));
        ++sum.n_dense;
      }
      source_done += st.info(s->source).nbytes;
      bar.update(source_done, source_total);
    }
    writer.close();
  }
  bar.finish();
  if (shards.size() > 1)
    write_json(dst / "model.safetensors.index.json",
               {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});

  nlohmann::json cfg = config.json();
  const nlohmann::json quant = {{"group_size", o.group_size}, {"bits", o.bits}};
  cfg["quantization"] = quant;
  cfg["quantization_config"] = quant;
  for (const char* key : {"torch_dtype", "dtype"})
    if (cfg.contains(key) && cfg[key].is_string()) cfg[key] = dtype == DType::f16 ? "float16" : "bfloat16";
  write_json(dst / "config.json", cfg);
  for (const char* name : kCopiedFiles)
    if (fs::exists(src / name)) fs::copy_file(src / name, dst / name);
  sum.bytes = total;
  sum.n_files = shards.size();
  return sum;
}

int run_convert(const ConvertOptions& o) {
  if (o.threads >= 0) set_cpu_threads(o.threads);
  if (!supported_quant_bits(o.bits))
    throw InvalidInput("--q-bits: " + std::to_string(o.bits) + " is not supported (2, 3, 4, 6 or 8)");
  if (!supported_group_size(o.group_size))
    throw InvalidInput("--q-group-size: " + std::to_string(o.group_size) + " is not supported (32, 64 or 128)");
  if (o.shard_mib < 1) throw InvalidInput("--max-shard-mib: must be at least 1");
  std::optional<DType> dtype;
  if (!o.dtype.empty()) dtype = parse_dtype(o.dtype);

  const fs::path src = o.model, dst = o.output;
  std::error_code ec;
  if (!fs::is_directory(src, ec)) throw IoError("-m " + src.string() + ": model folder does not exist");
  const ConfigReader config = ConfigReader::load(src / "config.json");
  const SafeTensors st = SafeTensors::open(src);
  check_not_quantized(src, config, st);
  if (fs::exists(dst, ec) && (!fs::is_directory(dst, ec) || !fs::is_empty(dst, ec)))
    throw InvalidInput("-o " + dst.string() + ": exists and is not an empty folder; refusing to overwrite it");
  if (!dtype) dtype = default_dtype(st);

  const bool created = !fs::exists(dst, ec);
  fs::create_directories(dst, ec);
  if (ec) throw IoError("-o " + dst.string() + ": cannot create the folder: " + ec.message());
  Summary s;
  try {
    s = convert(o, src, dst, config, st, *dtype);
  } catch (...) {
    if (created) fs::remove_all(dst, ec);
    else
      for (const auto& e : fs::directory_iterator(dst, ec)) fs::remove_all(e.path(), ec);
    throw;
  }
  std::fprintf(stderr, "converted %s: %zu tensors quantized (Q%d g%d, %s scales), %zu kept dense; %.1f MiB in %zu file%s -> %s\n",
               src.string().c_str(), s.n_quantized, o.bits, o.group_size, dtype_name(*dtype), s.n_dense,
               double(s.bytes) / (1024.0 * 1024.0), s.n_files, s.n_files == 1 ? "" : "s", dst.string().c_str());
  return 0;
}

}  // namespace

Command add_convert(CLI::App& app) {
  auto o = std::make_shared<ConvertOptions>();
  app.add_option("-m,--model", o->model, "Source model folder (Hugging Face safetensors, f16/bf16/f32)")->required();
  app.add_option("-o,--output", o->output, "Output folder (must not exist or be empty)")->required();
  app.add_option("--q-bits", o->bits, "Bits per weight: 2, 3, 4, 6 or 8");
  app.add_option("--q-group-size", o->group_size, "Weights per scale and bias: 32, 64 or 128");
  app.add_option("--dtype", o->dtype,
                 "float16 or bfloat16: scales, biases and unquantized tensors (default: the source's 16-bit "
                 "type; bfloat16 for a float32 source)");
  app.add_option("--max-shard-mib", o->shard_mib, "Largest output file in MiB (default 5120)");
  app.add_option("-t,--threads", o->threads, "CPU threads (default: OSPREY_THREADS or one per core)");
  return [o] { return run_convert(*o); };
}

}  // namespace osprey::cli
