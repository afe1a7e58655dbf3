// Many clients at once: 64 greedy completions sent together to a server with 64 slots, whose
// prompts share long prefixes, must each equal the same request served alone, and the server
// must be idle and its KV cache empty afterwards.
#include <gtest/gtest.h>

#include <latch>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "server/harness.h"

namespace osprey {

// gtest's listing of the parameter (else the enum's bytes); found by ADL, so in osprey itself.
void PrintTo(KVLayout layout, std::ostream* os) { *os << (layout == KVLayout::paged ? "paged" : "dense"); }

namespace {

using nlohmann::json;
using testing::TestServer;

constexpr int kClients = 64;
constexpr int kMaxTokens = 16;

// Three long openings (each some 60 tokens of the demo tokenizer) that the prompts share.
const char* const kPrefixes[] = {
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in "
    "want of a wife. However little known the feelings or views of such a man may be on his first entering "
    "a neighbourhood, this truth is so well fixed in the minds of the surrounding families, that",
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, seemed to "
    "unite some of the best blessings of existence; and had lived nearly twenty-one years in the world with "
    "very little to distress or vex her. She was the youngest of the two daughters of",
    "Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man who, for his own amusement, never took "
    "up any book but the Baronetage; there he found occupation for an idle hour, and consolation in a "
    "distressed one; there his faculties were roused into admiration and respect, by contemplating",
};
const char* const kNames[] = {"Emma", "Harriet", "Mr. Knightley", "Jane", "Elizabeth", "Anne", "Mrs. Weston", "Fanny"};
const char* const kVerbs[] = {"said", "thought", "was", "could not", "had never", "wished", "replied", "felt"};

struct Request {
  std::string prompt;
  bool stream = false;
};

// Request i: prefix i % 3, then a suffix no other request has; odd ones stream.
std::vector<Request> make_requests() {
  std::vector<Request> out;
  for (int i = 0; i < kClients; ++i) {
    Request r;
    r.prompt = std::string(kPrefixes[i % 3]) + " " + kNames[i % 8] + " " + kVerbs[i / 8];
    r.stream = i % 2 == 1;
    out.push_back(std::move(r));
  }
  return out;
}

struct Reply {
  int status = -1;
  std::string error;  // what went wrong with the exchange, "" when nothing did
  std::string text;
  std::string finish_reason;
  int64_t completion_tokens = -1;
};

// Sends one greedy completion; a streamed reply is reassembled from its chunks.
Reply complete(const TestServer& s, const Request& r) {
  json body = {{"prompt", r.prompt}, {"max_tokens", kMaxTokens}, {"temperature", 0}};
  if (r.stream) {
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
  }
  Reply out;
  auto [status, text] = s.post("/v1/completions", body.dump());
  out.status = status;
  if (status != 200) {
    out.error = "HTTP " + std::to_string(status) + ": " + text;
    return out;
  }
  try {
    if (!r.stream) {
      const json j = json::parse(text);
      out.text = j["choices"][0]["text"].get<std::string>();
      out.finish_reason = j["choices"][0]["finish_reason"].get<std::string>();
      out.completion_tokens = j["usage"]["completion_tokens"].get<int64_t>();
      return out;
    }
    bool done = false;
    for (const json& e : testing::sse_events(text, &done)) {
      if (e.contains("error")) {
        out.error = "error event: " + e.dump();
        return out;
      }
      if (e.contains("usage") && e["usage"].is_object()) out.completion_tokens = e["usage"]["completion_tokens"];
      for (const json& c : e["choices"]) {
        out.text += c["text"].get<std::string>();
        if (!c["finish_reason"].is_null()) out.finish_reason = c["finish_reason"].get<std::string>();
      }
    }
    if (!done) out.error = "the stream ended without [DONE]: " + text;
  } catch (const std::exception& e) {
    out.error = std::string("malformed reply (") + e.what() + "): " + text;
  }
  return out;
}

// Every unlabelled sample of a /metrics page, by name.
std::map<std::string, double> parse_metrics(const std::string& page) {
  std::map<std::string, double> out;
  std::istringstream in(page);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#' || line.find('{') != std::string::npos) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos) continue;
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

// Sends every request at once, one thread each, released together.
std::vector<Reply> send_all_at_once(const TestServer& s, const std::vector<Request>& requests) {
  std::vector<Reply> replies(requests.size());
  std::latch start(std::ptrdiff_t(requests.size()));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i)
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      replies[i] = complete(s, requests[i]);
    });
  for (auto& t : threads) t.join();
  return replies;
}

void expect_idle(TestServer& s, KVLayout layout, const std::string& when) {
  SCOPED_TRACE(when);
  // A task on the engine thread runs after the step that ended the last sequence has
  // published its statistics, so /metrics is settled from here on. The task itself checks
  // that no sequence wrote into a stored prompt-cache snapshot.
  const auto checksums = s.server().prompt_cache_checksums();
  // The paged layout's prefix cache keeps blocks, not snapshots (tests/kv/paged_pool_test.cpp
  // proves no cached block is written).
  EXPECT_EQ(checksums.empty(), layout == KVLayout::paged);
  for (const auto& c : checksums) EXPECT_EQ(c.now, c.at_store) << "an entry of " << c.n_tokens << " tokens";
  auto [status, page] = s.get("/metrics");
  ASSERT_EQ(status, 200);
  const auto m = parse_metrics(page);
  ASSERT_TRUE(m.count("osprey:num_requests_running") && m.count("osprey:num_requests_waiting") &&
              m.count("osprey:kv_cache_usage_perc") && m.count("osprey:requests_failed_total"))
      << page;
  EXPECT_EQ(m.at("osprey:num_requests_running"), 0);
  EXPECT_EQ(m.at("osprey:num_requests_waiting"), 0);
  EXPECT_EQ(m.at("osprey:kv_cache_usage_perc"), 0);
  EXPECT_EQ(m.at("osprey:requests_failed_total"), 0);
  if (layout == KVLayout::paged) {
    ASSERT_TRUE(m.count("osprey:kv_pool_blocks_in_use")) << page;
    EXPECT_EQ(m.at("osprey:kv_pool_blocks_in_use"), 0) << "the pool is back to empty but for the prefix cache";
  }
}

class ServerConcurrentClients : public ::testing::TestWithParam<KVLayout> {};

}  // namespace

// The paged layout decodes the 64 as batches of changing size and composition; with batch
// invariance on, each reply is bit for bit its serial run. The dense layout decodes its 64
// slots one after another.
TEST_P(ServerConcurrentClients, SixtyFourAtOnceEqualTheirSerialReplies) {
  const KVLayout layout = GetParam();
  const std::vector<Request> requests = make_requests();

  // The reference: each request alone, on a server with one slot and no prompt cache.
  std::vector<Reply> serial;
  {
    ServerOptions o = testing::demo_server_options();
    o.kv_layout = layout;
    o.batch_invariant = layout == KVLayout::paged;
    o.n_slots = 1;
    o.ctx_size = 128;
    o.prompt_cache_mib = 0;
    TestServer s(o);
    for (const Request& r : requests) serial.push_back(complete(s, r));
  }
  for (int i = 0; i < kClients; ++i) {
    ASSERT_EQ(serial[size_t(i)].error, "") << "serial request " << i;
    ASSERT_EQ(serial[size_t(i)].completion_tokens, kMaxTokens) << "serial request " << i;
  }

  ServerOptions o = testing::demo_server_options();
  o.kv_layout = layout;
  o.batch_invariant = layout == KVLayout::paged;
  o.n_slots = kClients;
  o.ctx_size = 128;
  o.n_http_threads = kClients + 16;
  o.max_queue = kClients;
  o.keep_prompt_cache_checksums = true;
  TestServer s(o);
  // Two rounds: in the first every prompt is new; in the second the prompt cache holds the
  // first round's sequences, so the prompts start from restored prefixes.
  for (int round = 0; round < 2; ++round) {
    const std::vector<Reply> replies = send_all_at_once(s, requests);
    for (int i = 0; i < kClients; ++i) {
      const Reply& got = replies[size_t(i)];
      const Reply& want = serial[size_t(i)];
      SCOPED_TRACE("round " + std::to_string(round) + ", request " + std::to_string(i) +
                   (requests[size_t(i)].stream ? " (streamed)" : ""));
      ASSERT_EQ(got.error, "");
      EXPECT_EQ(got.status, 200);
      EXPECT_EQ(got.text, want.text);
      EXPECT_EQ(got.completion_tokens, want.completion_tokens);
      EXPECT_EQ(got.finish_reason, want.finish_reason);
    }
    expect_idle(s, layout, "after round " + std::to_string(round));
  }
  auto [status, page] = s.get("/metrics");
  ASSERT_EQ(status, 200);
  const auto m = parse_metrics(page);
  EXPECT_EQ(m.at("osprey:requests_finished_total"), 2 * kClients);
  // The second round's prompts were all seen in the first: each restores a prefix.
  EXPECT_GE(m.at("osprey:prompt_cache_hits_total"), kClients);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ServerConcurrentClients, ::testing::Values(KVLayout::paged, KVLayout::dense),
                         [](const ::testing::TestParamInfo<KVLayout>& i) {
                           return std::string(i.param == KVLayout::paged ? "paged" : "dense");
                         });

}  // namespace osprey
