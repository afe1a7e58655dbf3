// A device that fails for good while serving (DeviceLost: a sticky CUDA error) ends the
// requests in flight with 503 device_lost, turns /health to 503, refuses new requests, and
// wakes Server::wait() so that `osprey serve` exits non-zero for its supervisor to restart it.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <nlohmann/json.hpp>

#include "server/harness.h"
#include "support/scripted_model.h"
#include "support/test_util.h"
#include "tokenizer/tokenizer.h"

namespace osprey {
namespace {

using nlohmann::json;

using testing::error_code;

TEST(ServerDeviceLost, InFlightRequestGets503HealthTurns503AndWaitReturns) {
  testing::register_scripted_family();
  testing::TempDir dir;
  const auto tokenizer_dir = testing::source_dir() / "models" / "demo";
  const Tokenizer tok = Tokenizer::load(tokenizer_dir);
  const std::string prompt = "Mr. Knightley was";
  const int64_t n_prompt = int64_t(tok.encode(prompt, true).size());
  const std::vector<int32_t> script = tok.encode(" a sensible man, and", false);
  ASSERT_GE(script.size(), 4u);
  // Two tokens come out, then the third decode step finds the device gone.
  testing::write_scripted_model(dir.path(), tokenizer_dir, tok.vocab_size(), tok.eos_ids().at(0), n_prompt, script,
                                n_prompt + 2);
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "whole");
    ServerOptions o = testing::demo_server_options();
    o.model_dir = dir.path();
    testing::TestServer s(o);
    ASSERT_EQ(s.get("/health").first, 200);
    EXPECT_EQ(s.server().device_lost(), "");

    const json body = {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}, {"stream", stream}};
    auto [status, text] = s.post("/v1/completions", body.dump());
    if (stream) {
      // The stream had started (200): its last event is the error.
      EXPECT_EQ(status, 200) << text;
      EXPECT_NE(text.find("\"device_lost\""), std::string::npos) << text;
    } else {
      EXPECT_EQ(status, 503) << text;
      EXPECT_EQ(error_code(text), "device_lost") << text;
    }

    // Server::wait() returns without stop(), and says why.
    auto waited = std::async(std::launch::async, [&] { s.server().wait(); });
    ASSERT_EQ(waited.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    EXPECT_NE(s.server().device_lost().find("injected device failure"), std::string::npos) << s.server().device_lost();

    auto [hstatus, htext] = s.get("/health");
    EXPECT_EQ(hstatus, 503) << htext;
    EXPECT_EQ(error_code(htext), "device_lost") << htext;
    auto [again, again_text] = s.post("/v1/completions", body.dump());
    EXPECT_EQ(again, 503) << again_text;
    EXPECT_EQ(error_code(again_text), "device_lost") << again_text;
    EXPECT_EQ(s.get("/metrics").first, 200);
  }
}

}  // namespace
}  // namespace osprey
