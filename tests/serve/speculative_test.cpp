// Speculative decoding (docs/design.md, "Speculative decoding"): prompt-lookup drafts, the
// verify step's rows written in place and given back by moving the cache's length, greedy and
// sampled output identical to plain decoding on every family that drafts, and the sampled
// acceptance rule's distribution against the exact target distribution.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/cuda_available.h"
#include "core/error.h"
#include "kv/dense_cache.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "serve/dense_backend.h"
#include "serve/generate.h"
#include "serve/prompt_cache.h"
#include "serve/scheduler.h"
#include "serve/scheduler_run.h"
#include "serve/speculative.h"
#include "support/families.h"
#include "support/kv_params.h"
#include "support/test_util.h"

namespace osprey {
namespace {

std::filesystem::path spec_fixture(const std::string& family) {
  return testing::source_dir() / "tests/fixtures/models" / family;
}

// A prompt that quotes a passage: the passage, a few other tokens, then its first half again,
// so that prompt lookup drafts the passage's second half.
std::vector<int32_t> spec_quoting_prompt(int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(3, int32_t(std::min<int64_t>(vocab, 500)) - 1);
  std::vector<int32_t> passage(48);
  for (int32_t& t : passage) t = id(rng);
  std::vector<int32_t> p = passage;
  for (int i = 0; i < 5; ++i) p.push_back(id(rng));
  p.insert(p.end(), passage.begin(), passage.begin() + 24);
  return p;
}

// FNV-1a over rows [0, n) of a [heads, capacity, head_dim] 16-bit cache array on the host.
uint64_t spec_rows_checksum(const Array& a, int64_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* base = a.data<uint16_t>();
  const Shape& st = a.strides();
  for (int64_t hd = 0; hd < a.dim(0); ++hd)
    for (int64_t r = 0; r < n; ++r)
      for (int64_t d = 0; d < a.dim(2); ++d) {
        h ^= base[hd * st[0] + r * st[1] + d * st[2]];
        h *= 1099511628211ull;
      }
  return h;
}

uint64_t spec_state_checksum(const std::vector<KVState>& states) {
  uint64_t h = 0;
  for (const KVState& s : states)
    if (s.keys.defined()) h = h * 31 + spec_rows_checksum(s.keys, s.offset) * 7 + spec_rows_checksum(s.values, s.offset);
  return h;
}

GenerateResult spec_generate(Model& model, const std::vector<int32_t>& prompt, int n, bool inplace, bool spec,
                            const SamplerParams& sp = {}, SequenceCache* cache_in = nullptr) {
  KVCacheParams co;
  co.inplace = inplace;
  SequenceCache local = model.make_cache(co);
  SequenceCache& cache = cache_in ? *cache_in : local;
  GenerateParams gp;
  gp.max_tokens = n;
  gp.sampler = sp;
  gp.spec.ngram = spec;
  return generate(model, cache, prompt, gp);
}

Array spec_host_rows(int64_t n, int64_t heads, int64_t hd, float base) {
  Array a = Array::empty({n, heads, hd}, DType::f32, Device::cpu());
  float* p = a.data<float>();
  for (int64_t i = 0; i < a.numel(); ++i) p[i] = base + 0.001f * float(i % 997);
  return a;
}

}  // namespace

TEST(NgramDraft, ProposesWhatFollowedTheLongestRecentMatch) {
  // ... 7 8 9 | 1 2 3 4 5 | 7 8 9: the 3-gram "7 8 9" occurred before, followed by 1 2 3 4 5.
  const std::vector<int32_t> t = {7, 8, 9, 1, 2, 3, 4, 5, 7, 8, 9};
  EXPECT_EQ(ngram_draft(t, 1, 3, 8), (std::vector<int32_t>{1, 2, 3, 4, 5, 7, 8, 9}));
  EXPECT_EQ(ngram_draft(t, 1, 3, 10), (std::vector<int32_t>{1, 2, 3, 4, 5, 7, 8, 9, 1, 2}));
  EXPECT_EQ(ngram_draft(t, 1, 3, 3), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(ngram_draft(t, 1, 3, 0).empty());
  // The most recent earlier occurrence wins: "4" is followed by 6 later than by 1.
  const std::vector<int32_t> u = {4, 1, 1, 4, 6, 6, 4};
  EXPECT_EQ(ngram_draft(u, 1, 1, 2), (std::vector<int32_t>{6, 6}));
  // Past the sequence's end the draft repeats the period the match found.
  EXPECT_EQ(ngram_draft(u, 1, 1, 5), (std::vector<int32_t>{6, 6, 4, 6, 6}));
  EXPECT_EQ(ngram_draft(std::vector<int32_t>{2, 5, 5, 5}, 1, 3, 4), (std::vector<int32_t>{5, 5, 5, 5}));
  // The longer n-gram is looked for first: "9 4" occurred once, followed by 2.
  const std::vector<int32_t> w = {9, 4, 2, 5, 4, 3, 9, 4};
  EXPECT_EQ(ngram_draft(w, 1, 2, 1), (std::vector<int32_t>{2}));
  EXPECT_EQ(ngram_draft(w, 1, 1, 1), (std::vector<int32_t>{3}));
  // Nothing recurs, or n-grams shorter than the minimum only.
  EXPECT_TRUE(ngram_draft(std::vector<int32_t>{1, 2, 3, 4}, 1, 3, 4).empty());
  EXPECT_TRUE(ngram_draft(std::vector<int32_t>{5, 1, 2, 5}, 2, 3, 4).empty());
  EXPECT_TRUE(ngram_draft(std::vector<int32_t>{5}, 1, 3, 4).empty());
}

TEST(NgramDraft, ParametersAreRangeChecked) {
  SpeculativeParams p;
  p.ngram = true;
  EXPECT_NO_THROW(validate(p));
  p.ngram_min = 4;
  EXPECT_THROW(validate(p), InvalidInput);  // min past max (3)
  p = {};
  p.draft_max = 0;
  EXPECT_THROW(validate(p), InvalidInput);
  p = {};
  p.draft_min = 9;
  EXPECT_THROW(validate(p), InvalidInput);
}

// The guard after a verify: a multi-row write in place at the cache's length, rejected rows given
// back by moving the length, and the next write in place exactly there; a snapshot taken before
// the verify keeps its rows.
TEST(SpeculativeKV, VerifyRowsGoInPlaceAndRejectedRowsAreGivenBackByLength) {
  KVCacheParams p = testing::kv_params(2, 8);
  p.step = 64;
  DenseKVCache c(p);
  c.update_and_fetch(spec_host_rows(5, 2, 8, 0.1f), spec_host_rows(5, 2, 8, 0.2f));  // a prompt: copying
  c.update_and_fetch(spec_host_rows(1, 2, 8, 0.3f), spec_host_rows(1, 2, 8, 0.4f));  // a decode step: in place
  EXPECT_EQ(c.counters().n_copying_writes, 1u);
  EXPECT_EQ(c.counters().n_inplace_writes, 1u);
  const KVState before = c.snapshot();
  const uint64_t sum_before = spec_rows_checksum(before.keys, before.offset) ^ spec_rows_checksum(before.values, before.offset);

  // A prefill chunk of several rows still copies unless the caller asks for a verify write.
  c.set_multirow_inplace(true);
  c.update_and_fetch(spec_host_rows(5, 2, 8, 0.5f), spec_host_rows(5, 2, 8, 0.6f));  // last token + 4 drafts
  c.set_multirow_inplace(false);
  EXPECT_EQ(c.offset(), 11);
  EXPECT_EQ(c.counters().n_copying_writes, 1u) << "the verify rows were copied";
  EXPECT_EQ(c.counters().n_inplace_writes, 2u);
  c.rewind_own_write(3);  // 1 draft accepted: rows 6 and 7 kept, 8..10 given back
  EXPECT_EQ(c.offset(), 8);
  ASSERT_TRUE(c.next_write_in_place(1));
  c.update_and_fetch(spec_host_rows(1, 2, 8, 0.7f), spec_host_rows(1, 2, 8, 0.8f));
  EXPECT_EQ(c.offset(), 9);
  EXPECT_EQ(c.counters().n_copying_writes, 1u);
  EXPECT_EQ(c.counters().n_inplace_writes, 3u);
  // Another verify right after, and a full rejection.
  c.set_multirow_inplace(true);
  c.update_and_fetch(spec_host_rows(3, 2, 8, 0.9f), spec_host_rows(3, 2, 8, 1.0f));
  c.set_multirow_inplace(false);
  c.rewind_own_write(2);
  EXPECT_EQ(c.offset(), 10);
  EXPECT_TRUE(c.next_write_in_place(1));
  EXPECT_EQ(c.counters().n_copying_writes, 1u);
  // The snapshot taken before the verifies reads the same rows.
  EXPECT_EQ(spec_rows_checksum(before.keys, before.offset) ^ spec_rows_checksum(before.values, before.offset), sum_before);

  // A restored state is foreign: a verify write after it copies, as any write does.
  c.restore(before);
  c.set_multirow_inplace(true);
  c.update_and_fetch(spec_host_rows(2, 2, 8, 1.1f), spec_host_rows(2, 2, 8, 1.2f));
  c.set_multirow_inplace(false);
  EXPECT_EQ(c.counters().n_copying_writes, 2u);
  EXPECT_EQ(spec_rows_checksum(before.keys, before.offset) ^ spec_rows_checksum(before.values, before.offset), sum_before);
}

TEST(SpeculativeKV, CopyingArmNeverWritesInPlace) {
  KVCacheParams p = testing::kv_params(1, 8);
  p.inplace = false;
  DenseKVCache c(p);
  c.update_and_fetch(spec_host_rows(4, 1, 8, 0.1f), spec_host_rows(4, 1, 8, 0.2f));
  c.set_multirow_inplace(true);
  c.update_and_fetch(spec_host_rows(3, 1, 8, 0.3f), spec_host_rows(3, 1, 8, 0.4f));
  c.rewind_own_write(2);
  c.update_and_fetch(spec_host_rows(1, 1, 8, 0.3f), spec_host_rows(1, 1, 8, 0.4f));
  EXPECT_EQ(c.counters().n_inplace_writes, 0u);
  EXPECT_EQ(c.counters().n_copying_writes, 3u);
  EXPECT_EQ(c.offset(), 6);
}

// Greedy output with prompt-lookup drafts is byte-identical to plain greedy decoding on every
// family whose caches give rows back, in both KV write arms; the others refuse by name.
class SpeculativeFamilies : public ::testing::TestWithParam<std::string> {};

TEST_P(SpeculativeFamilies, GreedyOutputIsIdenticalToPlainDecodingInBothKVArms) {
  auto model = load_model(spec_fixture(GetParam()));
  const std::vector<int32_t> prompt = spec_quoting_prompt(model->info().vocab_size, 17);
  constexpr int kN = 96;
  SequenceCache probe = model->make_cache({});
  if (!probe.gives_back_rows()) {
    try {
      spec_generate(*model, prompt, kN, true, true);
      ADD_FAILURE() << "a model with sliding-window layers drafted";
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find("sliding-window layers"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("--spec-ngram"), std::string::npos) << e.what();
    }
    return;
  }
  const uint64_t layers = uint64_t(model->info().n_layers);
  int64_t drafted = 0, accepted = 0;
  for (bool inplace : {true, false}) {
    SCOPED_TRACE(inplace ? "in place" : "copying");
    const GenerateResult plain = spec_generate(*model, prompt, kN, inplace, false);
    const GenerateResult spec = spec_generate(*model, prompt, kN, inplace, true);
    ASSERT_EQ(plain.tokens.size(), size_t(kN));
    EXPECT_EQ(spec.tokens, plain.tokens);
    EXPECT_EQ(spec.stats.stop_reason, plain.stats.stop_reason);
    EXPECT_GT(spec.stats.n_verify_steps, 0);
    EXPECT_LE(spec.stats.n_accepted, spec.stats.n_drafted);
    drafted += spec.stats.n_drafted;
    accepted += spec.stats.n_accepted;
    if (inplace) {
      // Every verify and every one-row step wrote in place: the prompt's write alone copied.
      EXPECT_EQ(spec.stats.kv.n_copying_writes, plain.stats.kv.n_copying_writes);
      EXPECT_EQ(spec.stats.kv.n_copying_writes, layers);
      // One forward per emitted token after the first, less one per accepted draft.
      EXPECT_EQ(spec.stats.kv.n_inplace_writes, layers * uint64_t(kN - 1 - spec.stats.n_accepted))
          << "one in-place write per layer for each forward after the prompt";
    } else {
      EXPECT_EQ(spec.stats.kv.n_inplace_writes, 0u);
    }
  }
  // Both accepted and rejected drafts were exercised.
  EXPECT_GT(accepted, 0) << GetParam();
  EXPECT_LT(accepted, drafted) << GetParam();
}

// A cache that already holds rows (a snapshot of them taken first) continues with drafting: the
// snapshot's rows are unchanged by the verifies and their rejected rows, and the cache ends
// holding exactly the prompt and every generated token but the last.
TEST_P(SpeculativeFamilies, SnapshotBeforeVerifiesIsUnchangedAndTheCacheHoldsTheSequence) {
  auto model = load_model(spec_fixture(GetParam()));
  SequenceCache cache = model->make_cache({});
  if (!cache.gives_back_rows()) GTEST_SKIP() << "sliding-window layers: drafting is refused";
  const std::vector<int32_t> prompt = spec_quoting_prompt(model->info().vocab_size, 23);
  const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 30), tail(prompt.begin() + 30, prompt.end());
  spec_generate(*model, head, 1, true, false, {}, &cache);
  const std::vector<KVState> snap = cache.snapshot();
  const uint64_t sum = spec_state_checksum(snap);
  const int64_t at = cache.offset();
  const GenerateResult r = spec_generate(*model, tail, 40, true, true, {}, &cache);
  EXPECT_GT(r.stats.n_verify_steps, 0);
  EXPECT_EQ(spec_state_checksum(snap), sum);
  EXPECT_EQ(cache.offset(), at + int64_t(tail.size()) + int64_t(r.tokens.size()) - 1);
}

// Sampled requests: the tokens a speculating sequence emits are the draws plain decoding makes
// (the same counter-based draw per position), so a seed repeats the reply with or without drafts.
TEST_P(SpeculativeFamilies, SampledOutputIsTheSameDrawsAsPlainDecoding) {
  auto model = load_model(spec_fixture(GetParam()));
  if (!model->make_cache({}).gives_back_rows()) GTEST_SKIP() << "sliding-window layers: drafting is refused";
  const std::vector<int32_t> prompt = spec_quoting_prompt(model->info().vocab_size, 29);
  int64_t accepted = 0;
  for (uint64_t seed : {1ull, 2ull, 3ull}) {
    SamplerParams sp;
    sp.temperature = 0.7f;
    sp.top_k = 40;
    sp.seed = seed;
    const GenerateResult plain = spec_generate(*model, prompt, 48, true, false, sp);
    const GenerateResult spec = spec_generate(*model, prompt, 48, true, true, sp);
    EXPECT_EQ(spec.tokens, plain.tokens) << "seed " << seed;
    accepted += spec.stats.n_accepted;
  }
  (void)accepted;
}

INSTANTIATE_TEST_SUITE_P(Families, SpeculativeFamilies,
                         ::testing::ValuesIn(testing::kDraftFamilies), testing::family_param_name);

// The rule a speculating sequence applies to a sampled row with a drafted token x (a point mass):
// the row's own draw t = sample_at(logits, history, counter) is emitted, and x is accepted when
// t == x. That is rejection sampling for a point-mass draft: x is accepted with probability
// p(x), and a rejected row's token is distributed as p with x removed and renormalised. Checked
// against Sampler::distribution with chi-square tests at alpha = 1e-4 each (three tests: the
// false-alarm rate of the whole test is below 3e-4) over 40000 draws of a 6-token vocabulary.
TEST(SpeculativeSampling, AcceptanceAndResamplingFollowTheTargetDistribution) {
  const std::vector<float> logits = {1.2f, 0.3f, -0.5f, 2.0f, 0.9f, -1.5f};
  SamplerParams sp;
  sp.temperature = 0.9f;
  sp.seed = 77;
  Sampler sampler(sp);
  const std::vector<int32_t> history = {1, 2};
  const auto dist = sampler.distribution(logits, history);
  ASSERT_EQ(dist.size(), logits.size());
  std::vector<double> p(logits.size());
  for (const auto& [id, q] : dist) p[size_t(id)] = q;
  constexpr int32_t kDraft = 4;  // p ~ 0.19
  constexpr int kN = 40000;
  std::vector<double> emitted(p.size(), 0), rejected(p.size(), 0);
  int64_t n_accept = 0, n_reject = 0;
  for (int c = 0; c < kN; ++c) {
    const int32_t t = sampler.sample_at(logits, history, {}, uint64_t(c));
    emitted[size_t(t)] += 1;
    if (t == kDraft) {
      ++n_accept;
    } else {
      ++n_reject;
      rejected[size_t(t)] += 1;
    }
  }
  // chi-square critical values at alpha = 1e-4: 5 degrees of freedom 25.74, 4: 23.51; the
  // acceptance count is binomial(kN, p(x)): |z| < 3.89 at alpha = 1e-4 two-sided.
  double chi_emit = 0, chi_rej = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = kN * p[i];
    chi_emit += (emitted[i] - e) * (emitted[i] - e) / e;
    if (int32_t(i) == kDraft) continue;
    const double er = double(n_reject) * p[i] / (1.0 - p[size_t(kDraft)]);
    chi_rej += (rejected[i] - er) * (rejected[i] - er) / er;
  }
  EXPECT_LT(chi_emit, 25.74);
  EXPECT_LT(chi_rej, 23.51);
  const double px = p[size_t(kDraft)];
  const double z = (double(n_accept) - kN * px) / std::sqrt(kN * px * (1 - px));
  EXPECT_LT(std::fabs(z), 3.89) << "accepted " << n_accept << " of " << kN << ", p(x) = " << px;
}

// The server's engine: several sequences on the dense backend with drafting, each reply the same
// as without, and the prompt cache storing each sequence's rows at its length.
TEST(SpeculativeScheduler, DenseBackendSequencesMatchPlainDecodingAndCountDrafts) {
  auto model = load_model(spec_fixture("llama"));
  std::vector<std::vector<int32_t>> prompts;
  for (uint32_t seed : {41u, 43u, 47u}) prompts.push_back(spec_quoting_prompt(model->info().vocab_size, seed));
  SchedulerOptions ngram;
  ngram.spec.ngram = true;
  // The entries stored at each sequence's end hold its rows unchanged (no verify or rewind of a
  // later sequence wrote into them): run_on_dense_backend checks them.
  const testing::DenseRun plain = testing::run_on_dense_backend(*model, SchedulerOptions{}, prompts, 40);
  const testing::DenseRun spec = testing::run_on_dense_backend(*model, ngram, prompts, 40);
  EXPECT_GT(plain.n_snapshots, 0u);
  EXPECT_GT(spec.n_snapshots, 0u);
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_GT(spec.stats.n_verify_steps, 0u);
  EXPECT_GT(spec.stats.n_drafted_tokens, spec.stats.n_accepted_tokens);
}

// CUDA: the same identity on the device (GTEST_SKIP without one).
TEST(SpeculativeCuda, GreedyOutputIsIdenticalToPlainDecoding) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda_description();
  for (const std::string family : {"llama", "qwen3", "qwen3-moe"}) {
    SCOPED_TRACE(family);
    LoadOptions lo;
    lo.device = Device::cuda(0);
    auto model = load_model(spec_fixture(family), lo);
    const std::vector<int32_t> prompt = spec_quoting_prompt(model->info().vocab_size, 17);
    for (bool inplace : {true, false}) {
      const GenerateResult plain = spec_generate(*model, prompt, 96, inplace, false);
      const GenerateResult spec = spec_generate(*model, prompt, 96, inplace, true);
      EXPECT_EQ(spec.tokens, plain.tokens);
      EXPECT_GT(spec.stats.n_verify_steps, 0);
    }
  }
}

}  // namespace osprey

namespace osprey {

// The flags: generate --json reports the drafts; a sliding-window model refuses --spec-ngram by
// name (serve's paged layout drafts: tests/server/speculative_server_test.cpp).
TEST(SpeculativeCli, GenerateReportsDraftsAndRefusalsNameTheFlag) {
  const std::string llama = (testing::source_dir() / "tests/fixtures/models/llama").string();
  std::string ids;
  for (int32_t t : spec_quoting_prompt(512, 17)) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const auto plain = testing::run_osprey("generate -m " + llama + " --token-ids " + ids + " -n 48 --temp 0 --ignore-eos -q --json");
  const auto spec =
      testing::run_osprey("generate -m " + llama + " --token-ids " + ids + " -n 48 --temp 0 --ignore-eos -q --json --spec-ngram");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(spec.exit_code, 0) << spec.err;
  const auto jp = nlohmann::json::parse(plain.out), js = nlohmann::json::parse(spec.out);
  EXPECT_EQ(js["tokens"], jp["tokens"]);
  EXPECT_GT(js["timings"]["drafted_n"].get<int64_t>(), 0);
  EXPECT_EQ(jp["timings"]["drafted_n"].get<int64_t>(), 0);
  EXPECT_LE(js["timings"]["accepted_n"].get<int64_t>(), js["timings"]["drafted_n"].get<int64_t>());

  const std::string gemma = (testing::source_dir() / "tests/fixtures/models/gemma3").string();
  const auto refused = testing::run_osprey("generate -m " + gemma + " --token-ids 5,6,7 -n 4 -q --spec-ngram");
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("sliding-window layers"), std::string::npos) << refused.err;

  const auto bad = testing::run_osprey("generate -m " + llama + " --token-ids 5 -n 1 --draft-max 0");
  EXPECT_EQ(bad.exit_code, 2);
}

}  // namespace osprey
