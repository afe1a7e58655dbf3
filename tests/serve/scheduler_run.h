#pragma once
// Runs prompts through a scheduler made without an engine thread (SchedulerOptions::
// engine_thread false), step by step on the test's thread, and collects each one's tokens.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "model/model.h"
#include "serve/dense_backend.h"
#include "serve/prompt_cache.h"
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

struct DenseRun {
  std::vector<std::vector<int32_t>> tokens;  // each prompt's
  SchedulerStats stats;
  size_t n_snapshots = 0;  // the prompt cache's entries at the end
};

// run_prompts through a scheduler of options `so` (without an engine thread) over a dense
// backend of two slots of `model`, whose prompt cache keeps checksums: every entry it holds at
// the end must have its rows unchanged since they were stored.
inline DenseRun run_on_dense_backend(Model& model, SchedulerOptions so, const std::vector<std::vector<int32_t>>& prompts,
                                     int max_tokens) {
  PromptCache pc(64u << 20, /*keep_checksums=*/true);
  DenseBackendOptions bo;
  bo.n_slots = 2;
  DenseSlotBackend backend(model, pc, bo);
  so.engine_thread = false;
  Scheduler engine(backend, so);
  DenseRun r;
  r.tokens = run_prompts(engine, prompts, max_tokens);
  r.stats = engine.stats();
  engine.stop();
  const auto sums = pc.checksums();
  for (const auto& c : sums) EXPECT_EQ(c.at_store, c.now) << c.n_tokens << " tokens";
  r.n_snapshots = sums.size();
  return r;
}

}  // namespace osprey::testing
