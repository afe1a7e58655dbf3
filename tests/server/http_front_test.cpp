// The HTTP front over real loopback sockets: pipelining, keep-alive, body and header limits for
// every transfer encoding, slow clients, admission past the queue bound, HTTP/1.0,
// Expect: 100-continue, CORS and shutdown with streams in flight. Raw exchanges are read back
// by Python's http.client (tests/server/raw_http.py), an independent HTTP parser.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "server/harness.h"

namespace osprey {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Runs raw_http.py on `spec` (see its docstring) against `port`.
json raw_exchange(int port, json spec) {
  spec["port"] = port;
  static std::atomic<int> counter{0};
  const std::string base = (std::filesystem::temp_directory_path() /
                            ("osprey-raw-" + std::to_string(::getpid()) + "-" + std::to_string(counter++)))
                               .string();
  testing::write_file(base + ".json", spec.dump());
  const std::string cmd = "python3 " + (testing::source_dir() / "tests/server/raw_http.py").string() + " " + base +
                          ".json > " + base + ".out 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string out = testing::read_file(base + ".out");
  std::filesystem::remove(base + ".json");
  std::filesystem::remove(base + ".out");
  EXPECT_EQ(rc, 0) << out;
  json j = json::parse(out, nullptr, false);
  EXPECT_TRUE(j.is_object()) << out;
  return j.is_object() ? j : json{{"responses", json::array()}, {"error", out}};
}

std::string post_text(const std::string& path, const std::string& body, const std::string& extra = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

double metric_with_labels(const std::string& text, const std::string& sample) {
  const size_t at = text.find("\n" + sample + " ");
  if (at == std::string::npos) return 0;
  return std::stod(text.substr(at + sample.size() + 2));
}

// Milliseconds a GET /health takes on a fresh connection (-1: no 200).
double health_ms(int port) {
  const auto t0 = Clock::now();
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(2, 0);
  c.set_read_timeout(2, 0);
  auto r = c.Get("/health");
  if (!r || r->status != 200) return -1;
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

long peak_rss_kib() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

}  // namespace

TEST(HttpFront, PipelinedRequestsAreAnsweredInOrder) {
  testing::TestServer s;
  const std::vector<std::string> texts = {"Once upon a time", "Emma", "the cat sat on the mat"};
  std::vector<std::string> alone;
  for (const auto& t : texts) alone.push_back(s.post("/tokenize", json{{"content", t}}.dump()).second);
  std::string pipelined;
  for (const auto& t : texts) pipelined += post_text("/tokenize", json{{"content", t}}.dump());
  pipelined += "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  json out = raw_exchange(s.port(), {{"send", {{{"data", pipelined}}}}, {"methods", {"POST", "POST", "POST", "GET"}}});
  ASSERT_EQ(out["responses"].size(), 4u) << out.dump();
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(out["responses"][i]["status"], 200);
    EXPECT_EQ(json::parse(out["responses"][i]["body"].get<std::string>()), json::parse(alone[i])) << i;
  }
  EXPECT_EQ(out["responses"][3]["status"], 200);
}

TEST(HttpFront, KeepAliveServesHundredsOfRequestsOnOneConnection) {
  testing::TestServer s;
  std::string many;
  json methods = json::array();
  for (int i = 0; i < 200; ++i) {
    many += "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    methods.push_back("GET");
  }
  json out = raw_exchange(s.port(), {{"send", {{{"data", many}}}}, {"methods", methods}});
  ASSERT_EQ(out["responses"].size(), 200u) << out["error"];
  for (const auto& r : out["responses"]) EXPECT_EQ(r["status"], 200);
  EXPECT_NE(out["responses"][199]["headers"].value("connection", ""), "close");
}

TEST(HttpFront, ChunkedBodyPastTheLimitIs413BeforeBuffering) {
  ServerOptions o = testing::demo_server_options();
  o.max_body_bytes = 1 << 20;
  testing::TestServer s(o);
  const long rss_before = peak_rss_kib();
  const int fd = testing::connect_loopback(s.port());
  ASSERT_GE(fd, 0);
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  ASSERT_GT(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), 0);
  const std::string chunk_data(1 << 20, 'a');
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", chunk_data.size());
  const std::string chunk = size + chunk_data + "\r\n";
  // The answer is read while the body is still being sent, as a client that watches for an
  // early answer does.
  std::string got;
  std::thread reader([&] {
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) got.append(buf, size_t(n));
  });
  size_t sent = 0;
  for (int i = 0; i < 256; ++i) {  // up to 256 MiB, if the server kept reading
    const ssize_t n = ::send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += size_t(n);
  }
  reader.join();
  ::close(fd);
  EXPECT_EQ(got.substr(0, 12), "HTTP/1.1 413") << got.substr(0, 200);
  EXPECT_NE(got.find("request_too_large"), std::string::npos);
  EXPECT_LT(sent, size_t(64) << 20) << "the server read far past its limit";
  EXPECT_LT(peak_rss_kib() - rss_before, 32 * 1024) << "peak RSS grew by MiB: " << (peak_rss_kib() - rss_before) / 1024;
  EXPECT_EQ(s.get("/health").first, 200);

  // A Content-Length past the limit is refused before any body byte is sent.
  json out = raw_exchange(s.port(), {{"send", {{{"data", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                                                         "10000000000\r\n\r\n"}}}},
                                      {"methods", {"POST"}}});
  ASSERT_EQ(out["responses"].size(), 1u) << out["error"];
  EXPECT_EQ(out["responses"][0]["status"], 413);
  // A client that lies: a chunk larger than it declared fails the parse, no buffering.
  out = raw_exchange(s.port(), {{"send", {{{"data", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
                                                    "chunked\r\n\r\nfffffffffff\r\nabc"}}}},
                                {"methods", {"POST"}}});
  ASSERT_EQ(out["responses"].size(), 1u) << out["error"];
  EXPECT_TRUE(out["responses"][0]["status"] == 413 || out["responses"][0]["status"] == 400) << out.dump();
}

TEST(HttpFront, OversizedHeadersAndRequestLineAre431And414) {
  testing::TestServer s;
  json out = raw_exchange(
      s.port(), {{"send", {{{"data", "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(40000, 'b') + "\r\n\r\n"}}}},
                 {"methods", {"GET"}}});
  ASSERT_EQ(out["responses"].size(), 1u) << out["error"];
  EXPECT_EQ(out["responses"][0]["status"], 431);
  out = raw_exchange(s.port(),
                     {{"send", {{{"data", "GET /health?" + std::string(40000, 'q') + " HTTP/1.1\r\nHost: x\r\n\r\n"}}}},
                      {"methods", {"GET"}}});
  ASSERT_EQ(out["responses"].size(), 1u) << out["error"];
  EXPECT_EQ(out["responses"][0]["status"], 414);
}

TEST(HttpFront, SlowClientsHoldConnectionsNotThreads) {
  ServerOptions o = testing::demo_server_options();
  o.header_timeout_s = 2;
  testing::TestServer s(o);
  std::vector<int> slow;
  for (int i = 0; i < 200; ++i) {
    const int fd = testing::connect_loopback(s.port());
    ASSERT_GE(fd, 0);
    ::send(fd, "GET /health HTTP/1.1\r\nHo", 24, MSG_NOSIGNAL);
    slow.push_back(fd);
  }
  double worst = 0;
  for (int i = 0; i < 10; ++i) {
    const double ms = health_ms(s.port());
    ASSERT_GE(ms, 0) << "probe " << i;
    worst = std::max(worst, ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_LT(worst, 100.0);
  // Past the header deadline every slow connection is closed.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  int closed = 0;
  for (int fd : slow) {
    char c;
    timeval tv{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (::recv(fd, &c, 1, 0) == 0) ++closed;
    ::close(fd);
  }
  EXPECT_EQ(closed, 200);
}

TEST(HttpFront, BurstPastTheQueueBoundGets429CountedInMetrics) {
  ServerOptions o = testing::demo_server_options();
  o.n_slots = 1;
  o.max_queue = 2;
  o.n_http_threads = 0;  // the default
  testing::TestServer s(o);
  const std::string body = json{{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"ignore_eos", true}}.dump();
  std::atomic<int> n_ok{0}, n_busy{0}, n_other{0};
  std::atomic<bool> retry_after{true};
  std::vector<std::thread> clients;
  for (int i = 0; i < 24; ++i)
    clients.emplace_back([&] {
      auto r = s.client()->Post("/v1/completions", body, "application/json");
      if (r && r->status == 200) ++n_ok;
      else if (r && r->status == 429) {
        ++n_busy;
        if (r->get_header_value("Retry-After").empty()) retry_after = false;
        json j = json::parse(r->body, nullptr, false);
        if (!j.is_object() || j["error"].value("type", "") != "rate_limit_error") retry_after = false;
      } else
        ++n_other;
    });
  // While the slot is busy and the queue full, the light routes answer at once.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  double worst = 0, waiting_seen = 0;
  for (int i = 0; i < 5; ++i) {
    for (const char* path : {"/health", "/metrics", "/v1/models"}) {
      const auto t0 = Clock::now();
      auto r = s.client()->Get(path);
      ASSERT_TRUE(r && r->status == 200) << path;
      worst = std::max(worst, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    // Every waiting request counted, and never more than the bound admits.
    waiting_seen = std::max(waiting_seen, s.metric("osprey:num_requests_waiting"));
    EXPECT_LE(s.metric("osprey:num_requests_waiting"), o.max_queue + o.n_slots);
  }
  for (auto& t : clients) t.join();
  EXPECT_LT(worst, 100.0);
  EXPECT_GE(waiting_seen, 1);
  EXPECT_EQ(n_other, 0);
  EXPECT_GE(n_busy, 1);
  EXPECT_EQ(n_ok + n_busy, 24);
  EXPECT_TRUE(retry_after);
  const std::string text = s.server().metrics_text();
  EXPECT_EQ(metric_with_labels(text, "osprey:http_requests_total{route=\"/v1/completions\",status=\"429\"}"), n_busy.load());
  EXPECT_EQ(metric_with_labels(text, "osprey:http_requests_total{route=\"/v1/completions\",status=\"200\"}"), n_ok.load());
}

TEST(HttpFront, Http10GetsCompleteUnchunkedReplies) {
  testing::TestServer s;
  json out = raw_exchange(s.port(), {{"send", {{{"data", "GET /health HTTP/1.0\r\n\r\n"}}}}, {"methods", {"GET"}}});
  ASSERT_EQ(out["responses"].size(), 1u) << out["error"];
  EXPECT_EQ(out["responses"][0]["status"], 200);
  EXPECT_EQ(out["responses"][0]["version"], 10);
  EXPECT_FALSE(out["responses"][0]["headers"].contains("transfer-encoding"));
  EXPECT_EQ(json::parse(out["responses"][0]["body"].get<std::string>())["status"], "ok");
  const std::string body = json{{"prompt", "Emma"}, {"max_tokens", 4}, {"stream", true}}.dump();
  out = raw_exchange(s.port(), {{"send", {{{"data", "POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                                                    "Content-Length: " +
                                                        std::to_string(body.size()) + "\r\n\r\n" + body}}}},
                                {"methods", {"POST"}}});
  ASSERT_EQ(out["responses"].size(), 1u) << out["error"];
  EXPECT_EQ(out["responses"][0]["status"], 200);
  EXPECT_FALSE(out["responses"][0]["headers"].contains("transfer-encoding"));
  bool done = false;
  auto events = testing::sse_events(out["responses"][0]["body"].get<std::string>(), &done);
  EXPECT_TRUE(done);
  EXPECT_FALSE(events.empty());
}

TEST(HttpFront, ExpectContinueIsAnswered) {
  testing::TestServer s;
  const std::string body = json{{"content", "Emma"}}.dump();
  const std::string head = "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
                           "Content-Length: " +
                           std::to_string(body.size()) + "\r\n\r\n";
  json out = raw_exchange(s.port(), {{"send", {{{"data", head}}, {{"data", body}, {"expect_continue", true}}}},
                                     {"methods", {"POST"}}});
  EXPECT_TRUE(out["continue"].get<bool>()) << out["error"];
  ASSERT_EQ(out["responses"].size(), 1u) << out["error"];
  EXPECT_EQ(out["responses"][0]["status"], 200);
}

TEST(HttpFront, CorsPreflightOnlyWhenAnOriginIsSet) {
  const std::string preflight = "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: http://example.com\r\n"
                                "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: "
                                "authorization, content-type\r\n\r\n";
  {
    testing::TestServer s;
    json out = raw_exchange(s.port(), {{"send", {{{"data", preflight}}}}, {"methods", {"OPTIONS"}}});
    ASSERT_EQ(out["responses"].size(), 1u) << out["error"];
    EXPECT_NE(out["responses"][0]["status"], 204);
    EXPECT_FALSE(out["responses"][0]["headers"].contains("access-control-allow-origin"));
  }
  ServerOptions o = testing::demo_server_options();
  o.cors_origin = "*";
  testing::TestServer s(o);
  json out = raw_exchange(s.port(), {{"send", {{{"data", preflight + "GET /health HTTP/1.1\r\nHost: x\r\nOrigin: "
                                                                     "http://example.com\r\n\r\n"}}}},
                                     {"methods", {"OPTIONS", "GET"}}});
  ASSERT_EQ(out["responses"].size(), 2u) << out["error"];
  EXPECT_EQ(out["responses"][0]["status"], 204);
  EXPECT_EQ(out["responses"][0]["headers"].value("access-control-allow-origin", ""), "*");
  EXPECT_NE(out["responses"][0]["headers"].value("access-control-allow-methods", "").find("POST"), std::string::npos);
  EXPECT_NE(out["responses"][0]["headers"].value("access-control-allow-headers", "").find("authorization"),
            std::string::npos);
  EXPECT_EQ(out["responses"][1]["status"], 200);
  EXPECT_EQ(out["responses"][1]["headers"].value("access-control-allow-origin", ""), "*");
}

TEST(HttpFront, RequestIdIsEchoedOrMade) {
  testing::TestServer s;
  auto r = s.client()->Get("/health", {{"X-Request-Id", "abc-123"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->get_header_value("X-Request-Id"), "abc-123");
  auto r2 = s.client()->Get("/health");
  auto r3 = s.client()->Get("/health");
  ASSERT_TRUE(r2 && r3);
  EXPECT_FALSE(r2->get_header_value("X-Request-Id").empty());
  EXPECT_NE(r2->get_header_value("X-Request-Id"), r3->get_header_value("X-Request-Id"));
}

// The latency histograms: one observation per request (per token gap for the inter-token
// one), cumulative buckets ending in +Inf at the count.
TEST(HttpFront, LatencyHistogramsCountEveryRequest) {
  testing::TestServer s;
  for (int i = 0; i < 3; ++i) {
    auto [status, r] = s.post_json("/v1/completions", {{"prompt", "Emma"}, {"max_tokens", 4}, {"ignore_eos", true}});
    ASSERT_EQ(status, 200) << r.dump();
  }
  const std::string text = s.server().metrics_text();
  const std::vector<std::pair<std::string, double>> expected = {
      {"vllm:time_to_first_token_seconds", 3},
      {"vllm:e2e_request_latency_seconds", 3},
      {"vllm:request_queue_time_seconds", 3},
      {"vllm:inter_token_latency_seconds", 9},
      {"vllm:time_per_output_token_seconds", 9},
  };
  for (const auto& [name, count] : expected) {
    EXPECT_NE(text.find("# TYPE " + name + " histogram"), std::string::npos) << name;
    EXPECT_EQ(metric_with_labels(text, name + "_count"), count) << name;
    EXPECT_EQ(metric_with_labels(text, name + "_bucket{le=\"+Inf\"}"), count) << name;
    EXPECT_GT(metric_with_labels(text, name + "_sum"), 0) << name;
    // Cumulative: each bucket holds at least the one before it.
    double last = 0;
    size_t pos = 0;
    const std::string prefix = "\n" + name + "_bucket{le=\"";
    while ((pos = text.find(prefix, pos)) != std::string::npos) {
      const double v = std::stod(text.substr(text.find("} ", pos) + 2));
      EXPECT_GE(v, last) << name;
      last = v;
      pos += prefix.size();
    }
  }
}

TEST(HttpFront, ShutdownEndsStreamsInFlightWithShuttingDown) {
  ServerOptions o = testing::demo_server_options();
  o.n_slots = 2;
  auto s = std::make_unique<testing::TestServer>(o);
  const std::string body =
      json{{"prompt", "Once upon a time"}, {"max_tokens", 100000}, {"ignore_eos", true}, {"stream", true}}.dump();
  std::vector<std::string> bodies(3);
  std::vector<std::thread> clients;
  for (int i = 0; i < 3; ++i)
    clients.emplace_back([&, i] {
      auto r = s->client()->Post("/v1/completions", body, "application/json");
      if (r) bodies[size_t(i)] = r->body;
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = Clock::now();
  s->server().drain(100);
  s->server().stop();
  for (auto& t : clients) t.join();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
  for (const std::string& b : bodies) {
    const size_t at = b.rfind("data: ");
    ASSERT_NE(at, std::string::npos) << b.substr(0, 200);
    json last = json::parse(b.substr(at + 6), nullptr, false);
    ASSERT_TRUE(last.is_object() && last.contains("error")) << b.substr(at);
    EXPECT_EQ(last["error"]["code"], "shutting_down");
    EXPECT_EQ(last["error"]["type"], "unavailable_error");
  }
}

}  // namespace osprey
