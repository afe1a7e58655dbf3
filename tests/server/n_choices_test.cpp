// OpenAI's `n`: several choices of one prompt, over real HTTP with the demo model. The
// choices' prompt is prefilled once (the paged pool shares its blocks), each choice samples
// its own seed stream, and cancelling the request ends every choice.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <set>
#include <thread>

#include "serve/generate.h"
#include "model/model.h"
#include "server/harness.h"
#include "tokenizer/tokenizer.h"

namespace osprey {
namespace {

using nlohmann::json;
using testing::TestServer;

ServerOptions options(int n_slots) {
  ServerOptions o = testing::demo_server_options();
  o.n_slots = n_slots;
  return o;
}

json post_ok(const TestServer& s, const std::string& path, const json& body) {
  auto [status, r] = s.post_json(path, body);
  EXPECT_EQ(status, 200) << r.dump();
  return r;
}

// Each choice's tokens (completions logprobs), by index.
std::vector<json> choice_tokens(const json& r) {
  std::vector<json> out(r["choices"].size());
  for (const json& c : r["choices"]) out.at(c["index"].get<size_t>()) = c["logprobs"]["tokens"];
  return out;
}

bool wait_until(const std::function<bool()>& pred, int ms = 10000) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

TEST(NChoices, ThreeSeededChoicesDifferAndRepeat) {
  TestServer s(options(4));
  const json body = {{"prompt", "Emma"}, {"max_tokens", 24}, {"temperature", 1.0}, {"top_p", 1.0}, {"seed", 7},
                     {"ignore_eos", true}, {"logprobs", 0}, {"n", 3}};
  const json a = post_ok(s, "/v1/completions", body);
  ASSERT_EQ(a["choices"].size(), 3u) << a.dump();
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(a["choices"][i]["index"], i);
  const std::vector<json> ta = choice_tokens(a);
  for (const json& t : ta) EXPECT_EQ(t.size(), 24u);
  EXPECT_EQ(std::set<json>(ta.begin(), ta.end()).size(), 3u) << "the choices are meant to differ";
  // The same seed repeats every choice.
  EXPECT_EQ(choice_tokens(post_ok(s, "/v1/completions", body)), ta);
  // Choice 0 draws the request's own seed: the reply of n = 1.
  json one = body;
  one["n"] = 1;
  EXPECT_EQ(choice_tokens(post_ok(s, "/v1/completions", one)).at(0), ta[0]);
  // Usage: the prompt once, every choice's tokens.
  const int64_t n_prompt = int64_t(Tokenizer::load(testing::source_dir() / "models" / "demo").encode("Emma", true).size());
  EXPECT_EQ(a["usage"]["prompt_tokens"], n_prompt);
  EXPECT_EQ(a["usage"]["completion_tokens"], 72);
  EXPECT_EQ(a["usage"]["total_tokens"], n_prompt + 72);
}

TEST(NChoices, AtTemperatureZeroEveryChoiceIsTheGreedyReply) {
  TestServer s(options(4));
  const std::string prompt = "Mr. Knightley was";
  const json r = post_ok(s, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0}, {"n", 3}});
  const Tokenizer tok = Tokenizer::load(testing::source_dir() / "models" / "demo");
  const std::string greedy = tok.decode(testing::demo_greedy_reference(tok.encode(prompt, true), 16), true);
  ASSERT_EQ(r["choices"].size(), 3u);
  for (const json& c : r["choices"]) EXPECT_EQ(c["text"], greedy);
  // A stop string ends each choice where it matches (the greedy text's second word on).
  const size_t cut = greedy.find(' ', 1);
  ASSERT_NE(cut, std::string::npos) << greedy;
  const json stopped = post_ok(s, "/v1/completions",
                               {{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0}, {"n", 2},
                                {"stop", greedy.substr(cut, 3)}});
  for (const json& c : stopped["choices"]) {
    EXPECT_EQ(c["text"], greedy.substr(0, cut));
    EXPECT_EQ(c["finish_reason"], "stop");
  }
  // Two prompts, two choices each: index = prompt * n + choice.
  const json two = post_ok(s, "/v1/completions",
                           {{"prompt", {prompt, "Emma"}}, {"max_tokens", 8}, {"temperature", 0}, {"n", 2}});
  ASSERT_EQ(two["choices"].size(), 4u);
  const json emma = post_ok(s, "/v1/completions", {{"prompt", "Emma"}, {"max_tokens", 8}, {"temperature", 0}});
  const json knightley = post_ok(s, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}});
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(two["choices"][i]["index"], i);
    EXPECT_EQ(two["choices"][i]["text"], (i < 2 ? knightley : emma)["choices"][0]["text"]) << i;
  }
  // Chat, with logprobs: each choice carries its own.
  const json chat = post_ok(s, "/v1/chat/completions",
                            {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 12}, {"temperature", 0},
                             {"n", 2}, {"logprobs", true}});
  ASSERT_EQ(chat["choices"].size(), 2u);
  EXPECT_EQ(chat["choices"][0]["message"], chat["choices"][1]["message"]);
  EXPECT_EQ(chat["choices"][1]["logprobs"]["content"].size(), chat["usage"]["completion_tokens"].get<size_t>() / 2);
}

// /metrics counts the prompt's tokens prefilled once for three choices.
TEST(NChoices, ThePromptIsPrefilledOnce) {
  TestServer s(options(4));
  const std::string prompt = "It is a truth universally acknowledged, that a single man in possession";
  const double before = s.metric("osprey:prompt_tokens_total");
  const json r = post_ok(s, "/v1/completions",
                         {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0.9}, {"seed", 1}, {"n", 3}});
  const int64_t n_prompt = r["usage"]["prompt_tokens"];
  EXPECT_GT(n_prompt, 10);
  EXPECT_EQ(s.metric("osprey:prompt_tokens_total") - before, double(n_prompt));
  EXPECT_EQ(s.metric("osprey:requests_finished_total"), 3);
}

// The dense layout cannot share a cache: each choice computes the prompt, with the same result.
TEST(NChoices, TheDenseLayoutComputesEachChoice) {
  ServerOptions o = options(2);
  o.kv_layout = KVLayout::dense;
  TestServer s(o);
  const json r = post_ok(s, "/v1/completions", {{"prompt", "Emma"}, {"max_tokens", 10}, {"temperature", 0}, {"n", 2}});
  const json one = post_ok(s, "/v1/completions", {{"prompt", "Emma"}, {"max_tokens", 10}, {"temperature", 0}});
  ASSERT_EQ(r["choices"].size(), 2u);
  EXPECT_EQ(r["choices"][0]["text"], one["choices"][0]["text"]);
  EXPECT_EQ(r["choices"][1]["text"], one["choices"][0]["text"]);
}

TEST(NChoices, StreamingTwoChoicesCarryTheirIndexes) {
  TestServer s(options(2));
  json body = {{"prompt", "Emma"}, {"max_tokens", 20}, {"temperature", 1.0}, {"seed", 3}, {"n", 2}};
  const json whole = post_ok(s, "/v1/completions", body);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto [status, text] = s.post("/v1/completions", body.dump());
  ASSERT_EQ(status, 200) << text;
  bool done = false;
  std::string texts[2];
  std::string finish[2];
  json usage;
  for (const json& e : testing::sse_events(text, &done)) {
    if (e.contains("usage") && !e["usage"].is_null()) usage = e["usage"];
    for (const json& c : e["choices"]) {
      const size_t i = c["index"];
      ASSERT_LT(i, 2u) << e.dump();
      texts[i] += c["text"].get<std::string>();
      if (!c["finish_reason"].is_null()) finish[i] = c["finish_reason"];
    }
  }
  EXPECT_TRUE(done);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(texts[i], whole["choices"][i]["text"].get<std::string>()) << i;
    EXPECT_EQ(finish[i], whole["choices"][i]["finish_reason"].get<std::string>()) << i;
  }
  EXPECT_EQ(usage, whole["usage"]);

  // Chat: each index gets its role chunk, then its content.
  const json chat_body = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 10},
                          {"temperature", 1.0}, {"seed", 3}, {"n", 2}};
  const json chat_whole = post_ok(s, "/v1/chat/completions", chat_body);
  json streamed = chat_body;
  streamed["stream"] = true;
  auto [cs, ctext] = s.post("/v1/chat/completions", streamed.dump());
  ASSERT_EQ(cs, 200) << ctext;
  std::string content[2];
  int roles[2] = {0, 0};
  for (const json& e : testing::sse_events(ctext)) {
    ASSERT_EQ(e["choices"].size(), 1u);
    const json& c = e["choices"][0];
    const size_t i = c["index"];
    ASSERT_LT(i, 2u);
    if (c["delta"].contains("role")) ++roles[i];
    if (c["delta"].contains("content")) content[i] += c["delta"]["content"].get<std::string>();
  }
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(roles[i], 1);
    EXPECT_EQ(content[i], chat_whole["choices"][i]["message"]["content"].get<std::string>()) << i;
  }
}

// A client that leaves mid-stream cancels every choice of its request.
TEST(NChoices, CancellingTheRequestCancelsEveryChoice) {
  TestServer s(options(3));
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(s.port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const std::string b =
      json({{"prompt", "Emma"}, {"max_tokens", 500}, {"temperature", 0.8}, {"ignore_eos", true}, {"n", 3}, {"stream", true}})
          .dump();
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                          std::to_string(b.size()) + "\r\n\r\n" + b;
  ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), ssize_t(req.size()));
  std::string got;
  char buf[4096];
  while (got.find("data: ") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    got.append(buf, size_t(n));
  }
  ::close(fd);
  ASSERT_TRUE(wait_until([&] { return s.metric("osprey:requests_cancelled_total") == 3; }))
      << s.metric("osprey:requests_cancelled_total");
  EXPECT_TRUE(wait_until([&] { return s.metric("osprey:num_requests_running") == 0; }));
  EXPECT_EQ(s.metric("osprey:requests_finished_total"), 0);
}

TEST(NChoices, NIsBoundedByTheServersSequences) {
  TestServer s(options(4));
  for (const json& n : {json(5), json(0), json(-1), json("two"), json(2.5)}) {
    auto [status, r] = s.post_json("/v1/completions", {{"prompt", "a"}, {"max_tokens", 2}, {"n", n}});
    EXPECT_EQ(status, 400) << r.dump();
    EXPECT_EQ(r["error"]["param"], "n") << r.dump();
  }
  auto [status, r] = s.post_json("/v1/chat/completions",
                                 {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 2}, {"n", 9}});
  EXPECT_EQ(status, 400);
  EXPECT_EQ(r["error"]["param"], "n");
  EXPECT_NE(r["error"]["message"].get<std::string>().find("at most 4"), std::string::npos) << r.dump();
}

}  // namespace
}  // namespace osprey
