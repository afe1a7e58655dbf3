// The commands on a GGUF file given to -m (tests/fixtures/gguf/llama.gguf: the llama fixture
// converted by tools/make_gguf_fixtures.py, with a small byte-level BPE tokenizer and a chat
// template in its metadata).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using nlohmann::json;
using testing::run_osprey;

// The first greedy prompt of a fixture's reference (transformers measured its greedy steps'
// top-2 margins: at least 0.038 over the fixtures): a prompt without near ties, where an
// arbitrary one may hold a tie that two equal models in different float orders break apart
// (a GGUF Llama rotates interleaved q/k pairs, so its attention scores sum in another order).
std::string reference_prompt(const std::filesystem::path& fixture) {
  const SafeTensors ref = SafeTensors::open_file(fixture / "reference.safetensors");
  std::string ids;
  for (int32_t t : testing::ints(ref.get("greedy_prompt_0"))) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  return ids;
}

std::string gguf() { return (testing::source_dir() / "tests/fixtures/gguf/llama.gguf").string(); }
std::string folder() { return (testing::source_dir() / "tests/fixtures/models/llama").string(); }

}  // namespace

TEST(CliGguf, GenerateGivesTheSafetensorsCheckpointsTokens) {
  const std::string flags = " --device cpu --token-ids " + reference_prompt(folder()) + " -n 16 --ignore-eos --json";
  const auto a = run_osprey("generate -m " + gguf() + flags);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  const auto b = run_osprey("generate -m " + folder() + flags);
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(json::parse(a.out)["tokens"], json::parse(b.out)["tokens"]);
  EXPECT_EQ(json::parse(a.out)["tokens"].size(), 16u);
}

TEST(CliGguf, TokenizerAndChatTemplateComeFromTheMetadata) {
  const auto t = run_osprey("tokenize -m " + gguf() + " 'the truth'");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_FALSE(t.out.empty());
  const auto g = run_osprey("generate -m " + gguf() + " --device cpu -p 'It is a truth' -n 4 --ignore-eos");
  ASSERT_EQ(g.exit_code, 0) << g.err;
  const auto c = run_osprey("generate -m " + gguf() + " --device cpu --chat -p 'hello' -n 4 --ignore-eos");
  ASSERT_EQ(c.exit_code, 0) << c.err;
}

TEST(CliGguf, BenchRunsOnAGgufFile) {
  const auto r = run_osprey("bench -m " + gguf() + " --device cpu -p 8 -n 4 -r 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

TEST(CliGguf, AMalformedFileIsAnErrorNamingIt) {
  testing::TempDir d;
  testing::write_file(d / "bad.gguf", "GGUF\x03\0\0\0");
  const auto r = run_osprey("generate -m " + (d / "bad.gguf").string() + " --token-ids 1 -n 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("bad.gguf: truncated"), std::string::npos) << r.err;
}

}  // namespace osprey
