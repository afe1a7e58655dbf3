// When a sequence drafts (docs/design.md, "Speculative decoding", "When a sequence drafts"):
// DraftPacer's acceptance windows, stops and back-offs against hand-derived sequences; the
// scheduler over a counting backend (each token's successor is the token plus one) whose n-gram
// drafts are all rejected, all accepted, or rejected and later accepted, and the batch limit;
// and greedy output under the policy against plain decoding on a fixture model, dense and
// paged, in both KV write arms.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"
#include "model/model.h"
#include "serve/paged_backend.h"
#include "serve/scheduler.h"
#include "serve/scheduler_run.h"
#include "serve/speculative.h"
#include "support/test_util.h"

namespace osprey {
namespace {

// ---- DraftPacer ----

TEST(DraftPacer, AllRejectedStopsAfterEachWindowWithADoublingBackoff) {
  DraftPacer p(0.25f);
  // Windows of 32 drafted tokens (four verifies of 8), none accepted: each ends in a stop whose
  // back-off is 16, 32, 64, 128, 256, 512, then stays at 512 (kMaxBackoff).
  const std::vector<int64_t> backoffs = {16, 32, 64, 128, 256, 512, 512};
  for (size_t w = 0; w < backoffs.size(); ++w) {
    for (int v = 0; v < 3; ++v) {
      ASSERT_TRUE(p.drafts());
      p.verified(8, 0);
      EXPECT_FALSE(p.backing_off()) << "judged before the window of 32 filled";
    }
    ASSERT_TRUE(p.drafts());
    p.verified(8, 0);
    EXPECT_EQ(p.n_stops(), int64_t(w + 1));
    for (int64_t i = 0; i < backoffs[w]; ++i) ASSERT_FALSE(p.drafts()) << "window " << w << ", plain step " << i;
    EXPECT_FALSE(p.backing_off());
  }
}

TEST(DraftPacer, PerfectDraftsNeverStop) {
  DraftPacer p(0.25f);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(p.drafts());
    p.verified(8, 8);
  }
  EXPECT_EQ(p.n_stops(), 0);
}

TEST(DraftPacer, TheThresholdIsAcceptedOverDraftedPerWindow) {
  // 8 of 32 is 0.25: not below the threshold; 7 of 32 is.
  DraftPacer at(0.25f);
  at.verified(8, 8);
  for (int i = 0; i < 3; ++i) at.verified(8, 0);
  EXPECT_EQ(at.n_stops(), 0);
  DraftPacer below(0.25f);
  below.verified(8, 7);
  for (int i = 0; i < 3; ++i) below.verified(8, 0);
  EXPECT_EQ(below.n_stops(), 1);
  // A window is judged once it holds 32 or more: one verify of 40 with 9 accepted (0.225) stops.
  DraftPacer long_draft(0.25f);
  long_draft.verified(40, 9);
  EXPECT_EQ(long_draft.n_stops(), 1);
  // 0 never stops.
  DraftPacer never(0.0f);
  for (int i = 0; i < 20; ++i) never.verified(8, 0);
  EXPECT_EQ(never.n_stops(), 0);
}

TEST(DraftPacer, AGoodWindowResetsTheBackoff) {
  DraftPacer p(0.5f);
  // Bounded loops: a back-off that never ends fails rather than hangs.
  constexpr int64_t kMost = 4 * DraftPacer::kMaxBackoff;
  auto window = [&](int64_t accepted) {
    for (int64_t i = 0; !p.drafts(); ++i) ASSERT_LT(i, kMost) << "the back-off never ends";
    p.verified(32, accepted);
  };
  auto plain_steps = [&] {
    int64_t n = 0;
    for (; p.backing_off() && n < kMost; ++n) EXPECT_FALSE(p.drafts());
    return n;
  };
  window(0);
  EXPECT_EQ(plain_steps(), 16);
  window(0);
  EXPECT_EQ(plain_steps(), 32);
  window(32);  // a good window: no stop, and the next stop backs off 16 again
  EXPECT_EQ(plain_steps(), 0);
  window(0);
  EXPECT_EQ(plain_steps(), 16);
  EXPECT_EQ(p.n_stops(), 3);
}

TEST(DraftPacer, ParametersAreRangeChecked) {
  auto refused = [](SpeculativeParams p, const std::string& flag) {
    p.ngram = true;
    try {
      validate(p);
      ADD_FAILURE() << flag << " accepted";
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
    }
  };
  SpeculativeParams p;
  p.min_acceptance = -0.1f;
  refused(p, "--spec-min-acceptance");
  p.min_acceptance = 1.5f;
  refused(p, "--spec-min-acceptance");
  p.min_acceptance = std::numeric_limits<float>::quiet_NaN();
  refused(p, "--spec-min-acceptance");
  p = {};
  p.max_batch = -1;
  refused(p, "--spec-max-batch");
  p.max_batch = kMaxSpecBatch + 1;
  refused(p, "--spec-max-batch");
  p = {};
  p.ngram = true;
  p.min_acceptance = 1;
  p.max_batch = kMaxSpecBatch;
  EXPECT_NO_THROW(validate(p));
}

// ---- The scheduler over a counting backend ----

// A backend whose model continues every token t with (t + 1) % kVocab (greedy logits one-hot),
// verifying and rewinding as a real one does. Records each decode step's invariant flags and
// each verify batch's size.
class CountingBackend final : public SequenceBackend {
 public:
  static constexpr int32_t kVocab = 64;
  explicit CountingBackend(int max_running) : max_running_(max_running) {}
  int max_running() const override { return max_running_; }
  int64_t context_size() const override { return 512; }
  std::optional<Begun> begin(std::span<const int32_t>, const std::string&) override {
    seqs_.emplace_back();
    return Begun{int(seqs_.size()) - 1, 0};
  }
  void prefill(int handle, std::span<const int32_t> tokens, bool want_logits, std::vector<float>& logits) override {
    auto& s = seqs_[size_t(handle)];
    s.insert(s.end(), tokens.begin(), tokens.end());
    if (want_logits) logits = one_hot(s.back());
  }
  void decode(std::span<const DecodeInput> inputs, std::vector<DecodeOutput>& outputs, const MaskFn&) override {
    outputs.assign(inputs.size(), {});
    std::vector<bool> flags;
    for (size_t i = 0; i < inputs.size(); ++i) {
      seqs_[size_t(inputs[i].handle)].push_back(inputs[i].token);
      outputs[i].logits = one_hot(inputs[i].token);
      flags.push_back(inputs[i].invariant);
    }
    decode_invariant.push_back(flags);
  }
  bool can_verify(int) const override { return true; }
  void verify(int handle, std::span<const int32_t> tokens, std::vector<float>& logits) override {
    auto& s = seqs_[size_t(handle)];
    logits.clear();
    for (int32_t t : tokens) {
      s.push_back(t);
      const std::vector<float> row = one_hot(t);
      logits.insert(logits.end(), row.begin(), row.end());
    }
  }
  void verify_batch(std::span<const VerifyInput> items, std::vector<std::vector<float>>& logits) override {
    verify_sizes.push_back(int(items.size()));
    SequenceBackend::verify_batch(items, logits);
  }
  void rewind(int handle, int64_t n) override {
    auto& s = seqs_[size_t(handle)];
    s.resize(s.size() - size_t(n));
  }
  void end(int, std::span<const int32_t>) override {}
  double kv_usage() const override { return 0; }
  KVCounters kv_counters() const override { return {}; }

  std::vector<std::vector<bool>> decode_invariant;
  std::vector<int> verify_sizes;

 private:
  static std::vector<float> one_hot(int32_t t) {
    std::vector<float> l(size_t(kVocab), 0.0f);
    l[size_t((t + 1) % kVocab)] = 1.0f;
    return l;
  }
  int max_running_;
  std::vector<std::vector<int32_t>> seqs_;
};

struct CountedRun {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<SequenceEvent> ends;
  SchedulerStats stats;
};

CountedRun run_counting(CountingBackend& backend, SpeculativeParams spec, const std::vector<std::vector<int32_t>>& prompts,
                        int max_tokens) {
  SchedulerOptions so;
  so.engine_thread = false;
  so.spec = spec;
  Scheduler engine(backend, so);
  std::vector<std::shared_ptr<SequenceChannel>> channels;
  for (const auto& p : prompts) {
    SequenceRequest r;
    r.prompt = p;
    r.params.max_tokens = max_tokens;
    r.channel = std::make_shared<SequenceChannel>();
    channels.push_back(r.channel);
    EXPECT_EQ(engine.submit(std::move(r)), Scheduler::Submit::accepted);
  }
  while (engine.run_step()) {
  }
  CountedRun out;
  out.tokens.resize(prompts.size());
  out.ends.resize(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i)
    while (auto e = channels[i]->pop(0)) {
      if (e->kind == SequenceEvent::Kind::token) out.tokens[i].push_back(e->token);
      else out.ends[i] = *e;
      if (e->kind == SequenceEvent::Kind::failed) ADD_FAILURE() << e->error;
    }
  out.stats = engine.stats();
  engine.stop();
  return out;
}

// The counting model's continuation of `last`: last + 1, last + 2, ... (mod kVocab).
std::vector<int32_t> counting_reply(int32_t last, int n) {
  std::vector<int32_t> r;
  for (int i = 1; i <= n; ++i) r.push_back((last + i) % CountingBackend::kVocab);
  return r;
}

// Pairs (t, t + 2) for t in [from, to): every token of the pairs is followed by t + 2 or by
// t - 1 (the next pair's first), never by t + 1, so a 1-gram draft is always rejected at its
// first token, and no ascending 2-gram occurs.
std::vector<int32_t> pairs(int32_t from, int32_t to) {
  std::vector<int32_t> p;
  for (int32_t t = from; t < to; ++t) {
    p.push_back(t);
    p.push_back((t + 2) % CountingBackend::kVocab);
  }
  return p;
}

SpeculativeParams ngram_spec() {
  SpeculativeParams s;
  s.ngram = true;  // draft_max 8, min_acceptance 0.25
  return s;
}

TEST(DraftPolicy, ASequenceWhoseDraftsNeverMatchStopsDrafting) {
  // The prompt ends with pairs (0, 2) .. (29, 31) and then 0; the reply counts 1, 2, ..., 40.
  // Each of 1 .. 31 was last seen in the pairs followed by another token, so every draft's
  // first token is rejected (the reply's own tokens are distinct: no longer n-gram recurs);
  // 32 .. 40 occur nowhere before (no draft).
  std::vector<int32_t> prompt = pairs(0, 30);
  prompt.push_back(0);
  constexpr int kN = 40;
  // From DraftPacer's rule with --draft-max 8: token 1 comes from the prompt; steps 1-4 verify
  // 8 drafted tokens each (a window of 32, none accepted: a stop, back-off 16); steps 5-20 are
  // plain (tokens 6-21); steps 21-24 verify 8 each (a stop, back-off 32); the reply ends at
  // step 39, inside the back-off. 64 drafted tokens in 8 verifies and 2 stops, within the bound
  // of 2 windows of at most 32 + 8 - 1. Without the policy, each of steps 1-31 drafts 8
  // (tokens left: 39 - step >= 8): 248.
  CountingBackend backend(1);
  const CountedRun r = run_counting(backend, ngram_spec(), {prompt}, kN);
  EXPECT_EQ(r.tokens[0], counting_reply(0, kN));
  EXPECT_EQ(r.ends[0].n_drafted, 64);
  EXPECT_LE(r.ends[0].n_drafted, 2 * (DraftPacer::kWindow + 8 - 1));
  EXPECT_EQ(r.ends[0].n_accepted, 0);
  EXPECT_EQ(r.ends[0].n_draft_stops, 2);
  EXPECT_EQ(r.stats.n_verify_steps, 8u);
  EXPECT_EQ(r.stats.n_draft_stops, 2u);

  // The same without the policy drafts at every step it can: the fixture rejects every draft.
  SpeculativeParams always = ngram_spec();
  always.min_acceptance = 0;
  CountingBackend plain_backend(1);
  const CountedRun a = run_counting(plain_backend, always, {prompt}, kN);
  EXPECT_EQ(a.tokens[0], counting_reply(0, kN));
  EXPECT_EQ(a.ends[0].n_drafted, 31 * 8);
  EXPECT_EQ(a.ends[0].n_accepted, 0);
  EXPECT_EQ(a.ends[0].n_draft_stops, 0);
}

TEST(DraftPolicy, ASequenceWithPerfectDraftsKeepsDrafting) {
  // 0 .. 63, then 0 .. 5: the 3-gram (3, 4, 5) recurs followed by 6, 7, ...: the counting
  // model's own reply. Every step after the first drafts 8 (or what the reply has left) and
  // all are accepted: after the prompt's token, verifies of 8 emit 9 tokens each (tokens 2-46),
  // then one of 1 (the tokens left) emits the last 2.
  std::vector<int32_t> prompt;
  for (int32_t t = 0; t < 64; ++t) prompt.push_back(t);
  for (int32_t t = 0; t <= 5; ++t) prompt.push_back(t);
  CountingBackend backend(1);
  const CountedRun r = run_counting(backend, ngram_spec(), {prompt}, 48);
  EXPECT_EQ(r.tokens[0], counting_reply(5, 48));
  EXPECT_GT(r.ends[0].n_drafted, 0);
  EXPECT_EQ(r.ends[0].n_accepted, r.ends[0].n_drafted);
  EXPECT_EQ(r.ends[0].n_draft_stops, 0);
  EXPECT_EQ(r.ends[0].n_accepted, 5 * 8 + 1);
  EXPECT_EQ(r.stats.n_verify_steps, 6u);
}

TEST(DraftPolicy, DraftingStartsAgainAfterTheBackoff) {
  // 40 .. 63 ascending, then pairs (0, 2) .. (19, 21), then 0: the reply counts 1, 2, ..., 62.
  // Steps 1-4 draft for tokens 1-4 and are rejected (32 drafted: a stop, back-off 16, steps
  // 5-20). Step 21 drafts again, for token 21 (last seen followed by the prompt's 0: 8
  // rejected); 22 .. 39 occur nowhere before (no draft); from 40 on the ascending run is quoted
  // exactly: step 40 drafts 41-48 (8 accepted, and 49), the next 50-57 (8, and 58), the last
  // 59-61 (3: the tokens left, and 62). 59 drafted, 19 accepted, one stop (the second window
  // holds 27 drafted tokens, not judged).
  std::vector<int32_t> prompt;
  for (int32_t t = 40; t < 64; ++t) prompt.push_back(t);
  const std::vector<int32_t> p = pairs(0, 20);
  prompt.insert(prompt.end(), p.begin(), p.end());
  prompt.push_back(0);
  CountingBackend backend(1);
  const CountedRun r = run_counting(backend, ngram_spec(), {prompt}, 62);
  EXPECT_EQ(r.tokens[0], counting_reply(0, 62));
  EXPECT_EQ(r.ends[0].n_draft_stops, 1);
  EXPECT_EQ(r.ends[0].n_drafted, 59);
  EXPECT_EQ(r.ends[0].n_accepted, 19) << "drafting did not start again after the back-off";
}

TEST(DraftPolicy, DraftingPausesForABatchPastTheLimit) {
  // Three sequences with perfect drafts decode together to the end (the same lengths).
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t k = 0; k < 3; ++k) {
    std::vector<int32_t> p;
    for (int32_t t = 0; t < 64; ++t) p.push_back((t + 7 * k) % CountingBackend::kVocab);
    for (int32_t t = 0; t <= 5; ++t) p.push_back((t + 7 * k) % CountingBackend::kVocab);
    prompts.push_back(p);
  }
  auto run = [&](int max_batch, CountingBackend& backend) {
    SpeculativeParams s = ngram_spec();
    s.max_batch = max_batch;
    return run_counting(backend, s, prompts, 40);
  };
  for (int max_batch : {0, 3, 4}) {  // no limit, or a batch at or below it: every sequence drafts
    SCOPED_TRACE(max_batch);
    CountingBackend backend(3);
    const CountedRun r = run(max_batch, backend);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(r.tokens[i], counting_reply(prompts[i].back(), 40));
      EXPECT_GT(r.ends[i].n_accepted, 0);
    }
    EXPECT_EQ(r.stats.n_draft_paused_steps, 0u);
    ASSERT_FALSE(backend.verify_sizes.empty());
    EXPECT_EQ(backend.verify_sizes[0], 3) << "the three verify in one batch";
  }
  for (int max_batch : {1, 2}) {  // a batch of 3 is past it: none drafts, none runs invariant
    SCOPED_TRACE(max_batch);
    CountingBackend backend(3);
    const CountedRun r = run(max_batch, backend);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(r.tokens[i], counting_reply(prompts[i].back(), 40));
      EXPECT_EQ(r.ends[i].n_drafted, 0);
    }
    EXPECT_TRUE(backend.verify_sizes.empty());
    EXPECT_EQ(r.stats.n_draft_paused_steps, 39u) << "every step after the prompts' (39 tokens each)";
    for (const auto& step : backend.decode_invariant)
      for (bool inv : step) EXPECT_FALSE(inv) << "a paused step's rows run in the default mode";
  }
}

TEST(DraftPolicy, ASequenceDraftsAgainWhenTheBatchShrinks) {
  // Two sequences, limit 1: while both run, no drafts; the short one ends after 4 tokens, and
  // the long one drafts from then on.
  std::vector<int32_t> p;
  for (int32_t t = 0; t < 64; ++t) p.push_back(t);
  for (int32_t t = 0; t <= 5; ++t) p.push_back(t);
  CountingBackend backend(2);
  SchedulerOptions so;
  so.engine_thread = false;
  so.spec = ngram_spec();
  so.spec.max_batch = 1;
  Scheduler engine(backend, so);
  std::vector<std::shared_ptr<SequenceChannel>> ch;
  for (int n : {4, 40}) {
    SequenceRequest r;
    r.prompt = p;
    r.params.max_tokens = n;
    r.channel = std::make_shared<SequenceChannel>();
    ch.push_back(r.channel);
    ASSERT_EQ(engine.submit(std::move(r)), Scheduler::Submit::accepted);
  }
  while (engine.run_step()) {
  }
  std::vector<int32_t> tokens[2];
  SequenceEvent ends[2];
  for (int i = 0; i < 2; ++i)
    while (auto e = ch[size_t(i)]->pop(0)) {
      if (e->kind == SequenceEvent::Kind::token)
        tokens[i].push_back(e->token);
      else
        ends[i] = *e;
    }
  EXPECT_EQ(tokens[0], counting_reply(5, 4));
  EXPECT_EQ(tokens[1], counting_reply(5, 40));
  EXPECT_EQ(ends[0].n_drafted, 0);
  EXPECT_GT(ends[1].n_accepted, 0);
  EXPECT_EQ(engine.stats().n_draft_paused_steps, 3u) << "the steps of tokens 2 to 4, with both running";
  engine.stop();
}

// ---- Greedy output under the policy on a fixture model ----

std::filesystem::path policy_fixture(const std::string& family) {
  return testing::source_dir() / "tests/fixtures/models" / family;
}

// A passage, a few other tokens, then its first half again (prompt lookup drafts its second
// half; the random model's continuation rejects part of it).
std::vector<int32_t> quoting_prompt(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(3, 499);
  std::vector<int32_t> passage(48);
  for (int32_t& t : passage) t = id(rng);
  std::vector<int32_t> p = passage;
  for (int i = 0; i < 5; ++i) p.push_back(id(rng));
  p.insert(p.end(), passage.begin(), passage.begin() + 24);
  return p;
}

struct PolicyServed {
  std::vector<std::vector<int32_t>> tokens;
  SchedulerStats stats;
};

PolicyServed serve_paged(Model& model, const SpeculativeParams& spec, bool inplace,
                         const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
  PagedBackendOptions o;
  o.max_sequences = int(prompts.size());
  o.context_size = 256;
  o.block_size = 4;
  o.inplace = inplace;
  o.prefix_cache = false;
  o.prefill_chunk = 16;
  o.verify_rows = spec.enabled() ? spec.draft_max + 1 : 0;
  PagedBackend backend(model, o);
  SchedulerOptions so;
  so.engine_thread = false;
  so.prefill_chunk = 16;
  so.spec = spec;
  Scheduler engine(backend, so);
  PolicyServed out;
  out.tokens = testing::run_prompts(engine, prompts, max_tokens);
  out.stats = engine.stats();
  engine.stop();
  return out;
}

// min_acceptance 1 stops a sequence at every window with a rejection, so its steps switch
// between verifies, back-off steps and verifies again: greedy output stays plain decoding's.
TEST(DraftPolicy, GreedyOutputThroughStopsAndBackoffsIsPlainDecodingPaged) {
  auto model = load_model(policy_fixture("llama"));
  const std::vector<int32_t> prompt = quoting_prompt(17);
  constexpr int kN = 96;
  SpeculativeParams strict;
  strict.ngram = true;
  strict.min_acceptance = 1.0f;
  for (bool inplace : {true, false}) {
    SCOPED_TRACE(inplace ? "in place" : "copying");
    const PolicyServed plain = serve_paged(*model, {}, inplace, {prompt}, kN);
    const PolicyServed spec = serve_paged(*model, strict, inplace, {prompt}, kN);
    ASSERT_EQ(plain.tokens[0].size(), size_t(kN));
    EXPECT_EQ(spec.tokens[0], plain.tokens[0]);
    EXPECT_GT(spec.stats.n_draft_stops, 0u) << "the policy did not stop drafting";
    EXPECT_GT(spec.stats.n_accepted_tokens, 0u);
    EXPECT_GE(spec.stats.n_draft_stops, 2u) << "a second stop: drafting started again after the first";
  }
}

TEST(DraftPolicy, GreedyOutputThroughStopsAndBackoffsIsPlainDecodingDense) {
  auto model = load_model(policy_fixture("llama"));
  const std::vector<std::vector<int32_t>> prompts = {quoting_prompt(17), quoting_prompt(23)};
  constexpr int kN = 96;
  SchedulerOptions strict;
  strict.spec.ngram = true;
  strict.spec.min_acceptance = 1.0f;
  const testing::DenseRun plain = testing::run_on_dense_backend(*model, SchedulerOptions{}, prompts, kN);
  const testing::DenseRun spec = testing::run_on_dense_backend(*model, strict, prompts, kN);
  EXPECT_EQ(spec.tokens, plain.tokens);
  // Without a restart each of the two sequences stops once at most: a third stop is a restart's.
  EXPECT_GE(spec.stats.n_draft_stops, 3u) << "drafting did not start again after a back-off";
}

}  // namespace
}  // namespace osprey
