// --cache-type-k / --cache-type-v (and llama.cpp's -ctk / -ctv) on the demo model: generate's
// --json and bench's report name the types and the cache's bytes (q8_0 takes 34 bytes per 32
// elements, fp8 4 + 64 per row of 64, f16 128); an unknown type is a usage error listing the
// accepted ones; a prompt-cache file written with one type is not used by a run of another.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/test_util.h"

namespace osprey {
namespace {

using nlohmann::json;
using testing::run_osprey;

std::string demo() { return (testing::source_dir() / "models/demo").string(); }

// The demo model: 8 layers, 2 kv heads of head_dim 64 (models/demo/config.json).
constexpr uint64_t kRowsPerToken = 8 * 2;

}  // namespace

TEST(CliCacheTypes, GenerateReportsTheTypesAndBytes) {
  struct Case {
    std::string flags;
    std::string k, v;
    uint64_t row_k, row_v;  // bytes of one head's row
  };
  const Case cases[] = {{"", "f16", "f16", 128, 128},
                        {"--cache-type-k q8_0 --cache-type-v q8_0", "q8_0", "q8_0", 68, 68},
                        {"-ctk fp8 -ctv f16", "fp8", "f16", 68, 128},
                        {"-ctv fp8", "f16", "fp8", 128, 68}};
  for (const Case& c : cases) {
    const auto r = run_osprey("generate -m " + demo() + " --device cpu -q --json -n 6 --ignore-eos --token-ids 1,57,301 " +
                              c.flags);
    ASSERT_EQ(r.exit_code, 0) << c.flags << ": " << r.err;
    const json j = json::parse(r.out);
    EXPECT_EQ(j["kv_cache"]["type_k"], c.k) << c.flags;
    EXPECT_EQ(j["kv_cache"]["type_v"], c.v) << c.flags;
    // The cache holds the prompt and the reply but its last token: 3 + 6 - 1 positions.
    EXPECT_EQ(j["kv_cache"]["bytes"].get<uint64_t>(), 8 * kRowsPerToken * (c.row_k + c.row_v)) << c.flags;
  }
}

TEST(CliCacheTypes, BenchReportsTheTypesAndBytes) {
  const auto r = run_osprey("bench -m " + demo() + " --device cpu -p 0 -n 4 -r 1 --warmup 0 -o json -ctk q8_0 -ctv fp8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["kv"]["type_k"], "q8_0");
  EXPECT_EQ(j["kv"]["type_v"], "fp8");
  EXPECT_EQ(j["kv"]["bytes_per_token"].get<uint64_t>(), kRowsPerToken * (68 + 68));
  EXPECT_EQ(j["tests"][0]["kv"]["cache_bytes"].get<uint64_t>(), 4 * kRowsPerToken * (68 + 68));
}

TEST(CliCacheTypes, AnUnknownTypeIsAUsageErrorListingTheAccepted) {
  for (const std::string cmd : {"generate", "bench", "chat", "serve", "perplexity"}) {
    const auto r = run_osprey(cmd + " -m " + demo() + " --cache-type-v q4_0");
    EXPECT_EQ(r.exit_code, 2) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find("--cache-type-v: unknown KV cache type 'q4_0' (accepted: f16, bf16, q8_0, fp8)"),
              std::string::npos)
        << cmd << ": " << r.err;
  }
  const auto r = run_osprey("generate -m " + demo() + " -ctk int4");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--cache-type-k: unknown KV cache type 'int4'"), std::string::npos) << r.err;
}

TEST(CliCacheTypes, APromptCacheFileOfAnotherTypeIsNotUsed) {
  testing::TempDir d;
  const std::string file = (d / "session.bin").string();
  const std::string base = "generate -m " + demo() + " --device cpu --json -n 4 --ignore-eos --token-ids 1,57,301,9,120 " +
                           "--prompt-cache " + file;
  const auto first = run_osprey(base + " -ctk q8_0 -ctv q8_0");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  // The same types: the prompt but its last token comes from the file.
  const auto same = run_osprey(base + " -ctk q8_0 -ctv q8_0");
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_EQ(json::parse(same.out)["cached_tokens"], 4);
  // Another type: skipped, naming the layouts' types.
  const auto other = run_osprey(base + " -ctk f16 -ctv q8_0");
  ASSERT_EQ(other.exit_code, 0) << other.err;
  EXPECT_EQ(json::parse(other.out)["cached_tokens"], 0);
  EXPECT_NE(other.err.find("float16/q8_0"), std::string::npos) << other.err;
  EXPECT_NE(other.err.find("\"q8_0\""), std::string::npos) << other.err;
}

}  // namespace osprey
