// osprey serve's flags: values out of range are usage errors (exit 2) naming the flag, before
// any model loads.
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "support/serve_process.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using testing::run_osprey;

void expect_usage_error(const std::string& flags, const std::string& name) {
  auto r = run_osprey("serve --port 0 " + flags);
  EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.err;
  EXPECT_NE(r.err.find(name), std::string::npos) << flags << ": " << r.err;
}

}  // namespace

TEST(CliServe, BadBatchingFlagsAreUsageErrors) {
  expect_usage_error("--kv-layout ring", "--kv-layout");
  expect_usage_error("--block-size 0", "--block-size");
  expect_usage_error("--block-size 4096", "--block-size");
  expect_usage_error("--kv-cache-mib -1", "--kv-cache-mib");
  expect_usage_error("--prefill-chunk 0", "--prefill-chunk");
  expect_usage_error("-np 0", "--parallel");
  expect_usage_error("--spec-max-batch -1", "--spec-max-batch");
  expect_usage_error("--spec-max-batch 4097", "--spec-max-batch");
  expect_usage_error("--spec-max-batch x", "--spec-max-batch");
  expect_usage_error("--spec-min-acceptance 1.5", "--spec-min-acceptance");
  expect_usage_error("--spec-min-acceptance -0.1", "--spec-min-acceptance");
}

// Each numeric flag: past its upper bound (or its type's width) it is refused by name with
// its range, before anything starts.
// A speculative-decoding tuning flag without the drafting it tunes would be ignored: each is
// refused by name, with the flag that turns the drafting on.
TEST(CliServe, SpeculativeTuningFlagsNeedTheirDrafting) {
  for (const char* flag : {"--draft-max 4", "--draft-min 2", "--spec-min-acceptance 0.5", "--spec-max-batch 2"}) {
    auto r = run_osprey(std::string("serve --port 0 ") + flag);
    EXPECT_EQ(r.exit_code, 2) << flag << ": " << r.err;
    EXPECT_NE(r.err.find(std::string(flag).substr(0, std::string(flag).find(' '))), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("add --spec-ngram or --model-draft"), std::string::npos) << flag << ": " << r.err;
  }
  auto r = run_osprey("generate --token-ids 5 -n 1 --spec-ngram --draft-p-min 0.5");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--draft-p-min"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("add --model-draft"), std::string::npos) << r.err;
  r = run_osprey("generate --token-ids 5 -n 1 --spec-ngram-max 3");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("add --spec-ngram"), std::string::npos) << r.err;
  r = run_osprey("generate --token-ids 5 -n 2 --spec-ngram --spec-ngram-max 3 --draft-max 4 -q");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// --pan-and-scan on a model without a vision tower (the demo model) stops the server at load,
// naming the flag.
TEST(CliServe, PanAndScanNeedsAVisionTower) {
  auto r = run_osprey("serve --port 0 --pan-and-scan");
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("--pan-and-scan: the model takes no images"), std::string::npos) << r.err;
}

TEST(CliServe, NumericFlagsAreBoundedIntegers) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--kv-cache-mib 4611686018427387904", "--kv-cache-mib"},
      {"--kv-cache-mib 17592186044417", "--kv-cache-mib"},
      {"--prompt-cache-mib 17592186044417", "--prompt-cache-mib"},
      {"--max-body-mib 1125899906842624", "--max-body-mib"},
      {"--max-body-mib 1048577", "--max-body-mib"},
      {"--max-body-mib 0", "--max-body-mib"},
      {"-np 100000", "--parallel"},
      {"--threads-http 1000000", "--threads-http"},
      {"--max-queue 99999999999", "--max-queue"},
      {"--max-queue -1", "--max-queue"},
      {"--port 65536", "--port"},
      {"--timeout 0", "--timeout"},
      {"--timeout 86401", "--timeout"},
      {"--header-timeout 0", "--header-timeout"},
      {"--keep-alive-timeout 0", "--keep-alive-timeout"},
      {"--keep-alive-max 0", "--keep-alive-max"},
      {"--shutdown-timeout -1", "--shutdown-timeout"},
      {"--ctx-size 99999999999", "--ctx-size"},
      {"--timeout 1.5", "--timeout"},
  };
  for (const auto& [flags, name] : cases) {
    auto r = run_osprey("serve --port 0 " + flags);
    EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.err;
    EXPECT_NE(r.err.find(name), std::string::npos) << flags << ": " << r.err;
    // The value and an integer range, never a double.
    const std::string value = flags.substr(flags.find(' ') + 1);
    EXPECT_NE(r.err.find("\"" + value + "\""), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("is not an integer in ["), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find(".000000"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("serving"), std::string::npos) << r.err;
  }
}

TEST(CliServe, ApiKeyFileMustHoldKeys) {
  const auto dir = std::filesystem::temp_directory_path() / ("osprey-keys-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  testing::write_file(dir / "empty", "# no keys here\n\n");
  expect_usage_error("--api-key-file " + (dir / "empty").string(), "--api-key-file");
  expect_usage_error("--api-key-file " + (dir / "missing").string(), "--api-key-file");
  expect_usage_error("--cache-salt-by-key", "--cache-salt-by-key");
  std::filesystem::remove_all(dir);
}

TEST(CliServe, PromptCacheDirFlagsAreChecked) {
  expect_usage_error("--prompt-cache-dir /tmp/x --prompt-cache-mib 0", "--prompt-cache-mib 0");
  expect_usage_error("--prompt-cache-max-gib 2", "--prompt-cache-dir");
  expect_usage_error("--prompt-cache-max-gib -1", "--prompt-cache-max-gib");
}

}  // namespace osprey

namespace osprey {

using testing::ServeProcess;
using testing::start_serve;

// SIGTERM with a stream in flight: the stream ends with the shutting_down error after
// --shutdown-timeout (0 here: the demo model's whole context takes about a second on one CPU
// thread; the signal tests run on the CPU, whose pace they rely on, whatever device the machine
// has), and the process exits 0; nothing hangs.
TEST(CliServe, SigtermEndsStreamsAndExitsZero) {
  ServeProcess p = start_serve("--device cpu --shutdown-timeout 0", "OSPREY_THREADS=1");
  ASSERT_GT(p.port, 0) << testing::read_file(p.log_path);
  std::string body;
  std::thread client([&] {
    httplib::Client c("127.0.0.1", p.port);
    c.set_read_timeout(30, 0);
    auto r = c.Post("/v1/completions",
                    R"({"prompt": "Once upon a time", "max_tokens": 100000, "ignore_eos": true, "stream": true})",
                    "application/json");
    if (r) body = r->body;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(p.pid, SIGTERM);
  const std::optional<int> exited = testing::wait_exit(p.pid, std::chrono::seconds(20));
  client.join();
  ASSERT_TRUE(exited) << "no exit 20 s after SIGTERM: " << testing::read_file(p.log_path);
  const int status = *exited;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  ASSERT_TRUE(WIFEXITED(status)) << testing::read_file(p.log_path);
  EXPECT_EQ(WEXITSTATUS(status), 0) << testing::read_file(p.log_path);
  const size_t at = body.rfind("data: ");
  ASSERT_NE(at, std::string::npos) << body.substr(0, 300);
  EXPECT_NE(body.find("\"shutting_down\"", at), std::string::npos) << body.substr(at);
  EXPECT_NE(body.find("\"unavailable_error\"", at), std::string::npos) << body.substr(at);
  std::filesystem::remove(p.log_path);
}

// Threads that exist before main() keep the default signal mask (the CUDA driver's threads once
// a device is selected; a tool's injected into the process): a SIGTERM the kernel hands to one of
// them still drains the server and exits 0, each time, instead of ending the process at once.
TEST(CliServe, SignalsLandingOnThreadsStartedBeforeMainDrain) {
  for (int round = 0; round < 3; ++round) {
    ServeProcess p = start_serve("--device cpu --shutdown-timeout 0",
                                 std::string("OSPREY_THREADS=1 LD_PRELOAD=") + OSPREY_TEST_EARLY_THREADS);
    ASSERT_GT(p.port, 0) << testing::read_file(p.log_path);
    ::kill(p.pid, round == 1 ? SIGINT : SIGTERM);
    const std::optional<int> exited = testing::wait_exit(p.pid, std::chrono::seconds(20));
    ASSERT_TRUE(exited) << "no exit 20 s after the signal: " << testing::read_file(p.log_path);
    ASSERT_TRUE(WIFEXITED(*exited)) << "ended by signal " << (WIFSIGNALED(*exited) ? WTERMSIG(*exited) : 0) << ": "
                                    << testing::read_file(p.log_path);
    EXPECT_EQ(WEXITSTATUS(*exited), 0) << testing::read_file(p.log_path);
    const std::string log = testing::read_file(p.log_path);
    EXPECT_NE(log.find(round == 1 ? "received SIGINT" : "received SIGTERM"), std::string::npos) << log;
    EXPECT_NE(log.find("stopped"), std::string::npos) << log;
    std::filesystem::remove(p.log_path);
  }
}

namespace {

// Completions that fill the demo model's context, streamed; at -np 1 all but one wait.
constexpr const char* kLongStream =
    R"({"prompt": "Once upon a time", "max_tokens": 100000, "ignore_eos": true, "stream": true})";

// A streaming POST in its own thread: the bytes received so far, and the whole body once joined.
class StreamingRequest {
 public:
  StreamingRequest(int port, const std::string& body)
      : thread_([this, port, body] {
          httplib::Client c("127.0.0.1", port);
          c.set_read_timeout(60, 0);
          c.set_connection_timeout(5, 0);
          httplib::Request req;
          req.method = "POST";
          req.path = "/v1/completions";
          req.body = body;
          req.set_header("Content-Type", "application/json");
          req.content_receiver = [this](const char* data, size_t n, uint64_t, uint64_t) {
            std::lock_guard<std::mutex> lock(mu_);
            body_.append(data, n);
            received_ += n;
            return true;
          };
          auto r = c.send(req);
          std::lock_guard<std::mutex> lock(mu_);
          if (r && body_.empty()) body_ = r->body;
        }) {}
  ~StreamingRequest() {
    if (thread_.joinable()) thread_.join();
  }
  size_t received() const { return received_; }
  bool finished() {
    std::lock_guard<std::mutex> lock(mu_);
    return body_.find("data: [DONE]") != std::string::npos;
  }
  std::string join() {
    thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    return body_;
  }

 private:
  std::mutex mu_;
  std::string body_;
  std::atomic<size_t> received_{0};
  std::thread thread_;
};

size_t total_received(const std::vector<std::unique_ptr<StreamingRequest>>& streams) {
  size_t n = 0;
  for (const auto& s : streams) n += s->received();
  return n;
}

// Waits up to `limit` for `done`; whether it held.
bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

// A body's JSON events: an SSE stream's "data: " events up to "[DONE]" (an event cut off by
// the end of the body is left out), or a refusal's one JSON body.
struct Events {
  std::vector<nlohmann::json> events;
  bool done = false;  // "data: [DONE]" ended the stream
};

Events parse_events(const std::string& body) {
  Events e;
  if (body.rfind("data: ", 0) != 0) {
    nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    if (!j.is_discarded()) e.events.push_back(std::move(j));
    return e;
  }
  for (size_t pos = 0; pos < body.size();) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    const std::string line = body.substr(pos, end - pos);
    pos = end + 2;
    if (line.rfind("data: ", 0) != 0) continue;
    if (line == "data: [DONE]") {
      e.done = true;
      break;
    }
    nlohmann::json j = nlohmann::json::parse(line.substr(6), nullptr, false);
    if (!j.is_discarded()) e.events.push_back(std::move(j));
  }
  return e;
}

bool is_error(const nlohmann::json& event) { return event.is_object() && event.contains("error"); }

// Whether a body's last event is the shutting_down error (an SSE event or a JSON error body).
bool ends_shutting_down(const std::string& body) {
  const Events e = parse_events(body);
  if (e.events.empty() || !is_error(e.events.back())) return false;
  const nlohmann::json& error = e.events.back()["error"];
  return error.is_object() && error.contains("code") && error["code"] == "shutting_down" && error.contains("type") &&
         error["type"] == "unavailable_error";
}

// Whether a body completed normally: a stream's [DONE] with no error event before it. (Events
// are parsed: a generated token may well be the text "error".)
bool completed(const std::string& body) {
  const Events e = parse_events(body);
  return e.done && std::none_of(e.events.begin(), e.events.end(), is_error);
}

// A gauge of /metrics (-1 when /metrics does not answer or lacks it).
int64_t gauge(int port, const std::string& name) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(5, 0);
  auto r = c.Get("/metrics");
  if (!r || r->status != 200) return -1;
  const size_t at = r->body.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return int64_t(std::stod(r->body.substr(at + name.size() + 2)));
}

// `n` long streams, once the server holds every one of them (running, waiting, or done).
std::vector<std::unique_ptr<StreamingRequest>> start_streams(int port, int n) {
  std::vector<std::unique_ptr<StreamingRequest>> streams;
  for (int i = 0; i < n; ++i) streams.push_back(std::make_unique<StreamingRequest>(port, kLongStream));
  const bool held = wait_until(
      [&] {
        int64_t done = 0;
        for (auto& s : streams) done += s->finished();
        return gauge(port, "osprey:num_requests_running") + gauge(port, "osprey:num_requests_waiting") + done >= n;
      },
      std::chrono::seconds(30));
  EXPECT_TRUE(held) << "the server did not take all " << n << " requests within 30 s";
  return streams;
}

// 12 long streams on the server `p` (one CPU thread, one sequence at a time: their work lasts
// several seconds), once it holds them all and some bytes have come.
void start_busy(const ServeProcess& p, std::vector<std::unique_ptr<StreamingRequest>>& streams) {
  ASSERT_GT(p.port, 0) << testing::read_file(p.log_path);
  streams = start_streams(p.port, 12);
  ASSERT_TRUE(wait_until([&] { return total_received(streams) > 0; }, std::chrono::seconds(30)))
      << testing::read_file(p.log_path);
}

// How many of the streams ended with the shutting_down error; every other one must have
// completed.
int n_ended_shutting_down(std::vector<std::unique_ptr<StreamingRequest>>& streams, const std::string& log_path) {
  int ended = 0;
  for (auto& s : streams) {
    const std::string body = s->join();
    if (ends_shutting_down(body)) {
      ++ended;
    } else {
      EXPECT_TRUE(completed(body)) << "[" << body.substr(0, 300) << "] ... ["
                                   << body.substr(body.size() > 300 ? body.size() - 300 : 0) << "]\n"
                                   << testing::read_file(log_path);
    }
  }
  return ended;
}

}  // namespace

// SIGINT once: no new connection is served, the requests in progress go on (bytes keep coming);
// SIGINT again, long before --shutdown-timeout: the process exits 0 at once, and the requests
// still in progress end with the shutting_down error.
TEST(CliServe, SecondSigintEndsAtOnce) {
  ServeProcess p = start_serve("--device cpu -np 1 --shutdown-timeout 120", "OSPREY_THREADS=1");
  std::vector<std::unique_ptr<StreamingRequest>> streams;
  ASSERT_NO_FATAL_FAILURE(start_busy(p, streams));

  ::kill(p.pid, SIGINT);
  ASSERT_TRUE(wait_until([&] { return testing::read_file(p.log_path).find("received SIGINT") != std::string::npos; },
                         std::chrono::seconds(10)))
      << testing::read_file(p.log_path);
  const size_t at_first = total_received(streams);
  {
    httplib::Client c("127.0.0.1", p.port);
    c.set_connection_timeout(2, 0);
    c.set_read_timeout(5, 0);
    auto r = c.Post("/v1/completions", R"({"prompt": "Hello", "max_tokens": 2})", "application/json");
    EXPECT_TRUE(!r || r->status == 503) << "a request after SIGINT got " << r->status << ": " << r->body;
  }
  EXPECT_TRUE(wait_until([&] { return total_received(streams) > at_first; }, std::chrono::seconds(10)))
      << "no stream made progress after the first SIGINT";

  const auto t0 = std::chrono::steady_clock::now();
  ::kill(p.pid, SIGINT);
  const std::optional<int> exited = testing::wait_exit(p.pid, std::chrono::seconds(20));
  ASSERT_TRUE(exited) << "no exit 20 s after the second SIGINT: " << testing::read_file(p.log_path);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  ASSERT_TRUE(WIFEXITED(*exited)) << testing::read_file(p.log_path);
  EXPECT_EQ(WEXITSTATUS(*exited), 0) << testing::read_file(p.log_path);
  EXPECT_NE(testing::read_file(p.log_path).find("received a second signal"), std::string::npos)
      << testing::read_file(p.log_path);

  EXPECT_GE(n_ended_shutting_down(streams, p.log_path), 1) << "no request was still in progress at the second SIGINT";
  std::filesystem::remove(p.log_path);
}

// SIGTERM with --shutdown-timeout 1 and more work than a second: the requests go on for the
// second, then those left end with shutting_down; exit 0, no sooner than the timeout.
TEST(CliServe, SigtermDrainsForTheShutdownTimeoutThenEndsTheRest) {
  ServeProcess p = start_serve("--device cpu -np 1 --shutdown-timeout 1", "OSPREY_THREADS=1");
  std::vector<std::unique_ptr<StreamingRequest>> streams;
  ASSERT_NO_FATAL_FAILURE(start_busy(p, streams));

  const auto t0 = std::chrono::steady_clock::now();
  ::kill(p.pid, SIGTERM);
  const size_t at_signal = total_received(streams);
  const std::optional<int> exited = testing::wait_exit(p.pid, std::chrono::seconds(30));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(exited) << "no exit 30 s after SIGTERM: " << testing::read_file(p.log_path);
  ASSERT_TRUE(WIFEXITED(*exited)) << testing::read_file(p.log_path);
  EXPECT_EQ(WEXITSTATUS(*exited), 0) << testing::read_file(p.log_path);
  EXPECT_GE(seconds, 0.9);
  EXPECT_LT(seconds, 10.0);

  const int ended = n_ended_shutting_down(streams, p.log_path);
  EXPECT_GT(total_received(streams), at_signal) << "nothing was served during the drain";
  EXPECT_GE(ended, 1) << "no request outlived the shutdown timeout";
  std::filesystem::remove(p.log_path);
}

}  // namespace osprey

namespace osprey {

// `osprey serve --prompt-cache-dir`, stopped by SIGTERM and started again on the folder: the
// first server's cached prompt is on disk when it exits, and the second one's first request
// reuses it.
TEST(CliServe, PromptCacheDirSurvivesARestart) {
  testing::TempDir dir;
  const std::string flags = "--device cpu --shutdown-timeout 0 --prompt-cache-dir " + dir.path().string();
  const std::string body =
      R"({"prompt": "It is a truth universally acknowledged, that a single man in possession of a good fortune", )"
      R"("max_tokens": 4, "temperature": 0})";
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    ServeProcess p = start_serve(flags, "OSPREY_THREADS=1");
    ASSERT_GT(p.port, 0) << testing::read_file(p.log_path);
    httplib::Client c("127.0.0.1", p.port);
    c.set_read_timeout(30, 0);
    auto r = c.Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const int64_t cached = nlohmann::json::parse(r->body)["usage"]["prompt_tokens_details"]["cached_tokens"];
    if (round == 0)
      EXPECT_EQ(cached, 0);
    else
      EXPECT_GT(cached, 0) << testing::read_file(p.log_path);
    ::kill(p.pid, SIGTERM);
    const std::optional<int> exited = testing::wait_exit(p.pid, std::chrono::seconds(30));
    ASSERT_TRUE(exited) << testing::read_file(p.log_path);
    EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 0) << testing::read_file(p.log_path);
    bool any = false;
    for (const auto& e : std::filesystem::directory_iterator(dir / "auto"))
      any |= e.path().extension() == ".oskv";
    EXPECT_TRUE(any);
    std::filesystem::remove(p.log_path);
  }
}

}  // namespace osprey
