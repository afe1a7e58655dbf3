#pragma once
// An in-process `osprey serve` on a free loopback port, and the HTTP helpers the server tests
// share.
#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/server.h"
#include "support/test_util.h"

namespace osprey::testing {

inline ServerOptions demo_server_options() {
  ServerOptions o;
  o.model_dir = source_dir() / "models" / "demo";
  o.port = 0;
  o.n_http_threads = 24;
  o.timeout_s = 5;
  return o;
}

class TestServer {
 public:
  explicit TestServer(ServerOptions o = demo_server_options()) : server_(std::make_unique<Server>(o)) {
    port_ = server_->bind();
    server_->start();
    server_->load();
  }
  ~TestServer() { server_->stop(); }
  Server& server() { return *server_; }
  int port() const { return port_; }
  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_read_timeout(60, 0);
    c->set_connection_timeout(5, 0);
    return c;
  }
  // POSTs `body` as JSON; returns (status, body).
  std::pair<int, std::string> post(const std::string& path, const std::string& body,
                                   const httplib::Headers& headers = {}) const {
    auto r = client()->Post(path.c_str(), headers, body, "application/json");
    if (!r) return {-1, "no response: " + httplib::to_string(r.error())};
    return {r->status, r->body};
  }
  std::pair<int, nlohmann::json> post_json(const std::string& path, const nlohmann::json& body,
                                           const httplib::Headers& headers = {}) const {
    auto [status, text] = post(path, body.dump(), headers);
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    return {status, j};
  }
  std::pair<int, std::string> get(const std::string& path, const httplib::Headers& headers = {}) const {
    auto r = client()->Get(path.c_str(), headers);
    if (!r) return {-1, "no response"};
    return {r->status, r->body};
  }
  // The value of one unlabelled sample of /metrics (-1 when absent).
  double metric(const std::string& name) const {
    const std::string text = server_->metrics_text();
    size_t pos = 0;
    while ((pos = text.find(name + " ", pos)) != std::string::npos) {
      if (pos == 0 || text[pos - 1] == '\n') return std::stod(text.substr(pos + name.size() + 1));
      pos += name.size();
    }
    return -1;
  }

 private:
  std::unique_ptr<Server> server_;
  int port_ = 0;
};

// The JSON objects of an SSE body's "data: " lines, up to "[DONE]" (which sets *done).
inline std::vector<nlohmann::json> sse_events(const std::string& body, bool* done = nullptr) {
  std::vector<nlohmann::json> out;
  if (done) *done = false;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    std::string line = body.substr(pos, end - pos);
    pos = end + 2;
    if (line.rfind("data: ", 0) != 0) continue;
    line = line.substr(6);
    if (line == "[DONE]") {
      if (done) *done = true;
      break;
    }
    out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

}  // namespace osprey::testing
