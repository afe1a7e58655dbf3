// A real sticky CUDA error while serving: OSPREY_CUDA_FAULT=trap_after_steps:N makes a decode
// step trap on the device, and the runtime's own error check turns the next CUDA call's
// failure into DeviceLost. `osprey serve --device cuda` must then answer the request in
// flight with 503 device_lost, answer /health with 503 while it still answers, and exit 1.
// The CUDA instance exists only where a device is present; the CPU one skips.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "support/device_test.h"
#include "support/serve_process.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using nlohmann::json;

class CudaFault : public testing::DeviceTest {};

using testing::error_code;

TEST_P(CudaFault, TrapInADecodeStepEndsTheRequestHealthAndProcess) {
  if (!on_cuda()) GTEST_SKIP() << "OSPREY_CUDA_FAULT drills a CUDA device (the CPU refusal: CliServe.CudaFaultOnCpuIsRefused)";
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "whole");
    testing::ServeProcess p = testing::start_serve("--device cuda -np 1", "OSPREY_CUDA_FAULT=trap_after_steps:3");
    ASSERT_GT(p.port, 0) << testing::read_file(p.log_path);
    {
      httplib::Client c("127.0.0.1", p.port);
      c.set_read_timeout(10, 0);
      auto h = c.Get("/health");
      ASSERT_TRUE(h);
      EXPECT_EQ(h->status, 200) << h->body;
    }

    // /health is probed throughout; once the failure is known it must never answer 200.
    std::atomic<bool> failed{false}, done{false};
    std::mutex mu;
    std::vector<std::pair<bool, int>> probes;  // (after the failure was seen, status)
    std::thread prober([&] {
      while (!done) {
        const bool after = failed;
        httplib::Client c("127.0.0.1", p.port);
        c.set_connection_timeout(1, 0);
        c.set_read_timeout(2, 0);
        auto h = c.Get("/health");
        if (h) {
          std::lock_guard<std::mutex> lock(mu);
          probes.emplace_back(after, h->status);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });

    const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 64}, {"ignore_eos", true}, {"stream", stream}};
    httplib::Client c("127.0.0.1", p.port);
    c.set_read_timeout(60, 0);
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    failed = true;
    ASSERT_TRUE(r) << testing::read_file(p.log_path);
    if (stream) {
      // The stream had started (200): its last event is the error.
      EXPECT_EQ(r->status, 200) << r->body;
      const size_t at = r->body.rfind("\"error\"");
      ASSERT_NE(at, std::string::npos) << r->body;
      EXPECT_NE(r->body.find("\"device_lost\"", at), std::string::npos) << r->body;
    } else {
      EXPECT_EQ(r->status, 503) << r->body;
      EXPECT_EQ(error_code(r->body), "device_lost") << r->body;
    }
    // The runtime's check of a CUDA call found the sticky error (not a host-side shortcut).
    EXPECT_NE(r->body.find("the CUDA device failed"), std::string::npos) << r->body;

    const std::optional<int> exited = testing::wait_exit(p.pid, std::chrono::seconds(30));
    done = true;
    prober.join();
    const std::string log = testing::read_file(p.log_path);
    ASSERT_TRUE(exited) << "no exit 30 s after the device failed: " << log;
    ASSERT_TRUE(WIFEXITED(*exited)) << log;
    EXPECT_EQ(WEXITSTATUS(*exited), 1) << log;
    EXPECT_NE(log.find("OSPREY_CUDA_FAULT: decode step 4 traps"), std::string::npos) << log;
    EXPECT_NE(log.find("serving stopped"), std::string::npos) << log;
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [after, status] : probes) {
      if (after) {
        EXPECT_EQ(status, 503) << "/health answered " << status << " after the device failed";
      }
    }
    std::filesystem::remove(p.log_path);
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, CudaFault, OSPREY_DEVICES);

}  // namespace

// On the CPU the drill has nothing to act on: a request is refused naming the variable,
// never served as if it were unset.
TEST(CliServe, CudaFaultOnCpuIsRefused) {
  testing::ServeProcess p = testing::start_serve("--device cpu", "OSPREY_CUDA_FAULT=trap_after_steps:3");
  ASSERT_GT(p.port, 0) << testing::read_file(p.log_path);
  httplib::Client c("127.0.0.1", p.port);
  c.set_read_timeout(30, 0);
  auto r = c.Post("/v1/completions", R"({"prompt": "Once upon a time", "max_tokens": 8})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_GE(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("OSPREY_CUDA_FAULT"), std::string::npos) << r->body;
  ::kill(p.pid, SIGTERM);
  const std::optional<int> exited = testing::wait_exit(p.pid, std::chrono::seconds(20));
  ASSERT_TRUE(exited) << testing::read_file(p.log_path);
  std::filesystem::remove(p.log_path);
}

// A malformed value is an error naming the variable, before anything runs.
TEST(CliServe, CudaFaultMustBeWellFormed) {
  for (const std::string v : {"trap", "trap_after_steps:", "trap_after_steps:-1", "trap_after_steps:x",
                              "trap_after_steps:99999999999"}) {
    auto r = testing::run_osprey("generate --device cpu -p hi -n 2", "OSPREY_CUDA_FAULT=" + v);
    EXPECT_NE(r.exit_code, 0) << v;
    EXPECT_NE(r.err.find("OSPREY_CUDA_FAULT=" + v), std::string::npos) << v << ": " << r.err;
  }
}

}  // namespace osprey
