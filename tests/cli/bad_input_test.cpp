// Bad input through the CLI: each case exits non-zero with a message naming the problem,
// and never crashes (a crash shows as exit code >= 128).
#include <gtest/gtest.h>

#include <cstring>

#include "backend/ops.h"
#include "formats/safetensors.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using testing::run_osprey;
using testing::TempDir;
using testing::tiny_llama_config;
using testing::write_file;
using testing::write_tiny_llama;

void expect_error(const testing::CommandResult& r, const std::string& needle, int code = 1) {
  EXPECT_EQ(r.exit_code, code) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err;
}

std::string gen(const TempDir& d) { return "generate -m " + d.path().string() + " --token-ids 1,2,3 -n 2"; }

// Rewrites model.safetensors with the given transformation of its bytes.
void mangle(const TempDir& d, const std::function<void(std::string&)>& f) {
  std::string bytes = testing::read_file(d / "model.safetensors");
  f(bytes);
  write_file(d / "model.safetensors", bytes);
}

// `generate` from the tiny Llama whose config.json, after its weights were written, says
// `field` is `value`.
testing::CommandResult generate_with_config(const std::string& field, const nlohmann::json& value) {
  TempDir d;
  auto cfg = tiny_llama_config();
  write_tiny_llama(d.path(), cfg);
  cfg[field] = value;
  write_file(d / "config.json", cfg.dump());
  return run_osprey(gen(d));
}

}  // namespace

TEST(CliBadInput, ValidTinyModelGenerates) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  auto r = run_osprey(gen(d) + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"tokens\""), std::string::npos) << r.out;
}

TEST(CliBadInput, MissingModelFolder) { expect_error(run_osprey("generate -m /nonexistent/model --token-ids 1"), "/nonexistent/model"); }

TEST(CliBadInput, MissingSafetensors) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  std::filesystem::remove(d / "model.safetensors");
  expect_error(run_osprey(gen(d)), "no .safetensors");
}

TEST(CliBadInput, TruncatedSafetensors) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  mangle(d, [](std::string& b) { b.resize(5); });
  expect_error(run_osprey(gen(d)), "truncated");
}

TEST(CliBadInput, TruncatedTensorData) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  mangle(d, [](std::string& b) { b.resize(b.size() - 100); });
  expect_error(run_osprey(gen(d)), "out of bounds");
}

TEST(CliBadInput, HeaderLengthPastEndOfFile) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  mangle(d, [](std::string& b) {
    uint64_t n = uint64_t(b.size()) * 2;
    std::memcpy(b.data(), &n, 8);
  });
  expect_error(run_osprey(gen(d)), "runs past the end of the file");
}

TEST(CliBadInput, MalformedJsonHeader) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  mangle(d, [](std::string& b) { b[8] = '['; b[9] = '{'; });
  expect_error(run_osprey(gen(d)), "malformed JSON header");
}

TEST(CliBadInput, DtypeOtherThanTheConfigImplies) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  SafeTensors st = SafeTensors::open(d.path());
  std::vector<std::pair<std::string, Array>> tensors;
  for (const auto& name : st.names())
    tensors.emplace_back(name, name == "model.layers.1.mlp.up_proj.weight" ? ops::cast(st.get(name), DType::f32) : st.get(name));
  write_safetensors(d / "model2.safetensors.tmp", tensors);
  std::filesystem::rename(d / "model2.safetensors.tmp", d / "model.safetensors");
  expect_error(run_osprey(gen(d)), "model.layers.1.mlp.up_proj.weight");
}

TEST(CliBadInput, ShapeOtherThanTheConfigImplies) {
  auto r = generate_with_config("intermediate_size", 40);
  expect_error(r, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_NE(r.err.find("[40, 32]"), std::string::npos) << r.err;
}

TEST(CliBadInput, MissingTensor) {
  expect_error(generate_with_config("num_hidden_layers", 3), "missing tensor model.layers.2.");
}

TEST(CliBadInput, UnsupportedModelTypeIsNamed) {
  TempDir d;
  auto cfg = tiny_llama_config();
  cfg["model_type"] = "mamba";
  write_tiny_llama(d.path(), cfg);
  expect_error(run_osprey(gen(d)), "model_type \"mamba\"");
}

TEST(CliBadInput, MalformedConfigJson) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  write_file(d / "config.json", "{\"model_type\": \"llama\", ");
  expect_error(run_osprey(gen(d)), "config.json: malformed JSON");
}

TEST(CliBadInput, ConfigFieldOfTheWrongTypeIsNamed) {
  expect_error(generate_with_config("num_attention_heads", "four"), "num_attention_heads");
}

TEST(CliBadInput, UnknownFlag) {
  auto r = run_osprey("generate --no-such-flag");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--no-such-flag"), std::string::npos) << r.err;
}

TEST(CliBadInput, TokenIdOutsideTheVocabulary) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  expect_error(run_osprey("generate -m " + d.path().string() + " --token-ids 1,64"), "64");
  expect_error(run_osprey("generate -m " + d.path().string() + " --token-ids 1,x"), "\"x\"", 2);
}

TEST(CliBadInput, PromptWithoutTokenizer) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  expect_error(run_osprey("generate -m " + d.path().string() + " -p hello"), "tokenizer.json");
}

}  // namespace osprey
