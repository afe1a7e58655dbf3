#include "support/scripted_model.h"

#include <cstring>
#include <mutex>

#include <nlohmann/json.hpp>

#include "core/array.h"
#include "core/error.h"
#include "formats/config_reader.h"
#include "model/blocks.h"
#include "model/model.h"
#include "support/test_util.h"

namespace osprey::testing {
namespace {

constexpr int64_t kHeadDim = 8;

class ScriptedModel : public Model {
 public:
  ScriptedModel(const ConfigReader& c) {
    info_.model_type = "osprey_test_script";
    info_.vocab_size = c.get_int("vocab_size");
    info_.hidden_size = kHeadDim;
    info_.n_layers = 1;
    info_.max_position_embeddings = c.get_int("max_position_embeddings");
    info_.weight_dtype = DType::f32;
    start_ = c.get_int("script_start");
    script_ = c.get_int_list("script");
    eos_ = c.get_int_list("eos_token_id").at(0);
    device_lost_at_ = c.get_int("device_lost_at", -1);
  }
  bool replayable_step() const override { return false; }

 protected:
  KVCacheParams layer_cache_params(int64_t, const KVCacheParams& params) const override {
    return layer_kv_params(params, 1, kHeadDim, DType::f16, 0);
  }

  Array forward_tokens(const Array& tokens, const Array& positions, SequenceCache& cache, bool all_logits) override {
    const int64_t n = tokens.numel();
    if (device_lost_at_ >= 0 && int64_t(positions.data<int32_t>()[n - 1]) >= device_lost_at_)
      throw DeviceLost("injected device failure at position " + std::to_string(device_lost_at_));
    Array k = Array::zeros({n, 1, kHeadDim}, DType::f32), v = Array::zeros({n, 1, kHeadDim}, DType::f32);
    cache.layer(0).update_and_fetch(k, v, positions);
    const int64_t rows = all_logits ? n : 1;
    Array logits = Array::zeros({rows, info_.vocab_size}, DType::f32);
    const int32_t* pos = positions.data<int32_t>();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t next = int64_t(pos[all_logits ? r : n - 1]) + 1 - start_;
      const int32_t id = next >= 0 && next < int64_t(script_.size()) ? script_[size_t(next)] : eos_;
      logits.data<float>()[r * info_.vocab_size + id] = 30.0f;
    }
    return logits;
  }

 private:
  int64_t start_ = 0;
  std::vector<int32_t> script_;
  int32_t eos_ = 0;
  int64_t device_lost_at_ = -1;
};

}  // namespace

void register_scripted_family() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_family("osprey_test_script", [](const ConfigReader& c, const SafeTensors&, const LoadOptions& o) {
      if (!o.device.is_cpu()) throw Unsupported("osprey_test_script runs on the CPU only");
      return std::unique_ptr<Model>(new ScriptedModel(c));
    });
  });
}

void write_scripted_model(const std::filesystem::path& dir, const std::filesystem::path& tokenizer_dir,
                          int64_t vocab_size, int32_t eos_id, int64_t script_start, const std::vector<int32_t>& script,
                          int64_t device_lost_at) {
  std::filesystem::create_directories(dir);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(tokenizer_dir / f, dir / f, std::filesystem::copy_options::overwrite_existing);
  nlohmann::json config = {{"model_type", "osprey_test_script"},
                           {"vocab_size", vocab_size},
                           {"max_position_embeddings", 4096},
                           {"eos_token_id", eos_id},
                           {"script_start", script_start},
                           {"script", script}};
  if (device_lost_at >= 0) config["device_lost_at"] = device_lost_at;
  write_file(dir / "config.json", config.dump());
  const std::string header = R"({"dummy":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  std::string file(8, '\0');
  const uint64_t len = header.size();
  std::memcpy(file.data(), &len, 8);
  file += header;
  file += std::string(4, '\0');
  write_file(dir / "model.safetensors", file);
}

}  // namespace osprey::testing
