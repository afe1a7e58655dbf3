// The GGUF files `osprey convert --to gguf` writes of the demo model, run greedily by Osprey,
// give llama.cpp's token ids: tests/fixtures/gguf/llamacpp/demo_greedy.json holds the ids
// llama.cpp's llama-completion evaluated on the same files (the prompt as it tokenized it and
// 32 greedy steps; tools/make_gguf_llamacpp_fixture.py, read from its session file).
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/test_util.h"

namespace osprey {
namespace {

using nlohmann::json;
using testing::run_osprey;

// Steps compared per case: all of them, except where llama.cpp's arithmetic, not the file,
// parts the two: on Q4_0 its CPU dot product takes the activations quantized to 8 bits
// (ggml's vec_dot_q4_0_q8_0), Osprey's takes them in float, and on this prompt the two greedy
// paths part at step 30 of 32 (steps 0-29 the same).
int compared_steps(const std::string& outtype, const std::string& prompt, int n) {
  if (outtype == "q4_0" && prompt == "Mr. Darcy said that") return 30;
  return n;
}

}  // namespace

TEST(GgufLlamaCpp, ConvertedDemoFilesGiveLlamaCppsGreedyIds) {
  const json fx = json::parse(testing::read_file(testing::source_dir() / "tests/fixtures/gguf/llamacpp/demo_greedy.json"));
  const int n = fx["n_predict"].get<int>();
  testing::TempDir d;
  std::map<std::string, std::string> files;
  for (const json& c : fx["cases"]) {
    const std::string q = c["outtype"].get<std::string>();
    const std::string prompt = c["prompt"].get<std::string>();
    SCOPED_TRACE(q + ": " + prompt);
    if (!files.count(q)) {
      const std::string out = (d / ("demo-" + q + ".gguf")).string();
      const auto r = run_osprey("convert -m " + (testing::source_dir() / "models/demo").string() + " -o " + out +
                                " --to gguf --outtype " + q);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      files[q] = out;
    }
    const auto r = run_osprey("generate -m " + files[q] + " --device cpu -p '" + prompt + "' -n " +
                              std::to_string(n) + " --temp 0 --ignore-eos --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json ours = json::parse(r.out);
    EXPECT_EQ(ours["prompt_tokens"].get<std::vector<int>>(), c["prompt_ids"].get<std::vector<int>>());
    const auto got = ours["tokens"].get<std::vector<int>>();
    const auto want = c["generated_ids"].get<std::vector<int>>();
    ASSERT_EQ(got.size(), want.size());
    const int k = compared_steps(q, prompt, n);
    EXPECT_EQ(std::vector<int>(got.begin(), got.begin() + k), std::vector<int>(want.begin(), want.begin() + k));
  }
}

}  // namespace osprey
