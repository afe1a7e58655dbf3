#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "core/array.h"
#include "core/half.h"
#include "formats/safetensors.h"
#include "support/test_util.h"

namespace osprey::testing {

namespace fs = std::filesystem;

TempDir::TempDir() {
  static int counter = 0;
  path_ = fs::temp_directory_path() / ("osprey-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  fs::remove_all(path_);
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json tiny_llama_config() {
  return {{"model_type", "llama"},        {"vocab_size", 64},           {"hidden_size", 32},
          {"intermediate_size", 48},      {"num_hidden_layers", 2},     {"num_attention_heads", 4},
          {"num_key_value_heads", 2},     {"rms_norm_eps", 1e-5},       {"rope_theta", 10000.0},
          {"max_position_embeddings", 512}, {"tie_word_embeddings", false}, {"eos_token_id", 2},
          {"bos_token_id", 1}};
}

void write_tiny_llama(const fs::path& dir, const nlohmann::json& config, uint32_t seed) {
  fs::create_directories(dir);
  write_file(dir / "config.json", config.dump(2));
  const int64_t v = config["vocab_size"], h = config["hidden_size"], f = config["intermediate_size"];
  const int64_t n_heads = config["num_attention_heads"], n_kv = config["num_key_value_heads"];
  const int64_t hd = h / n_heads;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.2f);
  std::vector<std::pair<std::string, Array>> tensors;
  auto add = [&](const std::string& name, Shape shape, float offset = 0.0f) {
    Array a = Array::empty(shape, DType::bf16);
    for (int64_t i = 0; i < a.numel(); ++i) a.data<uint16_t>()[i] = f32_to_bf16(offset + dist(rng));
    tensors.emplace_back(name, a);
  };
  add("model.embed_tokens.weight", {v, h});
  for (int64_t l = 0; l < int64_t(config["num_hidden_layers"]); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {h}, 1.0f);
    add(p + "post_attention_layernorm.weight", {h}, 1.0f);
    add(p + "self_attn.q_proj.weight", {n_heads * hd, h});
    add(p + "self_attn.k_proj.weight", {n_kv * hd, h});
    add(p + "self_attn.v_proj.weight", {n_kv * hd, h});
    add(p + "self_attn.o_proj.weight", {h, n_heads * hd});
    add(p + "mlp.gate_proj.weight", {f, h});
    add(p + "mlp.up_proj.weight", {f, h});
    add(p + "mlp.down_proj.weight", {h, f});
  }
  add("model.norm.weight", {h}, 1.0f);
  if (!config.value("tie_word_embeddings", false)) add("lm_head.weight", {v, h});
  write_safetensors(dir / "model.safetensors", tensors);
}

fs::path source_dir() { return OSPREY_SOURCE_DIR; }

Array tokens_of(const std::vector<int32_t>& ids) {
  Array a = Array::empty({int64_t(ids.size())}, DType::i32);
  std::copy(ids.begin(), ids.end(), a.data<int32_t>());
  return a;
}

std::vector<int32_t> ints(const Array& a) { return {a.data<int32_t>(), a.data<int32_t>() + a.numel()}; }

double relative_row_error(const float* ours, const float* ref, int64_t vocab) {
  double lo = ref[0], hi = ref[0], err = 0;
  for (int64_t j = 0; j < vocab; ++j) {
    lo = std::min<double>(lo, ref[j]);
    hi = std::max<double>(hi, ref[j]);
    err = std::max(err, std::fabs(double(ours[j]) - double(ref[j])));
  }
  return err / (hi - lo);
}

void expect_kv_write_switch_keeps_tokens(const std::string& args, size_t n_tokens, nlohmann::json& on,
                                         nlohmann::json& off) {
  const CommandResult r_on = run_osprey(args, "OSPREY_KV_INPLACE_WRITE=1");
  const CommandResult r_off = run_osprey(args, "OSPREY_KV_INPLACE_WRITE=0");
  ASSERT_EQ(r_on.exit_code, 0) << r_on.err;
  ASSERT_EQ(r_off.exit_code, 0) << r_off.err;
  on = nlohmann::json::parse(r_on.out);
  off = nlohmann::json::parse(r_off.out);
  ASSERT_EQ(on["tokens"].size(), n_tokens);
  EXPECT_EQ(on["tokens"], off["tokens"]);
}

std::string error_code(const std::string& body) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains("error") || !j["error"].contains("code") || !j["error"]["code"].is_string())
    return "(no error code in: " + body + ")";
  return j["error"]["code"].get<std::string>();
}

std::vector<std::string> prompt_cache_files(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir / "auto"))
    if (e.path().filename().string()[0] != '.') out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

CommandResult run_osprey(const std::string& args, const std::string& env) {
  static int counter = 0;
  const fs::path base = fs::temp_directory_path() / ("osprey-cmd-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  const std::string cmd = env + " " + std::string(OSPREY_BINARY) + " " + args + " >" + base.string() + ".out 2>" +
                          base.string() + ".err </dev/null";
  int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(base.string() + ".out");
  r.err = read_file(base.string() + ".err");
  fs::remove(base.string() + ".out");
  fs::remove(base.string() + ".err");
  return r;
}

}  // namespace osprey::testing
