#include <map>
#include <mutex>

#include "core/error.h"
#include "core/file_read.h"
#include "core/log.h"
#include "formats/config_reader.h"
#include "formats/family_formats.h"
#include "formats/gguf_model.h"
#include "formats/safetensors.h"
#include "model/model.h"

namespace osprey {

// Built-in families: one registration function per family file.
void register_llama_family();
void register_qwen2_family();
void register_gemma3_family();
void register_cohere2_family();
void register_qwen3_family();
void register_mistral_family();
void register_qwen3_moe_family();
void register_mixtral_family();

namespace {

// One line a family file. A checkpoint type with the layout of a registered one is an alias:
// one row in formats/family_formats.cpp naming the family it reads as.
constexpr void (*kFamilies[])() = {register_llama_family,   register_qwen2_family,     register_gemma3_family,
                                   register_cohere2_family, register_qwen3_family,     register_mistral_family,
                                   register_qwen3_moe_family, register_mixtral_family};

std::map<std::string, FamilyLoader>& table() {
  static std::map<std::string, FamilyLoader> m;
  return m;
}

const std::map<std::string, FamilyLoader>& families() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (void (*register_fn)() : kFamilies) register_fn();
  });
  return table();
}

}  // namespace

void register_family(const std::string& model_type, FamilyLoader loader) { table()[model_type] = std::move(loader); }

std::vector<std::string> registered_families() {
  std::vector<std::string> out;
  for (const auto& [name, loader] : families()) out.push_back(name);
  for (const FamilyFormats& f : family_formats())
    if (f.reads_as && families().count(f.reads_as) && !families().count(f.model_type)) out.push_back(f.model_type);
  return out;
}

namespace {

// Runs the family that `config` names over `weights`, and merges the config's special tokens
// into the model's info.
std::unique_ptr<Model> load_family(const ConfigReader& config, const SafeTensors& weights, const LoadOptions& options) {
  const std::string model_type = config.get_string("model_type");
  auto it = families().find(model_type);
  // An alias (formats/family_formats.h) runs the family it reads as.
  if (it == families().end())
    if (const char* family = family_reads_as(model_type)) it = families().find(family);
  if (it == families().end()) {
    std::string supported;
    for (const auto& name : registered_families()) supported += (supported.empty() ? "" : ", ") + name;
    throw Unsupported(config.where() + ": model_type \"" + model_type + "\" is not supported (supported: " +
                      supported + ")");
  }
  std::unique_ptr<Model> model = it->second(config, weights, options);

  ModelInfo& info = model->mutable_info();
  info.device = options.device;
  auto add_eos = [&](const std::vector<int32_t>& ids) {
    for (int32_t id : ids)
      if (std::find(info.eos_ids.begin(), info.eos_ids.end(), id) == info.eos_ids.end()) info.eos_ids.push_back(id);
  };
  add_eos(config.get_int_list("eos_token_id"));
  if (config.has("bos_token_id")) info.bos_id = config.get_token_id("bos_token_id");
  return model;
}

}  // namespace

std::unique_ptr<Model> load_model(const std::filesystem::path& dir, const LoadOptions& options) {
  if (is_gguf_path(dir)) {
    const GgufFile gguf = GgufFile::open(dir);
    const GgufCheckpoint checkpoint = read_gguf_checkpoint(gguf);
    std::unique_ptr<Model> model = load_family(checkpoint.config, checkpoint.tensors, options);
    log_debug("loaded " + dir.string() + ": " + model->info().model_type + " from GGUF, " +
              std::to_string(model->info().n_layers) + " layers");
    return model;
  }
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) throw IoError("model folder " + dir.string() + " does not exist");
  if (!std::filesystem::is_directory(dir, ec)) throw IoError(dir.string() + " is not a model folder");
  ConfigReader config = ConfigReader::load(dir / "config.json");
  const SafeTensors weights = SafeTensors::open(dir);
  std::unique_ptr<Model> model = load_family(config, weights, options);
  ModelInfo& info = model->mutable_info();
  auto add_eos = [&](const std::vector<int32_t>& ids) {
    for (int32_t id : ids)
      if (std::find(info.eos_ids.begin(), info.eos_ids.end(), id) == info.eos_ids.end()) info.eos_ids.push_back(id);
  };
  if (regular_file_exists(dir / "generation_config.json")) {
    ConfigReader gen = ConfigReader::load(dir / "generation_config.json");
    add_eos(gen.get_int_list("eos_token_id"));
    if (!info.bos_id && gen.has("bos_token_id")) info.bos_id = gen.get_token_id("bos_token_id");
  }
  log_debug("loaded " + dir.string() + ": " + info.model_type + ", " + std::to_string(info.n_layers) + " layers, " +
            std::to_string(info.weight_bytes) + " weight bytes (" + dtype_name(info.weight_dtype) + ")");
  return model;
}

}  // namespace osprey
