// Images in the server's requests (docs/server.md, "Images"): the gemma3-mm fixture's weights
// with a small byte-level tokenizer and Gemma 3's own chat template; the replies of the npm
// SDKs against the library's generate() with the same image, and the refusals that name the
// part at fault.
#include <gtest/gtest.h>

#include "server/harness.h"
#include "support/family_harness.h"
#include "tokenizer/tokenizer.h"
#include "vision/image_chat_model.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::contains;
using namespace testing::image_chat;

ServerOptions image_server_options(const fs::path& dir, KVLayout layout) {
  ServerOptions o = testing::demo_server_options();
  o.model_dir = dir;
  o.kv_layout = layout;
  o.timeout_s = 60;
  o.max_body_bytes = size_t(32) << 20;  // room for an image past the 20 MiB limit
  return o;
}

std::string data_url(const std::string& media, const std::string& bytes) {
  static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16 | uint32_t(uint8_t(bytes[i + 1])) << 8 | uint8_t(bytes[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += b64[(v >> s) & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += b64[(v >> 18) & 63];
    out += b64[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? b64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return "data:" + media + ";base64," + out;
}

json image_chat(const json& image_part) {
  return {{"messages", json::array({{{"role", "user"}, {"content", json::array({image_part, {{"type", "text"}, {"text", "Describe this."}}})}}})},
          {"max_tokens", 2},
          {"temperature", 0}};
}

json image_url_part(const std::string& url) { return {{"type", "image_url"}, {"image_url", {{"url", url}}}}; }

// Each token's bytes, as chat logprobs give them: the test tokenizer's pieces are distinct, so
// equal pieces are equal ids.
json pieces_of(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  json out = json::array();
  for (int32_t id : ids) {
    json b = json::array();
    for (unsigned char c : tok.decode(std::vector<int32_t>{id})) b.push_back(int(c));
    out.push_back(b);
  }
  return out;
}

json chat_with(const json& content, int max_tokens) {
  return {{"messages", json::array({{{"role", "user"}, {"content", content}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"logprobs", true}};
}

// The SDKs' replies (chat completions, Messages, Responses) equal the library's with the same
// image; another image changes the first token's logprobs; the same image again is read from
// the prompt cache, another never is. On both KV layouts.
void sdk_replies_equal_the_library(KVLayout layout) {
  if (const std::string why = model_missing(); !why.empty()) GTEST_SKIP() << why;
  for (const char* pkg : {"openai", "@anthropic-ai/sdk"})
    if (const std::string why = testing::node_client_missing(pkg); !why.empty()) GTEST_SKIP() << why;
  testing::TempDir dir;
  write_image_model(dir.path());
  const fs::path image = kImages / "png_rgb_64x48.png", other = kImages / "jpeg_rgb_120x80.jpg";
  const std::vector<int32_t> want = library_reply(dir.path(), image, 8);
  ASSERT_FALSE(want.empty());
  const Tokenizer tok = Tokenizer::load(dir.path());

  testing::TestServer s(image_server_options(dir.path(), layout));
  const std::string model = fs::path(dir.path()).filename().string();
  auto [rc, out] = testing::run_node_script("image_clients.mjs", {std::to_string(s.port()), model, image.string(), other.string()});
  ASSERT_EQ(rc, 0) << out;
  const json j = json::parse(out);

  // Each token's bytes: the test tokenizer's pieces are distinct, so equal pieces are equal ids.
  json want_pieces = json::array();
  for (int32_t id : want) {
    json b = json::array();
    for (unsigned char c : tok.decode(std::vector<int32_t>{id})) b.push_back(int(c));
    want_pieces.push_back(b);
  }
  EXPECT_EQ(j["openai"]["pieces"], want_pieces);
  EXPECT_EQ(j["openai"]["usage"]["prompt_tokens"], described_prompt().size());
  const std::string want_text = tok.decode(want, /*skip_special=*/true);
  EXPECT_EQ(j["openai"]["text"], want_text);
  EXPECT_EQ(j["anthropic"]["text"], want_text);
  EXPECT_EQ(j["responses"]["text"], want_text);

  // Another image: other logprobs for the first token (the fixture's tower and projector
  // carry the image into the logits: tests/vision/gemma3_image_test.cpp), and none of the first
  // image's cached rows; the first image again reuses its prompt from the cache.
  double differ = 0;
  for (size_t k = 0; k < j["openai"]["first_top"].size(); ++k)
    differ = std::max(differ, std::fabs(j["openai"]["first_top"][k]["logprob"].get<double>() -
                                        j["openai_other"]["first_top"][k]["logprob"].get<double>()));
  std::printf("another image: max |logprob difference| %.3g\n", differ);
  EXPECT_GT(differ, 1e-4) << "another image must change the logits";
  // The two prompts' tokens are the same (image tokens are one id): only the images' bytes in
  // the salt keep the first image's rows from being reused for the second.
  EXPECT_EQ(j["openai_other"]["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  json other_pieces = json::array();
  for (int32_t id : library_reply(dir.path(), other, 8)) {
    json b = json::array();
    for (unsigned char c : tok.decode(std::vector<int32_t>{id})) b.push_back(int(c));
    other_pieces.push_back(b);
  }
  EXPECT_EQ(j["openai_other"]["pieces"], other_pieces);
  EXPECT_GT(j["openai_again"]["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), kImageAt);
  EXPECT_EQ(j["openai_again"]["pieces"], want_pieces);

  EXPECT_EQ(j["anthropic_url"]["status"], 400);
  EXPECT_TRUE(contains(j["anthropic_url"]["message"].get<std::string>(), "messages[0].content[0].source.type"))
      << j["anthropic_url"];
  EXPECT_TRUE(contains(j["anthropic_url"]["message"].get<std::string>(), "fetches nothing"));
}

TEST(ServerImages, SdkRepliesEqualTheLibraryWithTheImageDense) { sdk_replies_equal_the_library(KVLayout::dense); }
TEST(ServerImages, SdkRepliesEqualTheLibraryWithTheImagePaged) { sdk_replies_equal_the_library(KVLayout::paged); }

// The paged prefix cache shares whole blocks (16 rows): a second turn with the same text before
// the same image and other text after it reuses rows [0, 16), which end inside the image at
// [15, 19). The reply still equals the library's with that prompt and image.
TEST(ServerImages, PagedPrefixEndingInsideAnImage) {
  if (const std::string why = model_missing(); !why.empty()) GTEST_SKIP() << why;
  testing::TempDir dir;
  write_image_model(dir.path());
  const fs::path file = kImages / "gif_40x25.gif";
  const json image = image_url_part(data_url("image/gif", testing::read_file(file)));
  testing::TestServer s(image_server_options(dir.path(), KVLayout::paged));
  auto content = [&](const std::string& after) {
    return json::array({{{"type", "text"}, {"text", "Look:"}}, image, {{"type", "text"}, {"text", after}}});
  };
  auto [s1, r1] = s.post_json("/v1/chat/completions", chat_with(content("Describe this."), 4));
  ASSERT_EQ(s1, 200) << r1;
  auto [s2, r2] = s.post_json("/v1/chat/completions", chat_with(content("Explain this."), 6));
  ASSERT_EQ(s2, 200) << r2;
  EXPECT_EQ(r2["usage"]["prompt_tokens_details"]["cached_tokens"], 16);
  const std::vector<int32_t> prompt = image_prompt("Look:", "Explain this.");
  EXPECT_EQ(r2["usage"]["prompt_tokens"], prompt.size());
  const Tokenizer tok = Tokenizer::load(dir.path());
  json got = json::array();
  for (const json& t : r2["choices"][0]["logprobs"]["content"]) got.push_back(t["bytes"]);
  EXPECT_EQ(got, pieces_of(tok, library_reply(dir.path(), file, 6, prompt, 15)));
  // The first token's log-probabilities equal the dense layout's, which computes the prompt
  // whole (below: how closely).
  testing::TestServer dense(image_server_options(dir.path(), KVLayout::dense));
  json body = chat_with(content("Explain this."), 1);
  body["top_logprobs"] = 5;
  auto [s3, r3] = dense.post_json("/v1/chat/completions", body);
  auto [s4, r4] = s.post_json("/v1/chat/completions", body);
  ASSERT_EQ(s3, 200) << r3;
  ASSERT_EQ(s4, 200) << r4;
  EXPECT_EQ(r4["usage"]["prompt_tokens_details"]["cached_tokens"], 32);  // now the whole prompt's blocks
  const json& want = r3["choices"][0]["logprobs"]["content"][0]["top_logprobs"];
  const json& have = r4["choices"][0]["logprobs"]["content"][0]["top_logprobs"];
  ASSERT_EQ(want.size(), have.size());
  double worst = 0;
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(want[k]["token"], have[k]["token"]);
    worst = std::max(worst, std::fabs(want[k]["logprob"].get<double>() - have[k]["logprob"].get<double>()));
  }
  // The turn whose pass began inside the image (r2), against the dense layout.
  const json& first = r2["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(first["token"], r3["choices"][0]["logprobs"]["content"][0]["token"]);
  worst = std::max(worst, std::fabs(first["logprob"].get<double>() -
                                    r3["choices"][0]["logprobs"]["content"][0]["logprob"].get<double>()));
  std::printf("paged vs dense: max |logprob difference| %.3g\n", worst);
  // NOTE: not bit for bit: a prompt computed in other passes after cached rows differs from the
  // whole computation on either layout, text alone too (1e-5 to 6e-4 in log-probability here:
  // the row counts of the passes differ), while another image moves these log-probabilities by
  // about 2.8 (the SDK tests): 2e-3 tells them apart.
  EXPECT_LT(worst, 2e-3);
}

// Another image's reply on the same server equals the library's with that image.
TEST(ServerImages, AnotherImageRepliesAsTheLibraryDoesWithIt) {
  if (const std::string why = model_missing(); !why.empty()) GTEST_SKIP() << why;
  testing::TempDir dir;
  write_image_model(dir.path());
  const fs::path file = kImages / "webp_lossy_96x64.webp";
  const std::vector<int32_t> want = library_reply(dir.path(), file, 6);
  testing::TestServer s(image_server_options(dir.path(), KVLayout::dense));
  json body = image_chat(image_url_part(data_url("image/webp", testing::read_file(file))));
  body["max_tokens"] = 6;
  body["logprobs"] = true;
  auto [status, r] = s.post_json("/v1/chat/completions", body);
  ASSERT_EQ(status, 200) << r;
  const Tokenizer tok = Tokenizer::load(dir.path());
  std::vector<std::string> got, expected;
  for (const json& t : r["choices"][0]["logprobs"]["content"]) got.push_back(t["token"]);
  for (int32_t id : want) expected.push_back(tok.decode(std::vector<int32_t>{id}));
  EXPECT_EQ(got, expected);
}

// Pan-and-scan through the chat route: an image_url part's detail "high" cuts its image, "low"
// does not, none follows the server (--pan-and-scan) or the model's preprocessor_config.json.
// The reference: library_pan_and_scan_reply (image_chat_model.h).
TEST(ServerImages, DetailHighCutsTheImageIntoPanAndScanCrops) {
  if (const std::string why = model_missing(); !why.empty()) GTEST_SKIP() << why;
  testing::TempDir dir;
  write_image_model(dir.path());
  write_pan_and_scan_processor(dir.path());
  const fs::path file = kImages / "webp_lossy_96x64.webp";
  const std::string bytes = testing::read_file(file);
  std::vector<int64_t> starts;
  const std::vector<int32_t> ids = pan_and_scan_prompt(starts);
  const std::vector<int32_t> cut = library_pan_and_scan_reply(dir.path(), file, 6);
  const std::vector<int32_t> whole = library_reply(dir.path(), file, 6);
  ASSERT_NE(cut, whole) << "the crops must change the reply for this test to tell them apart";
  const Tokenizer tok = Tokenizer::load(dir.path());
  auto reply_of = [&](const json& r) {
    std::vector<std::string> got;
    for (const json& t : r["choices"][0]["logprobs"]["content"]) got.push_back(t["token"]);
    return got;
  };
  auto text_of = [&](const std::vector<int32_t>& want) {
    std::vector<std::string> out;
    for (int32_t id : want) out.push_back(tok.decode(std::vector<int32_t>{id}));
    return out;
  };
  for (KVLayout layout : {KVLayout::dense, KVLayout::paged}) {
    testing::TestServer s(image_server_options(dir.path(), layout));
    for (const char* detail : {"high", "low", "auto"}) {
      json part = image_url_part(data_url("image/webp", bytes));
      part["image_url"]["detail"] = detail;
      json body = chat_with(json::array({part, {{"type", "text"}, {"text", "Describe this."}}}), 6);
      auto [status, r] = s.post_json("/v1/chat/completions", body);
      ASSERT_EQ(status, 200) << r;
      const bool crops = std::string(detail) == "high";
      EXPECT_EQ(r["usage"]["prompt_tokens"], crops ? ids.size() : described_prompt().size()) << detail;
      EXPECT_EQ(reply_of(r), text_of(crops ? cut : whole)) << detail << (layout == KVLayout::dense ? " dense" : " paged");
    }
  }
  // --pan-and-scan: "auto" and no detail cut the image too; "low" still does not.
  ServerOptions o = image_server_options(dir.path(), KVLayout::paged);
  o.pan_and_scan = true;
  testing::TestServer s(o);
  for (const char* detail : {"auto", "low"}) {
    json part = image_url_part(data_url("image/webp", bytes));
    part["image_url"]["detail"] = detail;
    auto [status, r] = s.post_json("/v1/chat/completions", chat_with(json::array({part, {{"type", "text"}, {"text", "Describe this."}}}), 6));
    ASSERT_EQ(status, 200) << r;
    const bool crops = std::string(detail) == "auto";
    EXPECT_EQ(reply_of(r), text_of(crops ? cut : whole)) << detail;
  }
}

// Every refusal is a 400 that names the part and the reason, before anything runs.
TEST(ServerImages, RefusalsNameThePartAndTheReason) {
  if (const std::string why = model_missing(); !why.empty()) GTEST_SKIP() << why;
  testing::TempDir dir;
  write_image_model(dir.path());
  testing::TestServer s(image_server_options(dir.path(), KVLayout::dense));
  const std::string model = fs::path(dir.path()).filename().string();
  const std::string png = testing::read_file(kImages / "png_rgb_64x48.png");
  auto refused = [&](const std::string& path, const json& body, std::vector<std::string> says) {
    auto [status, r] = s.post(path, body.dump());
    EXPECT_EQ(status, 400) << body.dump().substr(0, 300) << "\n" << r;
    for (const std::string& w : says) EXPECT_TRUE(contains(r, w)) << "missing \"" << w << "\" in " << r;
  };
  const std::string part = "messages[0].content[0]";
  refused("/v1/chat/completions", image_chat(image_url_part("https://example.com/cat.png")), {part, "fetches nothing"});
  refused("/v1/chat/completions", image_chat(image_url_part("data:image/png;base64,iVBO!!rw0KGgo=")),
          {part, "malformed base64", "character 4"});
  refused("/v1/chat/completions", image_chat(image_url_part("data:image/png;base64,iVBORw0KG")),
          {part, "malformed base64", "9 characters end inside a group of four"});
  refused("/v1/chat/completions", image_chat(image_url_part(data_url("image/png", png.substr(0, 300)))),
          {part, "malformed or truncated PNG"});
  refused("/v1/chat/completions", image_chat(image_url_part(data_url("text/plain", png))), {part, "text/plain"});
  refused("/v1/chat/completions", image_chat(image_url_part(data_url("image/png", "just some text"))),
          {part, "not a PNG, JPEG, WebP or GIF image"});
  refused("/v1/chat/completions", image_chat({{"type", "image_url"}, {"image_url", {{"url", data_url("image/png", png)}, {"detail", "ultra"}}}}),
          {part + ".image_url.detail", "ultra"});
  refused("/v1/chat/completions", image_chat({{"type", "image"}}), {part, "image_url"});
  json assistant = image_chat(image_url_part(data_url("image/png", png)));
  assistant["messages"][0]["role"] = "assistant";
  refused("/v1/chat/completions", assistant, {part, "user messages"});
  // Text that writes image tokens of its own would leave them without an image.
  json forged = {{"messages", json::array({{{"role", "user"}, {"content", "<start_of_image><image_soft_token>"}}})}, {"max_tokens", 2}};
  refused("/v1/chat/completions", forged, {"image"});
  refused("/v1/messages",
          {{"model", model}, {"max_tokens", 2},
           {"messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "image"}, {"source", {{"type", "url"}, {"url", "https://example.com/a.png"}}}}})}}})}},
          {"messages[0].content[0].source.type", "fetches nothing"});
  refused("/v1/messages",
          {{"model", model}, {"max_tokens", 2},
           {"messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "image"}, {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", "AAAA" + data_url("image/png", png.substr(0, 300)).substr(22)}}}}})}}})}},
          {"messages[0].content[0]", "cannot read"});
  refused("/v1/responses",
          {{"input", json::array({{{"role", "user"}, {"content", json::array({{{"type", "input_image"}, {"file_id", "file-1"}}})}}})}},
          {"input[0].content[0].file_id"});
  refused("/v1/responses",
          {{"input", json::array({{{"role", "user"}, {"content", json::array({{{"type", "input_image"}, {"image_url", "http://example.com/a.png"}}})}}})}},
          {"input[0].content[0].image_url", "fetches nothing"});

  // Hostile parts: wrong types, huge or empty data, padding alone; each a 400 naming the part.
  const json hostile[] = {
      {{"type", "image_url"}, {"image_url", 7}},
      {{"type", "image_url"}, {"image_url", {{"url", json::array({1, 2})}}}},
      {{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64,"}}}},
      {{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64,===="}}}},
      {{"type", "image_url"}, {"image_url", {{"url", "data:image/png,raw"}}}},
      {{"type", "image_url"}, {"image_url", {{"url", "data:"}}}},
      {{"type", "image_url"}, {"image_url", {{"url", "data:image/gif;base64," + std::string(4000, 'A')}}}},
      {{"type", "image_url"}, {"image_url", {{"url", data_url("image/png", png)}, {"extra", 1}}}},
      {{"type", "image_url"}, {"image_url", {{"url", data_url("image/png", png)}}}, {"detail", "high"}},
  };
  for (const json& h : hostile) refused("/v1/chat/completions", image_chat(h), {part});
  // Past 20 MiB (kMaxImageBytes) once decoded: refused before the base64 is decoded.
  refused("/v1/chat/completions", image_chat(image_url_part("data:image/png;base64," + std::string(28u << 20, 'A'))),
          {part, "past this server's limit of 20971520 bytes per image"});

  // /v1/models says which inputs the model takes.
  EXPECT_TRUE(contains(s.get("/v1/models").second, R"("input_modalities":["text","image"])"));
}

// A text-only model refuses an image part by name.
TEST(ServerImages, TextOnlyModelRefusesAnImage) {
  testing::TestServer s;  // the demo model
  auto [status, r] = s.post("/v1/chat/completions",
                            image_chat(image_url_part(data_url("image/png", testing::read_file(kImages / "png_rgb_64x48.png")))).dump());
  EXPECT_EQ(status, 400) << r;
  EXPECT_TRUE(contains(r, "messages[0].content[0]")) << r;
  EXPECT_TRUE(contains(r, "no vision tower")) << r;
  EXPECT_TRUE(contains(s.get("/v1/models").second, R"("input_modalities":["text"])"));
}

}  // namespace
}  // namespace osprey
