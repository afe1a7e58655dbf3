// POST /v1/embeddings over the embedding fixtures (tools/make_embedding_fixtures.py): every
// input form against reference.json (an independent numpy forward with sentence-transformers'
// pooling, see tests/model/embedding_test.cpp for the tolerances), base64 against the floats,
// Matryoshka `dimensions`, and the refusals, each named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "server/embeddings.h"
#include "server/harness.h"
#include "support/device_test.h"
#include "support/family_harness.h"

namespace osprey {
namespace {

using nlohmann::json;

json reference(const std::string& model) {
  return json::parse(testing::read_file(testing::fixture_dir(model) / "reference.json"));
}

ServerOptions embedding_server(const std::string& model, const Device& device = Device::cpu()) {
  ServerOptions o = testing::demo_server_options();
  o.model_dir = testing::fixture_dir(model);
  o.device = device;
  o.n_slots = 2;
  return o;
}

double max_abs_error(const json& ours, const json& ref) {
  EXPECT_EQ(ours.size(), ref.size());
  double worst = 0;
  for (size_t i = 0; i < ours.size() && i < ref.size(); ++i)
    worst = std::max(worst, std::abs(ours[i].get<double>() - ref[i].get<double>()));
  return worst;
}

// Decodes base64 to the floats it holds (little-endian f32), as OpenAI's SDKs do.
std::vector<float> decode_base64(const std::string& s) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  std::string bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    const int v = value(c);
    if (v < 0) break;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes += char((acc >> bits) & 0xff);
    }
  }
  std::vector<float> out(bytes.size() / 4);
  for (size_t i = 0; i < out.size(); ++i) {
    uint32_t u = 0;
    for (int b = 0; b < 4; ++b) u |= uint32_t(uint8_t(bytes[i * 4 + size_t(b)])) << (8 * b);
    std::memcpy(&out[i], &u, 4);
  }
  return out;
}

class EmbeddingsRoute : public testing::DeviceTestOf<testing::ModelCase> {
 protected:
  void SetUp() override {
    DeviceTestOf::SetUp();
    if (IsSkipped()) return;
    server_ = std::make_unique<testing::TestServer>(embedding_server(GetParam().model, device()));
    ref_ = reference(GetParam().model);
    for (const json& input : ref_["inputs"]) {
      if (input["text"].is_null())
        ids_input_ = input;
      else
        texts_.push_back(input);
    }
  }
  // The reply's embedding `i` against reference input `want` (the device's tolerance).
  void expect_matches(const json& reply, size_t i, const json& want) const {
    const json& e = reply["data"][i]["embedding"];
    if (on_cuda()) {
      EXPECT_LE(max_abs_error(e, want["embedding"]), 2e-3) << i;
    } else {
      EXPECT_LE(max_abs_error(e, want["embedding_kv_f16"]), 1e-4) << i;
      EXPECT_LE(max_abs_error(e, want["embedding"]), 2e-3) << i;
    }
  }
  std::unique_ptr<testing::TestServer> server_;
  json ref_, ids_input_;
  std::vector<json> texts_;
};

TEST_P(EmbeddingsRoute, EveryInputFormMatchesTheReference) {
  const std::string id = GetParam().model;
  // One string.
  auto [status, one] = server_->post_json("/v1/embeddings", {{"model", id}, {"input", texts_[0]["text"]}});
  ASSERT_EQ(status, 200) << one.dump();
  EXPECT_EQ(one["object"], "list");
  EXPECT_EQ(one["model"], id);
  ASSERT_EQ(one["data"].size(), 1u);
  EXPECT_EQ(one["data"][0]["object"], "embedding");
  EXPECT_EQ(one["data"][0]["index"], 0);
  expect_matches(one, 0, texts_[0]);
  EXPECT_EQ(one["usage"]["prompt_tokens"], texts_[0]["tokens"].size());
  EXPECT_EQ(one["usage"]["total_tokens"], texts_[0]["tokens"].size());

  // Every string at once.
  json texts = json::array();
  size_t n_tokens = 0;
  for (const json& t : texts_) {
    texts.push_back(t["text"]);
    n_tokens += t["tokens"].size();
  }
  auto [s2, all] = server_->post_json("/v1/embeddings", {{"input", texts}});
  ASSERT_EQ(s2, 200) << all.dump();
  ASSERT_EQ(all["data"].size(), texts_.size());
  for (size_t i = 0; i < texts_.size(); ++i) {
    EXPECT_EQ(all["data"][i]["index"], i);
    expect_matches(all, i, texts_[i]);
  }
  EXPECT_EQ(all["usage"]["prompt_tokens"], n_tokens);

  // One list of token ids, and lists of them.
  auto [s3, ids] = server_->post_json("/v1/embeddings", {{"input", ids_input_["tokens"]}});
  ASSERT_EQ(s3, 200) << ids.dump();
  expect_matches(ids, 0, ids_input_);
  EXPECT_EQ(ids["usage"]["prompt_tokens"], ids_input_["tokens"].size());
  auto [s4, lists] =
      server_->post_json("/v1/embeddings", {{"input", json::array({ids_input_["tokens"], texts_[1]["tokens"]})}});
  ASSERT_EQ(s4, 200) << lists.dump();
  expect_matches(lists, 0, ids_input_);
  expect_matches(lists, 1, texts_[1]);
}

// A string is tokenized as sentence-transformers does: with the post-processor's special
// tokens (here <|endoftext|> appended), as the independent tokenizer made the reference ids.
TEST_P(EmbeddingsRoute, StringsAreTokenizedWithTheirSpecialTokens) {
  for (const json& t : texts_) {
    auto [status, r] = server_->post_json("/tokenize", {{"content", t["text"]}, {"add_special", true}});
    ASSERT_EQ(status, 200);
    EXPECT_EQ(r["tokens"], t["tokens"]) << t["text"];
    EXPECT_EQ(r["tokens"].back(), 768);  // <|endoftext|>
  }
}

TEST_P(EmbeddingsRoute, Base64HoldsTheSameFloats) {
  json texts = json::array({texts_[0]["text"], texts_[2]["text"]});
  auto [s1, floats] = server_->post_json("/v1/embeddings", {{"input", texts}, {"encoding_format", "float"}});
  auto [s2, b64] = server_->post_json("/v1/embeddings", {{"input", texts}, {"encoding_format", "base64"}});
  ASSERT_EQ(s1, 200);
  ASSERT_EQ(s2, 200);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(b64["data"][i]["embedding"].is_string());
    const std::vector<float> decoded = decode_base64(b64["data"][i]["embedding"].get<std::string>());
    EXPECT_EQ(decoded, floats["data"][i]["embedding"].get<std::vector<float>>()) << i;
  }
}

TEST_P(EmbeddingsRoute, DimensionsTruncatesThenNormalizesWhereTheModelDoes) {
  auto [s1, full] = server_->post_json("/v1/embeddings", {{"input", texts_[3]["text"]}});
  auto [s2, cut] = server_->post_json("/v1/embeddings", {{"input", texts_[3]["text"]}, {"dimensions", 16}});
  ASSERT_EQ(s1, 200);
  ASSERT_EQ(s2, 200) << cut.dump();
  std::vector<float> want = full["data"][0]["embedding"].get<std::vector<float>>();
  ASSERT_EQ(want.size(), 64u);
  want.resize(16);
  const bool normalizes = ref_["normalize"].get<bool>();
  if (normalizes) {
    double ss = 0;
    for (float v : want) ss += double(v) * v;
    for (float& v : want) v = float(v / std::sqrt(ss));
  }
  const std::vector<float> got = cut["data"][0]["embedding"].get<std::vector<float>>();
  ASSERT_EQ(got.size(), 16u);
  for (size_t i = 0; i < 16; ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << i;
  auto [s3, whole] = server_->post_json("/v1/embeddings", {{"input", texts_[3]["text"]}, {"dimensions", 64}});
  ASSERT_EQ(s3, 200);
  EXPECT_EQ(whole["data"][0]["embedding"], full["data"][0]["embedding"]);
}

INSTANTIATE_TEST_SUITE_P(Embeddings, EmbeddingsRoute,
                         OSPREY_MODELS_ON_DEVICES((std::vector<std::string>{"qwen3-embedding", "llama-embedding"})));

// The error of a refused request: status, message and param.
struct Refusal {
  int status = 0;
  std::string message, param;
};

Refusal refusal(const testing::TestServer& s, const std::string& path, const json& body) {
  auto [status, r] = s.post_json(path, body);
  Refusal out{status, "", ""};
  if (r.is_object() && r.contains("error")) {
    out.message = r["error"]["message"].get<std::string>();
    if (r["error"]["param"].is_string()) out.param = r["error"]["param"].get<std::string>();
  }
  return out;
}

TEST(EmbeddingsRefusals, AModelThatDeclaresNoPoolingIsNamed) {
  testing::TestServer s;  // models/demo: no modules.json
  const Refusal r = refusal(s, "/v1/embeddings", {{"input", "hello"}});
  EXPECT_EQ(r.status, 400);
  EXPECT_TRUE(testing::contains(r.message, "this model declares no pooling (modules.json)"));
}

TEST(EmbeddingsRefusals, GenerationOnAnEmbeddingModelIsNamed) {
  testing::TestServer s(embedding_server("qwen3-embedding"));
  for (const auto& [path, body] : std::vector<std::pair<std::string, json>>{
           {"/v1/completions", {{"prompt", "hello"}, {"max_tokens", 4}}},
           {"/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}}},
       }) {
    const Refusal r = refusal(s, path, body);
    EXPECT_EQ(r.status, 400) << path;
    EXPECT_TRUE(testing::contains(r.message, "this model is an embedding model")) << path;
  }
  // The server still embeds after refusing.
  EXPECT_EQ(s.post_json("/v1/embeddings", {{"input", "hello"}}).first, 200);
}

TEST(EmbeddingsRefusals, BadInputsAreNamed) {
  ServerOptions o = embedding_server("qwen3-embedding");
  o.ctx_size = 32;
  testing::TestServer s(o);
  struct Case {
    json body;
    std::string param, message;
  };
  const std::vector<Case> cases = {
      {{{"input", ""}}, "input", "must not hold an empty string"},
      {{{"input", json::array()}}, "input", "must not be an empty array"},
      {{{"input", json::array({"a", ""})}}, "input", "empty string (input 1)"},
      {{{"input", json::array({json::array({1, 2}), json::array()})}}, "input", "empty array of token ids (input 1)"},
      {{{"input", json::array({"a", json::array({1})})}}, "input", "does not match input 0"},
      {{{"input", json::array({1, 100000})}}, "input", "token ids in [0, 771)"},
      {{{"input", 5}}, "input", "must be a string, an array of strings"},
      {{{"model", "qwen3-embedding"}}, "input", "'input' is required"},
      {{{"input", std::string(200, 'x') + " y"}}, "input", "this model's context is 32 tokens"},
      {{{"input", "a"}, {"dimensions", 0}}, "dimensions", "'dimensions' must be in [1,"},
      {{{"input", "a"}, {"dimensions", 65}}, "dimensions", "'dimensions' must be in [1, 64]"},
      {{{"input", "a"}, {"encoding_format", "int8"}}, "encoding_format", "\"float\" or \"base64\""},
      {{{"input", "a"}, {"user", 3}}, "user", "'user' must be a string"},
  };
  for (const Case& c : cases) {
    const Refusal r = refusal(s, "/v1/embeddings", c.body);
    EXPECT_EQ(r.status, 400) << c.body.dump();
    EXPECT_EQ(r.param, c.param) << c.body.dump();
    EXPECT_TRUE(testing::contains(r.message, c.message)) << c.body.dump();
  }
  json many = json::array();
  for (size_t i = 0; i <= kMaxEmbeddingInputs; ++i) many.push_back("a");
  const Refusal r = refusal(s, "/v1/embeddings", {{"input", many}});
  EXPECT_EQ(r.status, 400);
  EXPECT_TRUE(testing::contains(r.message, "at most 2048 inputs"));
  EXPECT_EQ(s.post_json("/v1/embeddings", {{"input", "a"}, {"model", "other"}}).first, 404);
  EXPECT_EQ(s.post_json("/v1/embeddings", {{"input", "a"}, {"user", "someone"}}).first, 200);
}

TEST(EmbeddingsBase64, IsLittleEndianFloat32) {
  // 1.0f is 00 00 80 3f; -2.0f is 00 00 00 c0.
  EXPECT_EQ(embedding_base64({1.0f}), "AACAPw==");
  EXPECT_EQ(embedding_base64({1.0f, -2.0f}), "AACAPwAAAMA=");
  EXPECT_EQ(decode_base64(embedding_base64({0.25f, -3.5f, 1e-20f})), (std::vector<float>{0.25f, -3.5f, 1e-20f}));
}

}  // namespace
}  // namespace osprey
