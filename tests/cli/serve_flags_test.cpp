// osprey serve's flags: values out of range are usage errors (exit 2) naming the flag, before
// any model loads.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

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
}

// Each numeric flag: past its upper bound (or its type's width) it is refused by name with
// its range, before anything starts.
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

}  // namespace osprey

namespace osprey {
namespace {

// A `osprey serve --port 0` child: its pid and the port its log line names.
struct ServeProcess {
  pid_t pid = -1;
  int port = -1;
  std::string log_path;
};

ServeProcess start_serve(const std::string& flags) {
  ServeProcess p;
  p.log_path = (std::filesystem::temp_directory_path() / ("osprey-serve-" + std::to_string(::getpid()) + ".log")).string();
  p.pid = ::fork();
  if (p.pid == 0) {
    const std::string cmd = "exec " + std::string(OSPREY_BINARY) + " serve --port 0 " + flags + " 2>" + p.log_path;
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), (char*)nullptr);
    ::_exit(127);
  }
  for (int i = 0; i < 600 && p.port < 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const std::string log = testing::read_file(p.log_path);
    const size_t at = log.find("serving ");
    const size_t port_at = log.find("listening on http://127.0.0.1:");
    if (at != std::string::npos && port_at != std::string::npos)
      p.port = std::stoi(log.substr(port_at + std::strlen("listening on http://127.0.0.1:")));
  }
  return p;
}

}  // namespace

// SIGTERM with a stream in flight: the stream ends with the shutting_down error after
// --shutdown-timeout (0 here: the demo model's whole context takes about a second), and the
// process exits 0; nothing hangs.
TEST(CliServe, SigtermEndsStreamsAndExitsZero) {
  ServeProcess p = start_serve("--shutdown-timeout 0");
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
  int status = 0;
  ::waitpid(p.pid, &status, 0);
  client.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  ASSERT_TRUE(WIFEXITED(status)) << testing::read_file(p.log_path);
  EXPECT_EQ(WEXITSTATUS(status), 0) << testing::read_file(p.log_path);
  const size_t at = body.rfind("data: ");
  ASSERT_NE(at, std::string::npos) << body.substr(0, 300);
  EXPECT_NE(body.find("\"shutting_down\"", at), std::string::npos) << body.substr(at);
  EXPECT_NE(body.find("\"unavailable_error\"", at), std::string::npos) << body.substr(at);
  std::filesystem::remove(p.log_path);
}

}  // namespace osprey
