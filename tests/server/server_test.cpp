// `osprey serve` over real HTTP on loopback, with the demo model.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <thread>

#include "serve/generate.h"
#include "model/model.h"
#include "server/harness.h"
#include "tokenizer/tokenizer.h"

namespace osprey {
namespace {

using nlohmann::json;
using testing::TestServer;

const Tokenizer& demo_tokenizer() {
  static Tokenizer t = Tokenizer::load(testing::source_dir() / "models" / "demo");
  return t;
}

json greedy(json body) {
  body["temperature"] = 0;
  return body;
}

void expect_error(int status, const json& body, int want_status, const std::string& param = "") {
  EXPECT_EQ(status, want_status) << body.dump();
  ASSERT_TRUE(body.is_object() && body.contains("error")) << body.dump();
  const json& e = body["error"];
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << body.dump();
  EXPECT_TRUE(e["type"].is_string()) << body.dump();
  EXPECT_TRUE(e.contains("param") && e.contains("code")) << body.dump();
  if (!param.empty()) {
    EXPECT_EQ(e["param"], param) << body.dump();
  }
}

}  // namespace

TEST(Server, HealthAndModels) {
  TestServer s;
  auto [hs, hb] = s.get("/health");
  EXPECT_EQ(hs, 200);
  EXPECT_EQ(json::parse(hb)["status"], "ok");
  auto [ms, mb] = s.get("/v1/models");
  ASSERT_EQ(ms, 200);
  json m = json::parse(mb);
  EXPECT_EQ(m["object"], "list");
  ASSERT_EQ(m["data"].size(), 1u);
  EXPECT_EQ(m["data"][0]["id"], "demo");
  EXPECT_EQ(m["data"][0]["object"], "model");
}

TEST(Server, HealthIs503UntilTheModelIsLoaded) {
  Server server(testing::demo_server_options());
  const int port = server.bind();
  server.start();
  httplib::Client c("127.0.0.1", port);
  auto r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  auto rc = c.Post("/v1/completions", R"({"prompt": "Emma"})", "application/json");
  ASSERT_TRUE(rc);
  EXPECT_EQ(rc->status, 503);
  server.load();
  r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  server.stop();
}

TEST(Server, GreedyCompletionEqualsTheGenerator) {
  TestServer s;
  const std::string prompt = "Mr. Knightley was";
  auto [status, r] = s.post_json("/v1/completions", greedy({{"prompt", prompt}, {"max_tokens", 24}}));
  ASSERT_EQ(status, 200) << r.dump();
  const std::vector<int32_t> ids = demo_tokenizer().encode(prompt, true);
  const std::vector<int32_t> ref = testing::demo_greedy_reference(ids, 24);
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "demo");
  EXPECT_TRUE(r["id"].get<std::string>().rfind("cmpl-", 0) == 0);
  EXPECT_TRUE(r["created"].is_number_integer());
  EXPECT_TRUE(r["system_fingerprint"].is_string());
  ASSERT_EQ(r["choices"].size(), 1u);
  EXPECT_EQ(r["choices"][0]["text"], demo_tokenizer().decode(ref, true));
  EXPECT_EQ(r["choices"][0]["finish_reason"], ref.size() == 24 ? "length" : "stop");
  EXPECT_EQ(r["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(r["usage"]["completion_tokens"], ref.size());
  EXPECT_EQ(r["usage"]["total_tokens"], ids.size() + ref.size());
  EXPECT_TRUE(r["usage"]["prompt_tokens_details"]["cached_tokens"].is_number_integer());
}

TEST(Server, TokenArrayAndListPrompts) {
  TestServer s;
  const std::vector<int32_t> a = demo_tokenizer().encode("Emma Woodhouse, handsome", true);
  const std::vector<int32_t> b = demo_tokenizer().encode("It is a truth universally", true);
  auto [st1, r1] = s.post_json("/v1/completions", greedy({{"prompt", a}, {"max_tokens", 8}}));
  ASSERT_EQ(st1, 200) << r1.dump();
  EXPECT_EQ(r1["choices"][0]["text"], demo_tokenizer().decode(testing::demo_greedy_reference(a, 8), true));
  auto [st2, r2] = s.post_json("/v1/completions",
                               greedy({{"prompt", json::array({"It is a truth universally", a})}, {"max_tokens", 8}}));
  ASSERT_EQ(st2, 200) << r2.dump();
  ASSERT_EQ(r2["choices"].size(), 2u);
  EXPECT_EQ(r2["choices"][0]["index"], 0);
  EXPECT_EQ(r2["choices"][1]["index"], 1);
  EXPECT_EQ(r2["choices"][0]["text"], demo_tokenizer().decode(testing::demo_greedy_reference(b, 8), true));
  EXPECT_EQ(r2["choices"][1]["text"], r1["choices"][0]["text"]);
  EXPECT_EQ(r2["usage"]["prompt_tokens"], a.size() + b.size());
}

TEST(Server, StreamingChunksReassembleToTheReply) {
  TestServer s;
  json body = greedy({{"prompt", "She was"}, {"max_tokens", 30}});
  auto [st, whole] = s.post_json("/v1/completions", body);
  ASSERT_EQ(st, 200);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto [ss, text] = s.post("/v1/completions", body.dump());
  ASSERT_EQ(ss, 200) << text;
  bool done = false;
  auto events = testing::sse_events(text, &done);
  EXPECT_TRUE(done) << text;
  ASSERT_GE(events.size(), 3u);
  std::string joined;
  int finishes = 0;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json& e = events[i];
    EXPECT_EQ(e["object"], "text_completion");
    EXPECT_EQ(e["id"], events[0]["id"]);
    joined += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) {
      ++finishes;
      EXPECT_EQ(e["choices"][0]["finish_reason"], whole["choices"][0]["finish_reason"]);
    }
  }
  EXPECT_EQ(finishes, 1);
  EXPECT_EQ(joined, whole["choices"][0]["text"].get<std::string>());
  const json& last = events.back();
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["completion_tokens"], whole["usage"]["completion_tokens"]);
  EXPECT_EQ(last["usage"]["prompt_tokens"], whole["usage"]["prompt_tokens"]);
}

TEST(Server, StopStringsMatchAcrossTokenBoundariesAndAreNotEmitted) {
  TestServer s;
  const std::vector<int32_t> prompt = demo_tokenizer().encode("Mr. Knightley was", true);
  const std::vector<int32_t> ref = testing::demo_greedy_reference(prompt, 40);
  // A stop string made of the last character of one token and the first of the next.
  std::string before, stop;
  for (size_t i = 4; i + 1 < ref.size() && stop.empty(); ++i) {
    const std::string a = demo_tokenizer().decode(std::vector<int32_t>{ref[i]}, true);
    const std::string b = demo_tokenizer().decode(std::vector<int32_t>{ref[i + 1]}, true);
    if (a.empty() || b.empty() || (unsigned char)a.back() >= 0x80 || (unsigned char)b[0] >= 0x80) continue;
    stop = std::string(1, a.back()) + b[0];
  }
  ASSERT_FALSE(stop.empty());
  const std::string full = demo_tokenizer().decode(ref, true);
  const std::string expected = full.substr(0, full.find(stop));
  json body = greedy({{"prompt", prompt}, {"max_tokens", 40}, {"stop", json::array({"\x01never", stop})}});
  auto [st, r] = s.post_json("/v1/completions", body);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["text"], expected) << "stop " << json(stop).dump();
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  body["stream"] = true;
  auto [ss, text] = s.post("/v1/completions", body.dump());
  ASSERT_EQ(ss, 200);
  std::string joined;
  for (const json& e : testing::sse_events(text)) joined += e["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(joined, expected);
}

TEST(Server, MaxTokensEndsWithLength) {
  TestServer s;
  auto [st, r] = s.post_json("/v1/completions", {{"prompt", "The"}, {"max_tokens", 5}, {"temperature", 0.9}, {"seed", 3}});
  ASSERT_EQ(st, 200);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 5);
}

// The demo model never ends a reply by itself, so the test serves a copy of it whose config
// names an ordinary token of a greedy reply as an end-of-sequence id: without ignore_eos the
// reply ends before that token, with it the reply is the demo model's whole greedy reply.
TEST(Server, IgnoreEosRunsToMaxTokens) {
  constexpr int kMaxTokens = 24;
  const std::vector<int32_t> prompt = demo_tokenizer().encode("Mr. Knightley was", true);
  const std::vector<int32_t> ref = testing::demo_greedy_reference(prompt, kMaxTokens);
  ASSERT_EQ(ref.size(), size_t(kMaxTokens));
  size_t k = 3;  // the first position past 2 whose token has not come before
  while (k < ref.size() && std::find(ref.begin(), ref.begin() + k, ref[k]) != ref.begin() + k) ++k;
  ASSERT_LT(k, ref.size());

  testing::TempDir dir;
  const std::filesystem::path demo = testing::source_dir() / "models" / "demo";
  for (const char* f : {"model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    std::filesystem::copy_file(demo / f, dir / f);
  json config = json::parse(testing::read_file(demo / "config.json"));
  config["eos_token_id"] = json::array({1, ref[k]});
  testing::write_file(dir / "config.json", config.dump());
  ServerOptions o = testing::demo_server_options();
  o.model_dir = dir.path();
  TestServer s(o);

  const json body = greedy({{"prompt", prompt}, {"max_tokens", kMaxTokens}});
  auto [st1, stopped] = s.post_json("/v1/completions", body);
  ASSERT_EQ(st1, 200) << stopped.dump();
  EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(stopped["usage"]["completion_tokens"], k);
  EXPECT_EQ(stopped["choices"][0]["text"],
            demo_tokenizer().decode(std::vector<int32_t>(ref.begin(), ref.begin() + k), true));

  json forced = body;
  forced["ignore_eos"] = true;
  auto [st2, full] = s.post_json("/v1/completions", forced);
  ASSERT_EQ(st2, 200) << full.dump();
  EXPECT_EQ(full["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(full["usage"]["completion_tokens"], kMaxTokens);
  EXPECT_EQ(full["choices"][0]["text"], demo_tokenizer().decode(ref, true));

  forced["ignore_eos"] = false;
  auto [st3, again] = s.post_json("/v1/completions", forced);
  ASSERT_EQ(st3, 200) << again.dump();
  EXPECT_EQ(again["usage"]["completion_tokens"], k);
}

TEST(Server, SeedMakesSamplingRepeatable) {
  TestServer s;
  json body = {{"prompt", "Emma"}, {"max_tokens", 20}, {"temperature", 1.2}, {"top_k", 40}, {"top_p", 0.95},
               {"min_p", 0.01}, {"presence_penalty", 0.5}, {"frequency_penalty", 0.5}, {"repeat_penalty", 1.1}};
  body["seed"] = 11;
  auto [s1, a] = s.post_json("/v1/completions", body);
  auto [s2, b] = s.post_json("/v1/completions", body);
  body["seed"] = 12;
  auto [s3, c] = s.post_json("/v1/completions", body);
  ASSERT_EQ(s1, 200);
  ASSERT_EQ(s3, 200);
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
  EXPECT_NE(a["choices"][0]["text"], c["choices"][0]["text"]);
}

// Without "seed" (or with -1, llama.cpp's "random") each request samples with a fresh seed:
// two such replies of 30 tokens at temperature 1, with nothing cut from the distribution,
// differ; the same seed twice gives the same tokens.
TEST(Server, RequestsWithoutASeedSampleWithAFreshOne) {
  TestServer s;
  const json body = {{"prompt", "Emma"}, {"max_tokens", 30}, {"temperature", 1.0}, {"top_p", 1.0},
                     {"ignore_eos", true}, {"logprobs", 0}};
  auto tokens = [&](const json& b) {
    auto [st, r] = s.post_json("/v1/completions", b);
    EXPECT_EQ(st, 200) << r.dump();
    return r["choices"][0]["logprobs"]["tokens"];
  };
  const json a = tokens(body), b = tokens(body);
  ASSERT_EQ(a.size(), 30u);
  EXPECT_NE(a, b);
  json random = body;
  random["seed"] = -1;
  EXPECT_NE(tokens(random), tokens(random));
  json seeded = body;
  seeded["seed"] = 5;
  EXPECT_EQ(tokens(seeded), tokens(seeded));
  json bad = body;
  bad["seed"] = -2;
  auto [st, r] = s.post_json("/v1/completions", bad);
  expect_error(st, r, 400, "seed");
}

// A sampling field a request leaves out takes the model's generation_config.json value (vLLM's
// rule), else OpenAI's default; /v1/models says which. A copy of the demo model whose file says
// "do_sample": false answers an unseeded request without a temperature with the greedy reply
// every time (OpenAI's temperature 1 would sample a fresh reply each time); a request that names
// its temperature samples.
TEST(Server, OmittedSamplingFieldsTakeTheModelsGenerationConfig) {
  // The sampling defaults /v1/models states for the model.
  auto sampling_defaults = [](TestServer& s, json& d) {
    auto [st, m] = s.get("/v1/models");
    ASSERT_EQ(st, 200);
    d = json::parse(m)["data"][0]["meta"]["sampling_defaults"];
  };
  {
    TestServer plain;
    json d;
    ASSERT_NO_FATAL_FAILURE(sampling_defaults(plain, d));
    EXPECT_EQ(d["source"], "OpenAI's defaults") << d.dump();
    EXPECT_EQ(d["temperature"], 1.0);
    EXPECT_EQ(d["top_p"], 1.0);
  }
  testing::TempDir dir;
  const std::filesystem::path demo = testing::source_dir() / "models" / "demo";
  for (const char* f : {"model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"})
    std::filesystem::copy_file(demo / f, dir / f);
  testing::write_file(dir / "generation_config.json", R"({"do_sample": false, "top_p": 0.5})");
  ServerOptions o = testing::demo_server_options();
  o.model_dir = dir.path();
  TestServer s(o);
  json d;
  ASSERT_NO_FATAL_FAILURE(sampling_defaults(s, d));
  EXPECT_EQ(d["source"], "generation_config.json (top_p, do_sample)") << d.dump();
  EXPECT_EQ(d["temperature"], 0.0);
  EXPECT_EQ(d["top_p"], 0.5);

  const json body = {{"prompt", "Emma"}, {"max_tokens", 20}, {"ignore_eos", true}};
  auto text = [&](const json& b) {
    auto [code, r] = s.post_json("/v1/completions", b);
    EXPECT_EQ(code, 200) << r.dump();
    return r["choices"][0]["text"].get<std::string>();
  };
  const std::string want = text(greedy(body));
  EXPECT_EQ(text(body), want);
  EXPECT_EQ(text(body), want);
  json sampled = body;
  sampled["temperature"] = 1.0;
  sampled["top_p"] = 1.0;
  EXPECT_NE(text(sampled), text(sampled)) << "a named temperature samples (a fresh seed each time)";
}

// Other servers' sampling fields this server does not implement are refused by name unless
// they ask for nothing (the value that turns them off); vLLM's repetition_penalty is
// llama.cpp's repeat_penalty.
TEST(Server, UnimplementedSamplingFieldsAreRefusedByName) {
  TestServer s;
  const json base = {{"prompt", "Emma"}, {"max_tokens", 4}, {"temperature", 0.8}, {"seed", 3}};
  const std::pair<const char*, json> refused[] = {
      {"mirostat", 2},          {"tfs_z", 0.9},          {"dynatemp_range", 0.5},
      {"xtc_probability", 0.5}, {"dry_multiplier", 0.8}, {"top_n_sigma", 1.0},
      {"min_tokens", 3},        {"use_beam_search", true}, {"samplers", json::array({"top_k"})},
      {"bad_words", json::array({"the"})}, {"stop_token_ids", json::array({5})}, {"length_penalty", 0.5},
      {"n_probs", 3},           {"min_keep", 5},         {"penalize_nl", true},
      {"speculative.n_max", 4}, {"speculative.n_min", 1}, {"speculative.p_min", 0.5},
  };
  for (const auto& [name, value] : refused) {
    json b = base;
    b[name] = value;
    auto [st, r] = s.post_json("/v1/completions", b);
    expect_error(st, r, 400, name);
  }
  json off = base;
  for (const auto& [name, value] : std::initializer_list<std::pair<const char*, json>>{
           {"mirostat", 0}, {"tfs_z", 1}, {"dynatemp_range", 0}, {"xtc_probability", 0}, {"dry_multiplier", 0},
           {"top_n_sigma", -1}, {"min_tokens", 0}, {"use_beam_search", false}, {"bad_words", json::array()},
           {"n_probs", 0}, {"min_keep", 1}, {"penalize_nl", false}})
    off[name] = value;
  auto [st_off, r_off] = s.post_json("/v1/completions", off);
  EXPECT_EQ(st_off, 200) << r_off.dump();
  auto [st_base, r_base] = s.post_json("/v1/completions", base);
  ASSERT_EQ(st_base, 200);
  EXPECT_EQ(r_off["choices"][0]["text"], r_base["choices"][0]["text"]);

  json a = base, b = base;
  a["repeat_penalty"] = 1.3;
  b["repetition_penalty"] = 1.3;
  auto [sa, ra] = s.post_json("/v1/completions", a);
  auto [sb, rb] = s.post_json("/v1/completions", b);
  ASSERT_EQ(sa, 200);
  ASSERT_EQ(sb, 200);
  EXPECT_EQ(ra["choices"][0]["text"], rb["choices"][0]["text"]);
  json both = a;
  both["repetition_penalty"] = 1.2;
  auto [sc, rc] = s.post_json("/v1/completions", both);
  expect_error(sc, rc, 400, "repetition_penalty");
}

TEST(Server, LogprobsAreTheLogSoftmaxOfTheLogits) {
  TestServer s;
  auto [st, r] = s.post_json("/v1/completions", greedy({{"prompt", "Emma"}, {"max_tokens", 6}, {"logprobs", 3}}));
  ASSERT_EQ(st, 200) << r.dump();
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    const json& top = lp["top_logprobs"][i];
    ASSERT_EQ(top.size(), 3u) << top.dump();
    double best = -1e9, mass = 0;
    for (auto& [tok, v] : top.items()) {
      best = std::max(best, v.get<double>());
      mass += std::exp(v.get<double>());
    }
    // Greedy picks the most likely token; the three most likely hold at most all the mass.
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), best, 1e-6);
    EXPECT_LE(mass, 1.0 + 1e-5);
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
  }
}

TEST(Server, BadRequestsGetOpenAIErrors) {
  TestServer s;
  auto [st, body] = s.post("/v1/completions", "{not json");
  expect_error(st, json::parse(body), 400);
  auto check = [&](const json& req, int want, const std::string& param) {
    auto [code, r] = s.post_json("/v1/completions", req);
    SCOPED_TRACE(req.dump());
    expect_error(code, r, want, param);
  };
  check({{"max_tokens", 3}}, 400, "prompt");
  check({{"prompt", 5}}, 400, "prompt");
  check({{"prompt", json::array()}}, 400, "prompt");
  check({{"prompt", json::array({1, -2})}}, 400, "prompt");
  check({{"prompt", json::array({1, 99999})}}, 400, "prompt");
  check({{"prompt", "a"}, {"max_tokens", "ten"}}, 400, "max_tokens");
  check({{"prompt", "a"}, {"max_tokens", 0}}, 400, "max_tokens");
  check({{"prompt", "a"}, {"max_tokens", 1e300}}, 400, "max_tokens");
  check({{"prompt", "a"}, {"temperature", -1}}, 400, "temperature");
  check({{"prompt", "a"}, {"top_p", 0}}, 400, "top_p");
  check({{"prompt", "a"}, {"n", 2}}, 400, "n");
  check({{"prompt", "a"}, {"stop", 3}}, 400, "stop");
  check({{"prompt", "a"}, {"stream", "yes"}}, 400, "stream");
  check({{"prompt", "a"}, {"ignore_eos", 1}}, 400, "ignore_eos");
  check({{"prompt", "a"}, {"model", "gpt-4"}}, 404, "");
  auto [c2, r2] = s.post_json("/v1/completions", {{"prompt", json(std::vector<int32_t>(600, 5))}});
  expect_error(c2, r2, 400, "prompt");
  EXPECT_EQ(r2["error"]["code"], "context_length_exceeded");
  auto [c3, b3] = s.get("/v1/nothing");
  expect_error(c3, json::parse(b3), 404);
  auto [c4, b4] = s.post("/v1/completions", "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[");
  expect_error(c4, json::parse(b4), 400);
  EXPECT_EQ(s.get("/health").first, 200);
}

TEST(Server, BodiesOverTheLimitGet413) {
  ServerOptions o = testing::demo_server_options();
  o.max_body_bytes = 4096;
  TestServer s(o);
  auto [st, body] = s.post("/v1/completions", json{{"prompt", std::string(10000, 'a')}}.dump());
  expect_error(st, json::parse(body), 413);
  EXPECT_EQ(s.get("/health").first, 200);
}

TEST(Server, ApiKeyIsRequiredEverywhereButHealth) {
  ServerOptions o = testing::demo_server_options();
  o.api_keys = {"sekrit"};
  TestServer s(o);
  EXPECT_EQ(s.get("/health").first, 200);
  auto [c1, b1] = s.get("/v1/models");
  expect_error(c1, json::parse(b1), 401);
  auto [c2, b2] = s.post_json("/v1/completions", {{"prompt", "a"}}, {{"Authorization", "Bearer wrong"}});
  expect_error(c2, b2, 401);
  auto [c3, b3] = s.post_json("/v1/completions", {{"prompt", "a"}, {"max_tokens", 2}}, {{"Authorization", "Bearer sekrit"}});
  EXPECT_EQ(c3, 200) << b3.dump();
}

bool wait_for(const std::function<bool()>& pred, int ms = 10000) {
  for (int t = 0; t < ms; t += 5) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// A streaming request read through a raw socket, so the test can close it mid-stream.
class RawStream {
 public:
  RawStream(int port, const json& body) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
    const std::string b = body.dump();
    const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                            std::to_string(b.size()) + "\r\n\r\n" + b;
    (void)!::send(fd_, req.data(), req.size(), MSG_NOSIGNAL);
  }
  ~RawStream() { close(); }
  // Reads until `needle` arrives (or the peer closes); returns what was read.
  std::string read_until(const std::string& needle) {
    char buf[4096];
    while (got_.find(needle) == std::string::npos) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) break;
      got_.append(buf, size_t(n));
    }
    return got_;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  std::string got_;
};

TEST(Server, QueueBoundGives429AndDisconnectsFreeTheSlot) {
  ServerOptions o = testing::demo_server_options();
  o.n_slots = 1;
  o.max_queue = 1;
  TestServer s(o);
  json longer = {{"prompt", "Emma"}, {"max_tokens", 400}, {"temperature", 0.8}, {"stream", true}};
  RawStream running(s.port(), longer);
  running.read_until("data: ");  // it runs
  RawStream queued(s.port(), longer);
  ASSERT_TRUE(wait_for([&] { return s.metric("osprey:num_requests_waiting") == 1; }));
  auto [st, r] = s.post_json("/v1/completions", {{"prompt", "a"}, {"max_tokens", 2}});
  expect_error(st, r, 429);
  // The queued client leaves: its place frees at once.
  queued.close();
  ASSERT_TRUE(wait_for([&] { return s.metric("osprey:num_requests_waiting") == 0; }));
  // The running client leaves mid-stream: its slot frees, and a new request runs.
  running.close();
  ASSERT_TRUE(wait_for([&] { return s.metric("osprey:num_requests_running") == 0; }));
  EXPECT_EQ(s.metric("osprey:requests_cancelled_total"), 2);
  auto [st2, r2] = s.post_json("/v1/completions", {{"prompt", "a"}, {"max_tokens", 2}});
  EXPECT_EQ(st2, 200) << r2.dump();
}

TEST(Server, StopEndsInFlightStreamsWithAnErrorEvent) {
  auto s = std::make_unique<TestServer>();
  RawStream stream(s->port(), {{"prompt", "Emma"}, {"max_tokens", 450}, {"temperature", 0.8}, {"stream", true}});
  stream.read_until("data: ");
  const auto t0 = std::chrono::steady_clock::now();
  s->server().stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  const std::string got = stream.read_until("\r\n0\r\n\r\n");
  EXPECT_NE(got.find("shutting down"), std::string::npos) << got.substr(got.size() > 400 ? got.size() - 400 : 0);
  EXPECT_EQ(got.find("[DONE]"), std::string::npos);
}

}  // namespace osprey
