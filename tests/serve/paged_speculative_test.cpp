// Speculative decoding over the paged backend (docs/design.md, "Speculative decoding"): a verify
// runs its rows as decode entries over the sequence's own block table and a rewind truncates
// the pools. The reference is plain decoding of the same prompt, alone, in a fresh pool with no
// drafts: greedy output with n-gram drafts and with a draft model is that reference token for
// token on every family (those with sliding-window layers included), in both KV write arms,
// alone, several at once, and from the prefix cache after drafted requests; a seeded sampled
// request repeats its plain reply (n-grams) or itself (a draft model).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "backend/cuda_available.h"
#include "model/model.h"
#include "serve/paged_backend.h"
#include "serve/scheduler.h"
#include "support/families.h"
#include "support/test_util.h"

namespace osprey {
namespace {

std::filesystem::path pspec_fixture(const std::string& family) {
  return testing::source_dir() / "tests/fixtures/models" / family;
}

// A passage, a few other tokens, then its first half again: prompt lookup drafts the second
// half, and the random model's own continuation rejects part of it.
std::vector<int32_t> pspec_quoting_prompt(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(3, 499);
  std::vector<int32_t> passage(40);
  for (int32_t& t : passage) t = id(rng);
  std::vector<int32_t> p = passage;
  for (int i = 0; i < 5; ++i) p.push_back(id(rng));
  p.insert(p.end(), passage.begin(), passage.begin() + 20);
  return p;
}

struct Reply {
  std::vector<int32_t> tokens;
  int64_t n_cached = 0, n_drafted = 0, n_accepted = 0;
};

struct Served {
  std::vector<Reply> replies;
  SchedulerStats stats;
  KVCounters kv;
  PagedPoolStats pool;
};

struct Drafting {
  bool ngram = false;
  Model* draft = nullptr;  // a draft model instead of n-grams
  bool inplace = true;     // OSPREY_KV_INPLACE_WRITE
  bool prefix_cache = true;
  // Sequences at once; the pool has room for this many full contexts, so that with 4 a windowed
  // group's prefix cache keeps a finished request's blocks (one sequence's worth holds only the
  // window, and the blocks behind it are evicted as it moves on).
  int max_sequences = 1;
  int draft_max = 8;
  bool together = false;   // all prompts submitted at once (else each after the one before ended)
  SamplerParams sampler;
};

// Serves `prompts` through a scheduler over a fresh paged backend (blocks of 4 rows; the
// fixtures' windows are 16 rows, shorter than prompt and reply).
Served serve(Model& model, const Drafting& setup, const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
  const bool spec = setup.ngram || setup.draft;
  PagedBackendOptions o;
  o.max_sequences = setup.max_sequences;
  o.context_size = 256;
  o.block_size = 4;
  o.inplace = setup.inplace;
  o.prefix_cache = setup.prefix_cache;
  o.prefill_chunk = 16;
  o.verify_rows = spec ? setup.draft_max + 1 : 0;
  PagedBackend backend(model, o);
  SchedulerOptions so;
  so.engine_thread = false;
  so.prefill_chunk = 16;
  so.spec.ngram = setup.ngram;
  so.spec.draft_max = setup.draft_max;
  // Every step drafts: these tests exercise the verify and its rows, not when a sequence drafts
  // (tests/serve/draft_policy_test.cpp), and a random fixture's low acceptance would stop it.
  so.spec.min_acceptance = 0;
  if (setup.draft) {
    so.spec.model_draft = "draft";
    so.spec.draft_p_min = 0;
    so.draft_model = setup.draft;
    so.draft_cache.inplace = setup.inplace;
  }
  Scheduler engine(backend, so);
  Served out;
  out.replies.resize(prompts.size());
  std::vector<std::shared_ptr<SequenceChannel>> channels(prompts.size());
  auto drain = [&](size_t i) {
    while (auto e = channels[i]->pop(0)) {
      Reply& r = out.replies[i];
      if (e->kind == SequenceEvent::Kind::token) r.tokens.push_back(e->token);
      if (e->kind == SequenceEvent::Kind::failed) ADD_FAILURE() << "request " << i << ": " << e->error;
      if (e->kind != SequenceEvent::Kind::token) {
        r.n_cached = e->n_cached;
        r.n_drafted = e->n_drafted;
        r.n_accepted = e->n_accepted;
      }
    }
  };
  auto submit = [&](size_t i) {
    SequenceRequest r;
    r.id = i;
    r.prompt = prompts[i];
    r.params.max_tokens = max_tokens;
    r.params.sampler = setup.sampler;
    r.channel = channels[i] = std::make_shared<SequenceChannel>();
    EXPECT_EQ(engine.submit(std::move(r)), Scheduler::Submit::accepted);
  };
  for (size_t i = 0; i < prompts.size(); ++i) {
    submit(i);
    if (setup.together && i + 1 < prompts.size()) continue;
    while (engine.run_step()) {
    }
  }
  for (size_t i = 0; i < prompts.size(); ++i) drain(i);
  out.stats = engine.stats();
  out.kv = backend.kv_counters();
  out.pool = backend.pool_stats();
  engine.stop();
  return out;
}

// Each prompt's reply alone in a fresh pool, plain decoding.
std::vector<std::vector<int32_t>> plain_alone(Model& model, const std::vector<std::vector<int32_t>>& prompts, int n,
                                              const SamplerParams& sampler = {}) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : prompts) {
    Drafting s;
    s.prefix_cache = false;
    s.sampler = sampler;
    out.push_back(serve(model, s, {p}, n).replies[0].tokens);
  }
  return out;
}

class PagedSpeculative : public ::testing::TestWithParam<std::string> {};

// n-gram drafts: a first request that drafts (accepting and rejecting drafts), then a second
// whose prompt is the first's prompt and most of its reply, served from the prefix cache: the
// blocks holding the first reply's rows were written by verifies and cut back by rewinds (and,
// in the windowed groups, cached by their chain as the window moved on). A rejected row left in
// a cached block, or a block cached under the wrong tokens, changes the second reply. Windows of
// 16 rows with 9-row verifies: a group that gave back the rows behind the window after a
// verify's write would refuse the rewind (PagedPool::truncate), failing the request.
TEST_P(PagedSpeculative, NgramGreedyOutputIsPlainDecodingInBothKVArmsAndFromThePrefixCache) {
  auto model = load_model(pspec_fixture(GetParam()));
  const std::vector<int32_t> first = pspec_quoting_prompt(9);  // one the gemma3 fixture accepts drafts of
  constexpr int kN = 64;
  const std::vector<int32_t> first_ref = plain_alone(*model, {first}, kN)[0];
  ASSERT_EQ(first_ref.size(), size_t(kN));
  std::vector<int32_t> second = first;
  second.insert(second.end(), first_ref.begin(), first_ref.begin() + 48);
  second.push_back(7);
  const std::vector<int32_t> second_ref = plain_alone(*model, {second}, 24)[0];
  for (bool inplace : {true, false}) {
    SCOPED_TRACE(inplace ? "in place" : "copying");
    Drafting s;
    s.ngram = true;
    s.inplace = inplace;
    s.max_sequences = 4;
    const Served a = serve(*model, s, {first, second}, kN);
    EXPECT_EQ(a.replies[0].tokens, first_ref);
    // The second request's reply is shorter: only its first 24 tokens are compared.
    ASSERT_GE(a.replies[1].tokens.size(), size_t(24));
    EXPECT_EQ(std::vector<int32_t>(a.replies[1].tokens.begin(), a.replies[1].tokens.begin() + 24), second_ref);
    EXPECT_GE(a.replies[1].n_cached, int64_t(first.size()) + 40) << "the first reply's blocks were not reused";
    EXPECT_GT(a.replies[0].n_drafted, 0);
    EXPECT_GT(a.stats.n_accepted_tokens, 0u);
    EXPECT_LT(a.stats.n_accepted_tokens, a.stats.n_drafted_tokens) << "no draft was rejected";
    EXPECT_GT(a.stats.n_verify_steps, 0u);
    if (inplace)
      EXPECT_GT(a.kv.n_inplace_writes, 0u);
    else
      EXPECT_EQ(a.kv.n_inplace_writes, 0u);
    EXPECT_EQ(a.pool.n_in_use, 0) << "a block is still held after every request ended";
  }
}

// Several drafting sequences at once, each verify its own step beside the batch of the others'
// one-row steps: every reply is its plain reply alone.
TEST_P(PagedSpeculative, SequencesDraftingTogetherGiveTheirRepliesAlone) {
  auto model = load_model(pspec_fixture(GetParam()));
  const std::vector<std::vector<int32_t>> prompts = {pspec_quoting_prompt(3), pspec_quoting_prompt(5),
                                                     pspec_quoting_prompt(9)};
  const auto ref = plain_alone(*model, prompts, 40);
  Drafting s;
  s.ngram = true;
  s.max_sequences = 3;
  s.together = true;
  const Served got = serve(*model, s, prompts, 40);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got.replies[i].tokens, ref[i]) << "request " << i;
  EXPECT_GT(got.stats.n_accepted_tokens, 0u);
}

// A seeded sampled request: prompt lookup's verify draws at each position what plain decoding
// draws there, so the reply is the plain one.
TEST_P(PagedSpeculative, NgramSampledOutputIsThePlainDraws) {
  auto model = load_model(pspec_fixture(GetParam()));
  const std::vector<int32_t> prompt = pspec_quoting_prompt(29);
  SamplerParams sp;
  sp.temperature = 0.7f;
  sp.top_k = 40;
  sp.seed = 5;
  const auto ref = plain_alone(*model, {prompt}, 40, sp);
  Drafting s;
  s.ngram = true;
  s.sampler = sp;
  const Served got = serve(*model, s, {prompt}, 40);
  EXPECT_EQ(got.replies[0].tokens, ref[0]);
  EXPECT_GT(got.stats.n_drafted_tokens, 0u);
}

// The verify's rows against one-row steps, bit for bit: a sequence prefilled alike in two
// backends decodes 9 tokens one row a step in one (plain steps, the batch-invariant mode off)
// and verifies the same 9 in one pass in the other; every row's logits are the same bytes. The
// prompt is past the window, so the windowed groups read tables whose first blocks were given
// back.
TEST_P(PagedSpeculative, VerifyRowsAreOneRowStepsBitForBit) {
  auto model = load_model(pspec_fixture(GetParam()));
  const int64_t vocab = model->info().vocab_size;
  const std::vector<int32_t> prompt = pspec_quoting_prompt(13);
  PagedBackendOptions o;
  o.context_size = 128;
  o.block_size = 4;
  o.verify_rows = 9;
  PagedBackend stepped(*model, o), verified(*model, o);
  auto start = [&](PagedBackend& b) {
    auto begun = b.begin(prompt, "");
    EXPECT_TRUE(begun.has_value());
    std::vector<float> logits;
    EXPECT_TRUE(b.reserve(begun->handle, int64_t(prompt.size())));
    b.prefill(begun->handle, prompt, true, logits);
    return std::make_pair(begun->handle, logits);
  };
  auto [hs, first] = start(stepped);
  auto [hv, first_v] = start(verified);
  ASSERT_EQ(first, first_v);
  std::vector<int32_t> feed = {int32_t(std::max_element(first.begin(), first.end()) - first.begin())};
  std::vector<std::vector<float>> steps;
  std::vector<SequenceBackend::DecodeOutput> out;
  for (int i = 0; i < 9; ++i) {
    SequenceBackend::DecodeInput in;
    in.handle = hs;
    in.token = feed.back();
    ASSERT_TRUE(stepped.reserve(hs, 1));
    stepped.decode(std::span<const SequenceBackend::DecodeInput>(&in, 1), out, {});
    steps.push_back(out[0].logits);
    if (i < 8) feed.push_back(int32_t(std::max_element(steps.back().begin(), steps.back().end()) - steps.back().begin()));
  }
  std::vector<float> rows;
  ASSERT_TRUE(verified.reserve(hv, 9));
  verified.verify(hv, feed, rows);
  ASSERT_EQ(rows.size(), size_t(9 * vocab));
  for (size_t i = 0; i < 9; ++i)
    EXPECT_EQ(std::memcmp(rows.data() + i * size_t(vocab), steps[i].data(), size_t(vocab) * 4), 0) << "row " << i;
}

INSTANTIATE_TEST_SUITE_P(Families, PagedSpeculative,
                         ::testing::ValuesIn(testing::kDraftFamilies), testing::family_param_name);

// A draft model (another family, so that some drafts are rejected) for targets with and without
// sliding-window layers: its own dense caches follow the accepted tokens while the target's rows
// are paged. Greedy output is plain decoding in both arms, from the prefix cache too; a seeded
// sampled request (rejection sampling against the draft's own distribution) gives the same reply
// twice.
TEST(PagedSpeculativeDraftModel, GreedyOutputIsPlainDecodingAndASeedRepeats) {
  auto qwen3 = load_model(pspec_fixture("qwen3"));
  for (const std::string family : {"llama", "gemma3", "mistral"}) {
    SCOPED_TRACE(family);
    auto target = load_model(pspec_fixture(family));
    const std::vector<int32_t> first = pspec_quoting_prompt(41);
    const std::vector<int32_t> first_ref = plain_alone(*target, {first}, 40)[0];
    std::vector<int32_t> second = first;
    second.insert(second.end(), first_ref.begin(), first_ref.begin() + 32);
    const std::vector<int32_t> second_ref = plain_alone(*target, {second}, 16)[0];
    for (bool inplace : {true, false}) {
      SCOPED_TRACE(inplace ? "in place" : "copying");
      Drafting s;
      s.draft = qwen3.get();
      s.draft_max = 4;
      s.inplace = inplace;
      s.max_sequences = 4;
      const Served a = serve(*target, s, {first, second}, 40);
      EXPECT_EQ(a.replies[0].tokens, first_ref);
      ASSERT_GE(a.replies[1].tokens.size(), size_t(16));
      EXPECT_EQ(std::vector<int32_t>(a.replies[1].tokens.begin(), a.replies[1].tokens.begin() + 16), second_ref);
      EXPECT_GT(a.replies[1].n_cached, int64_t(first.size()));
      EXPECT_GT(a.stats.n_drafted_tokens, 0u);
      EXPECT_LT(a.stats.n_accepted_tokens, a.stats.n_drafted_tokens);
    }
    SamplerParams sp;
    sp.temperature = 0.8f;
    sp.seed = 11;
    Drafting s;
    s.draft = qwen3.get();
    s.draft_max = 4;
    s.sampler = sp;
    const Served x = serve(*target, s, {first}, 32), y = serve(*target, s, {first}, 32);
    EXPECT_EQ(x.replies[0].tokens, y.replies[0].tokens);
    EXPECT_EQ(x.replies[0].tokens.size(), size_t(32));
    EXPECT_GT(x.stats.n_drafted_tokens, 0u);
  }
}

// The backend's own contract: a rewind gives back at most the last verify's rows, once.
TEST(PagedSpeculativeBackend, RewindGivesBackOnlyTheLastVerifysRows) {
  auto model = load_model(pspec_fixture("mistral"));
  PagedBackendOptions o;
  o.context_size = 128;
  o.block_size = 4;
  o.verify_rows = 9;
  PagedBackend backend(*model, o);
  const std::vector<int32_t> prompt = pspec_quoting_prompt(7);
  auto b = backend.begin(prompt, "");
  ASSERT_TRUE(b.has_value());
  std::vector<float> logits;
  ASSERT_TRUE(backend.reserve(b->handle, int64_t(prompt.size())));
  backend.prefill(b->handle, prompt, true, logits);
  EXPECT_TRUE(backend.can_verify(b->handle));
  EXPECT_THROW(backend.rewind(b->handle, 1), InvalidInput) << "the prefill's rows are not a verify's";
  const std::vector<int32_t> feed = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  backend.verify(b->handle, feed, logits);
  EXPECT_EQ(logits.size(), feed.size() * size_t(model->info().vocab_size));
  EXPECT_THROW(backend.rewind(b->handle, 10), InvalidInput);
  backend.rewind(b->handle, 8);  // into the rows behind the window of the verify's last row
  EXPECT_EQ(backend.pools().length(0), int64_t(prompt.size()) + 1);
  EXPECT_THROW(backend.rewind(b->handle, 1), InvalidInput) << "a second rewind of one verify";
  backend.end(b->handle, {});
  EXPECT_EQ(backend.pool_stats().n_in_use, 0);
}

// CUDA: the same identity through the device's paged decode ops (GTEST_SKIP without one).
TEST(PagedSpeculativeCuda, GreedyOutputIsPlainDecoding) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda_description();
  for (const std::string family : {"llama", "mistral", "qwen3-moe"}) {
    SCOPED_TRACE(family);
    LoadOptions lo;
    lo.device = Device::cuda(0);
    auto model = load_model(pspec_fixture(family), lo);
    const std::vector<std::vector<int32_t>> prompts = {pspec_quoting_prompt(9), pspec_quoting_prompt(3)};
    const auto ref = plain_alone(*model, prompts, 48);
    for (bool inplace : {true, false}) {
      Drafting s;
      s.ngram = true;
      s.inplace = inplace;
      s.max_sequences = 2;
      s.together = true;
      const Served got = serve(*model, s, prompts, 48);
      for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got.replies[i].tokens, ref[i]) << "request " << i;
      EXPECT_GT(got.stats.n_verify_steps, 0u);
    }
  }
}

}  // namespace
}  // namespace osprey
