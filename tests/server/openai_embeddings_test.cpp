// The official `openai` npm client (pinned in package.json) calling embeddings.create against
// the Qwen3-Embedding-layout fixture: floats, the SDK's own base64 decoding (its default),
// explicit base64, token ids, dimensions and a refusal.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "server/harness.h"
#include "support/family_harness.h"

namespace osprey {
namespace {

using nlohmann::json;

TEST(ServerOpenAIEmbeddings, TheNodeClientEmbedsInBothEncodings) {
  if (const std::string why = testing::node_client_missing("openai"); !why.empty()) GTEST_SKIP() << why;
  ServerOptions o = testing::demo_server_options();
  o.model_dir = testing::fixture_dir("qwen3-embedding");
  o.alias = "qwen3-embedding";
  testing::TestServer s(o);
  const json ref = json::parse(testing::read_file(o.model_dir / "reference.json"));
  json texts = json::array(), ids;
  std::vector<json> want;
  for (const json& input : ref["inputs"]) {
    if (input["text"].is_null()) {
      ids = input;
    } else if (texts.size() < 3) {
      texts.push_back(input["text"]);
      want.push_back(input);
    }
  }
  const auto [rc, out] = testing::run_node_script(
      "openai_embeddings.mjs", {std::to_string(s.port()), "qwen3-embedding", texts.dump(), ids["tokens"].dump()});
  ASSERT_EQ(rc, 0) << out;
  const json r = json::parse(out, nullptr, false);
  ASSERT_TRUE(r.is_object()) << out;

  EXPECT_EQ(r["model"], "qwen3-embedding");
  EXPECT_EQ(r["float_index"], json::array({0, 1, 2}));
  size_t n_tokens = 0;
  for (const json& w : want) n_tokens += w["tokens"].size();
  EXPECT_EQ(r["usage"]["prompt_tokens"], n_tokens);
  // Tolerance: tests/model/embedding_test.cpp (CPU, against the f16-K/V reference).
  auto worst = [](const json& a, const json& b) {
    double m = a.size() == b.size() ? 0 : INFINITY;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i)
      m = std::max(m, std::abs(a[i].get<double>() - b[i].get<double>()));
    return m;
  };
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE(worst(r["float"][i], want[i]["embedding_kv_f16"]), 1e-4) << i;
    // Base64 carries the same f32 values: equal, not near.
    EXPECT_EQ(r["sdk_decoded"][i], r["float"][i]) << i;
    EXPECT_EQ(r["base64_decoded"][i], r["float"][i]) << i;
  }
  EXPECT_LE(worst(r["tokens"], ids["embedding_kv_f16"]), 1e-4);
  ASSERT_EQ(r["dimensions"].size(), 16u);
  double ss = 0;
  for (const json& v : r["dimensions"]) ss += v.get<double>() * v.get<double>();
  EXPECT_NEAR(std::sqrt(ss), 1.0, 1e-5);
  EXPECT_EQ(r["empty"]["status"], 400);
  EXPECT_EQ(r["empty"]["param"], "input");
}

}  // namespace
}  // namespace osprey
