#pragma once
// An in-process `osprey serve` on a free loopback port, and the HTTP helpers the server tests
// share.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "model/model.h"
#include "serve/generate.h"
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

// The events of an SSE body that names them ("event: NAME" then "data: JSON"): (name, data);
// a block that is not such an event comes back as ("", null), which no test expects.
inline std::vector<std::pair<std::string, nlohmann::json>> sse_named_events(const std::string& body) {
  std::vector<std::pair<std::string, nlohmann::json>> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    const std::string e = body.substr(pos, end - pos);
    pos = end + 2;
    const size_t nl = e.find('\n');
    if (e.rfind("event: ", 0) != 0 || nl == std::string::npos || e.compare(nl + 1, 6, "data: ") != 0) {
      out.emplace_back("", nullptr);
      continue;
    }
    out.emplace_back(e.substr(7, nl - 7), nlohmann::json::parse(e.substr(nl + 7), nullptr, false));
  }
  return out;
}

// Why a test of an npm client cannot run here: node_modules/<package> is missing (npm ci was
// not run) or node is not installed; "" when it can.
inline std::string node_client_missing(const std::string& package) {
  if (!std::filesystem::exists(source_dir() / "node_modules" / package / "package.json"))
    return "node_modules/" + package + " is missing: run npm ci";
  if (std::system("node --version > /dev/null 2>&1") != 0) return "node is not installed";
  return "";
}

// Runs `node tests/server/SCRIPT ARGS...` in the source folder, each argument quoted for the
// shell; the exit status and what it printed (stdout and stderr together).
inline std::pair<int, std::string> run_node_script(const std::string& script, const std::vector<std::string>& args) {
  auto quote = [](const std::string& a) {
    std::string q = "'";
    for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  std::string cmd = "cd " + quote(source_dir().string()) + " && node " + quote((source_dir() / "tests" / "server" / script).string());
  for (const std::string& a : args) cmd += " " + quote(a);
  cmd += " 2>&1";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  return {::pclose(p), out};
}

// A TCP connection to the server's loopback port, or -1.
inline int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The greedy reply of the library's generate() on the demo model for `prompt`, stopping at its
// EOS: the reference for a server's greedy replies.
inline std::vector<int32_t> demo_greedy_reference(const std::vector<int32_t>& prompt, int n) {
  static std::unique_ptr<Model> model = load_model(source_dir() / "models" / "demo");
  SequenceCache cache = model->make_cache({});
  GenerateParams p;
  p.max_tokens = n;
  p.stop_ids = model->info().eos_ids;
  return generate(*model, cache, prompt, p).tokens;
}

}  // namespace osprey::testing
