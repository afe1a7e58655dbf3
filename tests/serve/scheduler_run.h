#pragma once
// Runs prompts through a scheduler made without an engine thread (SchedulerOptions::
// engine_thread false), step by step on the test's thread, and collects each one's tokens.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "serve/scheduler.h"

namespace osprey::testing {

// Submits one request of `max_tokens` per prompt, runs the steps until none is left, and
// returns each request's tokens in order (a failed request is a test failure).
inline std::vector<std::vector<int32_t>> run_prompts(Scheduler& engine, const std::vector<std::vector<int32_t>>& prompts,
                                                     int max_tokens) {
  std::vector<std::shared_ptr<SequenceChannel>> channels;
  for (const auto& prompt : prompts) {
    SequenceRequest r;
    r.prompt = prompt;
    r.params.max_tokens = max_tokens;
    r.channel = std::make_shared<SequenceChannel>();
    channels.push_back(r.channel);
    EXPECT_EQ(engine.submit(std::move(r)), Scheduler::Submit::accepted);
  }
  while (engine.run_step()) {
  }
  std::vector<std::vector<int32_t>> out(channels.size());
  for (size_t i = 0; i < channels.size(); ++i)
    while (auto e = channels[i]->pop(0)) {
      if (e->kind == SequenceEvent::Kind::token) out[i].push_back(e->token);
      if (e->kind == SequenceEvent::Kind::failed) ADD_FAILURE() << e->error;
    }
  return out;
}

}  // namespace osprey::testing
