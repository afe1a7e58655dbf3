// 200 malformed or hostile requests, all on loopback and bounded: fuzzed JSON, huge numbers,
// wrong types, header abuse, slow and vanishing clients. Every answer is an HTTP status with an
// OpenAI error object (or a normal reply), and the server stays healthy.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

#include "server/harness.h"

namespace osprey {
namespace {

using nlohmann::json;

// Sends `bytes` (in pieces of `piece` bytes with `delay_ms` between them), then reads the
// answer until the server closes or `read_ms` passes. Returns the HTTP status (-1 if none).
int raw_request(int port, const std::string& bytes, size_t piece = 0, int delay_ms = 0, int read_ms = 3000,
                bool close_early = false) {
  const int fd = testing::connect_loopback(port);
  if (fd < 0) return -1;
  timeval tv{read_ms / 1000, (read_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (piece == 0) piece = bytes.size();
  for (size_t i = 0; i < bytes.size(); i += piece) {
    if (::send(fd, bytes.data() + i, std::min(piece, bytes.size() - i), MSG_NOSIGNAL) < 0) break;
    if (delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  }
  if (close_early) {
    ::close(fd);
    return 0;
  }
  std::string got;
  char buf[4096];
  ssize_t n;
  while (got.find("\r\n\r\n") == std::string::npos && (n = ::recv(fd, buf, sizeof buf, 0)) > 0) got.append(buf, size_t(n));
  ::close(fd);
  if (got.rfind("HTTP/1.1 ", 0) != 0) return -1;
  return std::stoi(got.substr(9, 3));
}

std::string http_post(const std::string& body, const std::string& extra_headers = "") {
  return "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra_headers +
         "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

// n bodies made from `valid` with 1 to 4 bytes flipped, dropped or duplicated (seeded).
std::vector<std::string> fuzzed_bodies(const std::string& valid, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    std::string b = valid;
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits && !b.empty(); ++e) {
      const size_t at = rng() % b.size();
      switch (rng() % 3) {
        case 0: b[at] = char(rng() % 256); break;
        case 1: b.erase(at, 1); break;
        default: b.insert(at, 1, b[at]); break;
      }
    }
    out.push_back(std::move(b));
  }
  return out;
}

// Huge numbers and wrong types.
std::vector<std::string> typed_bodies() {
  return {
      R"({"prompt": "a", "max_tokens": 1e308})",
      R"({"prompt": "a", "max_tokens": 99999999999999999999999999})",
      R"({"prompt": "a", "max_tokens": -9223372036854775808})",
      R"({"prompt": "a", "temperature": 1e400})",
      R"({"prompt": "a", "temperature": -0.0, "max_tokens": 1})",
      R"({"prompt": "a", "top_k": 18446744073709551615})",
      R"({"prompt": "a", "seed": 18446744073709551615})",
      R"({"prompt": "a", "seed": -1, "max_tokens": 1})",
      R"({"prompt": "a", "logprobs": 1e9})",
      R"({"prompt": [4294967295]})",
      R"({"prompt": [1.5, 2]})",
      R"({"prompt": [[1, 2], "x", {}]})",
      R"({"prompt": {"text": "a"}})",
      R"({"prompt": null})",
      R"({"prompt": true})",
      R"({"prompt": "a", "stop": [["x"]]})",
      R"({"prompt": "a", "stop": ""})",
      R"({"prompt": "a", "stop": [1, 2]})",
      R"({"prompt": "a", "stream_options": "yes"})",
      R"({"prompt": "a", "stream": 1})",
      R"({"prompt": "a", "n": "1"})",
      R"({"prompt": "a", "model": 7})",
      R"({"prompt": "a", "presence_penalty": 3})",
      R"({"prompt": "a", "min_p": 1})",
      R"({"prompt": "\u0000\ud800", "max_tokens": 1})",
      R"({"prompt": "a", "max_tokens": 1, "prompt": "b"})",
      R"([1, 2, 3])",
      R"("just a string")",
      R"(null)",
      R"()",
      "{\"prompt\": \"\xff\xfe\", \"max_tokens\": 1}",
      R"({"messages": "hi"})",
      R"({"prompt": "a", "logit_bias": {"1": 100}, "max_tokens": 1})",
      R"({"prompt": "a", "echo": true})",
      R"({"prompt": "a", "top_p": "high"})",
      R"({"prompt": "a", "repeat_penalty": 0})",
      R"({"prompt": "a", "max_completion_tokens": 0})",
      R"({"prompt": ")" + std::string(70 << 10, 'a') + R"("})",
      R"({"prompt": [)" + std::string(2000, '[') + "]}",
      R"({"prompt": "a",)" + std::string(1000, ' ') + "}",
  };
}

// Header abuse, sent through raw sockets.
std::vector<std::string> raw_requests() {
  const std::string small = R"({"prompt": "a", "max_tokens": 1})";
  return {
      "GARBAGE\r\n\r\n",
      "POST /v1/completions HTTP/9.9\r\n\r\n",
      "POST /v1/completions HTTP/1.1\r\nContent-Length: abc\r\nConnection: close\r\n\r\n" + small,
      "POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\nConnection: close\r\n\r\n" + small,
      "POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999\r\nConnection: close\r\n\r\n" + small,
      "POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\nConnection: close\r\n\r\n" + small,  // short body
      http_post(small, "X-Long: " + std::string(20000, 'x') + "\r\n"),
      http_post(small, [] {
        std::string h;
        for (int i = 0; i < 300; ++i) h += "X-H" + std::to_string(i) + ": v\r\n";
        return h;
      }()),
      http_post(small, "Authorization: Bearer " + std::string(5000, 'k') + "\r\n"),
      http_post(small, "Transfer-Encoding: chunked\r\n"),
      "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\nxx\r\n0\r\n\r\n",
      "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nFFFFFFFFFFFFFFFF\r\nxx\r\n",
      "GET /" + std::string(10000, 'a') + " HTTP/1.1\r\n\r\n",
      "GET /health\r\n\r\n",
      "\r\n\r\n\r\n",
      std::string(3000, '\0'),
      "DELETE /v1/completions HTTP/1.1\r\nConnection: close\r\n\r\n",
      "GET /v1/completions HTTP/1.1\r\nConnection: close\r\n\r\n",
      "POST /v1/completions?x=" + std::string(3000, '%') + " HTTP/1.1\r\nConnection: close\r\n\r\n",
      http_post(small, "Content-Type: text/plain\r\n"),
  };
}

// n slow and vanishing clients at once: some trickle in, some leave half-way or right after
// sending, some stall in the headers.
void run_slow_clients(int port, int n) {
  std::vector<std::thread> slow;
  for (int i = 0; i < n; ++i) {
    slow.emplace_back([port, i] {
      const std::string req = http_post(json{{"prompt", "Emma"}, {"max_tokens", 40}, {"stream", i % 2 == 0}}.dump());
      if (i % 4 == 0)
        raw_request(port, req, 7, 5);  // trickles in, then reads the answer
      else if (i % 4 == 1)
        raw_request(port, req.substr(0, req.size() / 2), 0, 0, 0, true);  // half a request, then gone
      else if (i % 4 == 2)
        raw_request(port, req, 0, 0, 0, true);  // the whole request, then gone
      else
        raw_request(port, req.substr(0, 30), 0, 0, 1500);  // stalls in the headers
    });
  }
  for (auto& t : slow) t.join();
}

}  // namespace

TEST(ServerHostile, TwoHundredBadRequestsLeaveTheServerHealthy) {
  ServerOptions o = testing::demo_server_options();
  o.timeout_s = 1;
  o.max_body_bytes = 64 << 10;
  o.n_slots = 2;
  testing::TestServer s(o);
  int n_sent = 0;
  auto healthy = [&] { return s.get("/health").first == 200; };
  auto answered = [&](int status, const std::string& body) {
    ++n_sent;
    EXPECT_TRUE(status == 200 || status == 400 || status == 404 || status == 413 || status == 429) << status << " " << body;
    if (status != 200) {
      json j = json::parse(body, nullptr, false);
      EXPECT_TRUE(j.is_object() && j.contains("error") && j["error"].contains("message")) << body;
    }
  };

  // 1. Fuzzed JSON: a valid body with bytes flipped, dropped and duplicated.
  const std::string valid = json{{"prompt", "Emma"}, {"max_tokens", 2}, {"temperature", 0.5}, {"stop", {"x"}}}.dump();
  for (const std::string& b : fuzzed_bodies(valid, 120, 1234)) {
    auto [st, body] = s.post("/v1/completions", b);
    answered(st, body);
  }
  ASSERT_TRUE(healthy());

  // 2. Huge numbers and wrong types.
  for (const std::string& b : typed_bodies()) {
    auto [st, body] = s.post("/v1/completions", b);
    answered(st, body);
  }
  ASSERT_TRUE(healthy());

  // 3. Header abuse, through raw sockets.
  for (const std::string& r : raw_requests()) {
    raw_request(s.port(), r, 0, 0, 2500);
    ++n_sent;
  }
  ASSERT_TRUE(healthy());

  // 4. Slow and vanishing clients, several at once.
  run_slow_clients(s.port(), 20);
  n_sent += 20;
  EXPECT_EQ(n_sent, 200);

  ASSERT_TRUE(healthy());
  auto [st, r] = s.post_json("/v1/completions", {{"prompt", "Emma"}, {"max_tokens", 3}});
  EXPECT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["usage"]["completion_tokens"], 3);
  // Nothing is left running or queued once the clients are gone.
  for (int t = 0; t < 400 && s.metric("osprey:num_requests_running") + s.metric("osprey:num_requests_waiting") > 0; ++t)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(s.metric("osprey:num_requests_running"), 0);
  EXPECT_EQ(s.metric("osprey:num_requests_waiting"), 0);
}

}  // namespace osprey
