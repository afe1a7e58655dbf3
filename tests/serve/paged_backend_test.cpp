// The paged backend (serve/paged_backend.h) against the dense single-sequence path: a batch
// decoded over the pool computes what each sequence computes alone in its own dense cache;
// with batch invariance on, a greedy sequence's tokens and logits are the same bit for bit
// alone, in any batch and after a prefix-cache hit; preemption loses no request; and the pool
// is empty again when every sequence has ended.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "backend/ops.h"
#include "core/error.h"
#include "serve/paged_backend.h"
#include "sample/sampler.h"
#include "serve/scheduler.h"
#include "model/model.h"
#include "support/device_test.h"
#include "support/families.h"
#include "support/test_util.h"

namespace osprey {
namespace {

std::filesystem::path fixture(const std::string& family) { return testing::source_dir() / "tests/fixtures/models" / family; }

class InvariantScope {
 public:
  explicit InvariantScope(bool on) : before_(ops::batch_invariant()) { ops::set_batch_invariant(on); }
  ~InvariantScope() { ops::set_batch_invariant(before_); }

 private:
  bool before_;
};

std::vector<int32_t> random_prompt(std::mt19937& rng, int64_t n, int64_t vocab) {
  std::uniform_int_distribution<int32_t> d(0, int32_t(vocab - 1));
  std::vector<int32_t> p(static_cast<size_t>(n), 0);
  for (auto& t : p) t = d(rng);
  return p;
}

class PagedBackendTest : public testing::DeviceTestOf<testing::ModelCase> {
 protected:
  void SetUp() override {
    DeviceTestOf::SetUp();
    if (IsSkipped()) return;
    LoadOptions lo;
    lo.device = device();
    model_ = load_model(fixture(GetParam().model), lo);
    vocab_ = model_->info().vocab_size;
  }

  PagedBackendOptions options(int max_sequences, int64_t block_size = 4) const {
    PagedBackendOptions o;
    o.max_sequences = max_sequences;
    o.context_size = 256;
    o.block_size = block_size;
    return o;
  }

  // The last-position logits of `tokens` computed alone in a dense cache, one token at a time
  // after the prompt: reference[i] are the logits after tokens[0 .. n_prompt + i].
  std::vector<std::vector<float>> dense_reference(const std::vector<int32_t>& tokens, size_t n_prompt) {
    SequenceCache cache = model_->make_cache({});
    std::vector<std::vector<float>> out;
    auto last_row = [&](const Array& logits) {
      Array h = ops::to_device(logits, Device::cpu());
      const float* row = h.data<float>() + (h.numel() - vocab_);
      out.emplace_back(row, row + vocab_);
    };
    last_row(model_->forward(testing::tokens_of({tokens.begin(), tokens.begin() + long(n_prompt)}), cache, false));
    for (size_t i = n_prompt; i + 1 < tokens.size(); ++i) last_row(model_->forward(testing::tokens_of({tokens[i]}), cache, false));
    return out;
  }

  std::unique_ptr<Model> model_;
  int64_t vocab_ = 0;
};

// Runs `prompts` through `backend`: each is admitted and prefilled (one chunk each, in order),
// then all decode together, greedily, for n_steps. Returns each sequence's logits after its
// prompt and after every step, and its tokens (prompt then output).
struct BatchRun {
  std::vector<std::vector<std::vector<float>>> logits;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int64_t> n_cached;
};

BatchRun run_batch(PagedBackend& backend, const std::vector<std::vector<int32_t>>& prompts, int n_steps,
                   bool end_all = true) {
  BatchRun r;
  std::vector<SequenceBackend::DecodeInput> in;
  for (const auto& p : prompts) {
    auto b = backend.begin(p, "");
    EXPECT_TRUE(b.has_value());
    if (!b) return r;
    r.n_cached.push_back(b->n_cached);
    std::vector<float> logits;
    std::span<const int32_t> rest = std::span<const int32_t>(p).subspan(size_t(b->n_cached));
    EXPECT_TRUE(backend.reserve(b->handle, int64_t(rest.size())));
    backend.prefill(b->handle, rest, true, logits);
    r.logits.push_back({logits});
    r.tokens.push_back(p);
    const int32_t t = argmax(logits);
    r.tokens.back().push_back(t);
    in.push_back({b->handle, t, false});
  }
  std::vector<SequenceBackend::DecodeOutput> out;
  for (int s = 0; s < n_steps; ++s) {
    for (const auto& i : in) EXPECT_TRUE(backend.reserve(i.handle, 1));
    backend.decode(in, out, {});
    for (size_t i = 0; i < in.size(); ++i) {
      EXPECT_TRUE(out[i].error.empty()) << out[i].error;
      r.logits[i].push_back(out[i].logits);
      const int32_t t = argmax(out[i].logits);
      r.tokens[i].push_back(t);
      in[i].token = t;
    }
  }
  if (end_all)
    for (size_t i = 0; i < in.size(); ++i)
      backend.end(in[i].handle, std::span<const int32_t>(r.tokens[i]).first(r.tokens[i].size() - 1));
  return r;
}

}  // namespace

TEST_P(PagedBackendTest, ABatchComputesWhatEachSequenceComputesAlone) {
  // Five sequences whose prompts end inside and on block edges (block size 4), some longer than
  // the fixtures' sliding window of 16, decoded together for 24 steps (past the window again).
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t n : {5, 8, 23, 1, 40}) prompts.push_back(random_prompt(rng, n, vocab_));
  PagedBackend backend(*model_, options(8));
  const BatchRun run = run_batch(backend, prompts, 24);
  ASSERT_EQ(run.logits.size(), prompts.size());
  // f32 activations and f16/bf16 rows in both paths; the CUDA kernels differ (paged split-K
  // against the dense decode kernel, GEMMs over 8 rows against GEMVs).
  const double tol = on_cuda() ? 2e-2 : 1e-3;
  for (size_t s = 0; s < prompts.size(); ++s) {
    const auto ref = dense_reference(run.tokens[s], prompts[s].size());
    ASSERT_EQ(ref.size(), run.logits[s].size());
    for (size_t i = 0; i < ref.size(); ++i)
      ASSERT_LT(testing::relative_row_error(run.logits[s][i].data(), ref[i].data(), vocab_), tol)
          << "sequence " << s << " (prompt " << prompts[s].size() << "), step " << i;
  }
  const PagedPoolStats st = backend.pool_stats();
  EXPECT_EQ(st.n_in_use, 0) << "every sequence ended";
  EXPECT_EQ(st.n_free + st.n_cached, st.n_blocks);
  // Every row of every layer is written once, in place: no block was shared.
  uint64_t rows = 0;
  for (const auto& t : run.tokens) rows += t.size() - 1;
  EXPECT_EQ(backend.kv_counters().n_inplace_writes, rows * uint64_t(model_->info().n_layers));
  EXPECT_EQ(backend.kv_counters().n_copying_writes, 0u);
}

TEST_P(PagedBackendTest, SlidingWindowLayersHoldOnlyTheirWindow) {
  // Sequences past the fixtures' window of 16 rows, in blocks of 4, still running: a windowed
  // group holds, per sequence of length L, the blocks of rows [first seen row, L) where a query
  // at L sees (L - 16, L] (its first row rounded down to a block); a full-attention group holds
  // every row. The expected counts are the window's definition, written out here.
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t n : {40, 3, 29}) prompts.push_back(random_prompt(rng, n, vocab_));
  PagedBackend backend(*model_, options(4));
  const PagedPools& pools = backend.pools();
  const BatchRun run = run_batch(backend, prompts, 21, false);
  bool windowed = false;
  for (size_t g = 0; g < pools.n_groups(); ++g) {
    const int64_t w = pools.window(g), bs = backend.block_size();
    windowed = windowed || w > 0;
    int64_t want = 0;
    for (const auto& t : run.tokens) {
      const int64_t len = int64_t(t.size()) - 1;  // the last token's row is not written yet
      const int64_t first = w > 0 ? std::max<int64_t>(0, len - w + 1) / bs : 0;
      want += (len + bs - 1) / bs - first;
    }
    EXPECT_EQ(pools.stats(g).n_in_use, want) << "group of window " << w;
  }
  bool model_windowed = false;
  for (int64_t l = 0; l < model_->info().n_layers; ++l) model_windowed = model_windowed || model_->kv_params(l).window > 0;
  EXPECT_EQ(windowed, model_windowed);
}

TEST_P(PagedBackendTest, GreedyOutputIsTheSameAloneInABatchAndFromThePrefixCache) {
  InvariantScope invariant(true);
  std::mt19937 rng(11);
  const std::vector<int32_t> shared = random_prompt(rng, 21, vocab_);
  std::vector<int32_t> target = shared;
  for (int32_t t : random_prompt(rng, 6, vocab_)) target.push_back(t);
  constexpr int kSteps = 20;

  // Alone, in a fresh pool.
  PagedBackend alone_backend(*model_, options(1));
  const BatchRun alone = run_batch(alone_backend, {target}, kSteps);

  // In a batch of 7 whose others have other lengths and whose prompts share its prefix or
  // not, in a pool whose prefix cache is empty.
  std::vector<std::vector<int32_t>> batch;
  for (int64_t n : {3, 30, 17}) batch.push_back(random_prompt(rng, n, vocab_));
  batch.push_back(target);
  for (int64_t n : {9, 2, 44}) batch.push_back(random_prompt(rng, n, vocab_));
  PagedBackend batched_backend(*model_, options(8));
  const BatchRun batched = run_batch(batched_backend, batch, kSteps);
  ASSERT_EQ(batched.n_cached[3], 0);

  // From the prefix cache: the shared prefix's full blocks are cached by a first sequence; the
  // target then restores them and prefills the rest.
  PagedBackend cached_backend(*model_, options(4));
  std::vector<int32_t> other = shared;
  other.push_back(3);
  run_batch(cached_backend, {other}, 3);
  const BatchRun restored = run_batch(cached_backend, {random_prompt(rng, 13, vocab_), target}, kSteps);
  ASSERT_EQ(restored.n_cached[1], 20) << "five blocks of 4 of the 21 shared tokens";

  // The same from the prefix cache with copying writes only (OSPREY_KV_INPLACE_WRITE=0).
  PagedBackendOptions copying = options(4);
  copying.inplace = false;
  PagedBackend copying_backend(*model_, copying);
  run_batch(copying_backend, {other}, 3);
  const BatchRun restored_copying = run_batch(copying_backend, {random_prompt(rng, 13, vocab_), target}, kSteps);
  ASSERT_EQ(restored_copying.n_cached[1], 20);
  EXPECT_EQ(copying_backend.kv_counters().n_inplace_writes, 0u);

  EXPECT_EQ(batched.tokens[3], alone.tokens[0]);
  EXPECT_EQ(restored.tokens[1], alone.tokens[0]);
  EXPECT_EQ(restored_copying.tokens[1], alone.tokens[0]);
  for (size_t i = 0; i < alone.logits[0].size(); ++i) {
    ASSERT_EQ(std::memcmp(batched.logits[3][i].data(), alone.logits[0][i].data(), size_t(vocab_) * 4), 0)
        << "batched logits differ at step " << i;
    ASSERT_EQ(std::memcmp(restored.logits[1][i].data(), alone.logits[0][i].data(), size_t(vocab_) * 4), 0)
        << "restored logits differ at step " << i;
    ASSERT_EQ(std::memcmp(restored_copying.logits[1][i].data(), alone.logits[0][i].data(), size_t(vocab_) * 4), 0)
        << "restored logits with copying writes differ at step " << i;
  }
}

TEST_P(PagedBackendTest, CachedBlocksKeepTheirRowsWhileOthersWriteAfterThem) {
  // Three sequences with the same 10-token prompt, one after another: the first's full blocks
  // go to the prefix cache; the second restores two of them and writes its own rows after them
  // (the cache holds the first's third block, which it must not write into); the third
  // restores the same two. With batch invariance on, the second and third compute the first's
  // logits bit for bit, which a changed row of a cached block would break. (Without it, the
  // restored runs prefill 2 rows where the first prefilled 10, through other GEMM kernels on
  // CUDA; the Gemma 3 fixture, whose activations pass 1e5, turns that rounding into large
  // logit differences.)
  InvariantScope invariant(true);
  std::mt19937 rng(5);
  const std::vector<int32_t> p = random_prompt(rng, 10, vocab_);
  PagedBackend backend(*model_, options(4));
  const BatchRun first = run_batch(backend, {p}, 6);
  const BatchRun second = run_batch(backend, {p}, 6);
  EXPECT_EQ(second.n_cached[0], 8);
  const BatchRun third = run_batch(backend, {p}, 6);
  EXPECT_EQ(third.n_cached[0], 8);
  EXPECT_EQ(second.tokens[0], first.tokens[0]);
  EXPECT_EQ(third.tokens[0], first.tokens[0]);
  for (size_t i = 0; i < first.logits[0].size(); ++i) {
    EXPECT_EQ(std::memcmp(second.logits[0][i].data(), first.logits[0][i].data(), size_t(vocab_) * 4), 0) << "second, step " << i;
    EXPECT_EQ(std::memcmp(third.logits[0][i].data(), first.logits[0][i].data(), size_t(vocab_) * 4), 0) << "third, step " << i;
  }
  EXPECT_EQ(backend.pool_stats().n_in_use, 0);
}

// Greedy inputs with token masks (constrained decoding): a backend that chooses the tokens asks
// for the masks and takes each row's allowed maximum (checked against the dense path's logits);
// a row whose mask allows nothing fails alone. One that returns logits (the CPU) need not ask.
TEST_P(PagedBackendTest, MaskedGreedyInputsTakeTheAllowedMaximum) {
  std::mt19937 rng(31);
  PagedBackend backend(*model_, options(8));
  const int n = 4;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SequenceBackend::DecodeInput> in;
  for (int i = 0; i < n; ++i) {
    prompts.push_back(random_prompt(rng, 6 + i, vocab_));
    auto b = backend.begin(prompts.back(), "");
    ASSERT_TRUE(b.has_value());
    std::vector<float> logits;
    ASSERT_TRUE(backend.reserve(b->handle, int64_t(prompts.back().size())));
    backend.prefill(b->handle, prompts.back(), true, logits);
    const int32_t t = argmax(logits);
    prompts.back().push_back(t);
    in.push_back({b->handle, t, true, i != 2});  // row 2: greedy, unmasked
    ASSERT_TRUE(backend.reserve(b->handle, 1));
  }
  // About one id in eight allowed, over a mask one word short of the vocabulary (its tail
  // banned); row 3 allows nothing.
  const size_t words = size_t((vocab_ + 63) / 64) - (vocab_ > 64 ? 1 : 0);
  std::vector<std::vector<uint64_t>> masks(n, std::vector<uint64_t>(words, 0));
  for (int i = 0; i < 3; ++i)
    for (auto& w : masks[size_t(i)]) w = uint64_t(rng()) << 32 | rng(), w &= uint64_t(rng()) << 32 | rng(), w &= uint64_t(rng()) << 32 | rng();
  int asked = 0;
  std::vector<SequenceBackend::DecodeOutput> out;
  backend.decode(in, out, [&](std::vector<std::span<const uint64_t>>& spans) {
    ++asked;
    ASSERT_EQ(spans.size(), size_t(n));
    for (int i = 0; i < n; ++i)
      if (in[size_t(i)].masked) spans[size_t(i)] = masks[size_t(i)];
  });
  EXPECT_EQ(asked, device().is_cpu() ? 0 : 1);
  auto allowed = [&](int i, int64_t id) {
    return size_t(id / 64) < words && ((masks[size_t(i)][size_t(id / 64)] >> (id % 64)) & 1);
  };
  for (int i = 0; i < n; ++i) {
    const std::vector<float> ref = dense_reference(prompts[size_t(i)], prompts[size_t(i)].size()).back();
    int32_t best = -1;
    for (int64_t id = 0; id < vocab_; ++id)
      if ((!in[size_t(i)].masked || allowed(i, id)) && (best < 0 || ref[size_t(id)] > ref[size_t(best)])) best = int32_t(id);
    if (i == 3 && !device().is_cpu()) {
      EXPECT_NE(out[3].error.find("allows no token"), std::string::npos) << out[3].error;
      continue;
    }
    ASSERT_TRUE(out[size_t(i)].error.empty()) << out[size_t(i)].error;
    if (out[size_t(i)].token < 0) {  // logits returned: the caller chooses
      EXPECT_EQ(int64_t(out[size_t(i)].logits.size()), vocab_);
      continue;
    }
    const int32_t t = out[size_t(i)].token;
    ASSERT_GE(t, 0);
    ASSERT_LT(t, vocab_);
    if (in[size_t(i)].masked) EXPECT_TRUE(allowed(i, t)) << "row " << i << ": token " << t << " is not allowed";
    // The paged step's logits equal the dense path's up to rounding: the choice is the
    // allowed maximum unless two allowed ids are that close.
    EXPECT_GE(ref[size_t(t)], ref[size_t(best)] - 1e-3f * std::max(1.0f, std::fabs(ref[size_t(best)])))
        << "row " << i << ": token " << t << " against the allowed maximum " << best;
  }
}

// Sampled inputs (DecodeInput::sampling): a backend that draws on the device (CUDA) returns,
// for each row, the token the host sampler draws from the same logits at the same counter
// (one chain definition, one noise), penalties over the row's history and a logit bias
// included; the CPU backend returns the logits. Two pools, batch invariance on: one draws, the
// other returns the logits of the same steps (both fed the drawn tokens).
TEST_P(PagedBackendTest, SampledInputsDrawWhatTheHostSamplerDraws) {
  InvariantScope invariant(true);
  std::mt19937 rng(17);
  std::vector<SamplerParams> params(6);
  params[0].temperature = 1.0f;
  params[1].temperature = 0.8f, params[1].top_k = 20;
  params[2].temperature = 0.7f, params[2].repetition_penalty = 1.3f, params[2].presence_penalty = 0.4f,
  params[2].frequency_penalty = 0.2f;
  params[3].temperature = 1.2f, params[3].logit_bias = {{1, 4.0f}, {2, -100.0f}, {5, -2.5f}};
  params[4].temperature = 0.0f, params[4].repetition_penalty = 1.5f;  // greedy with a penalty
  params[5].temperature = 0.9f, params[5].top_k = 50, params[5].min_p = 0.02f;
  for (size_t i = 0; i < params.size(); ++i) params[i].seed = 1000 + i;

  PagedBackend drawing(*model_, options(8)), plain(*model_, options(8));
  std::vector<std::vector<int32_t>> history;
  std::vector<SequenceBackend::DecodeInput> in_draw, in_plain;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::vector<int32_t> prompt = random_prompt(rng, 5 + int64_t(i) * 3, vocab_);
    std::vector<float> logits;
    for (PagedBackend* b : {&drawing, &plain}) {
      auto begun = b->begin(prompt, "");
      ASSERT_TRUE(begun.has_value());
      ASSERT_TRUE(b->reserve(begun->handle, int64_t(prompt.size())));
      b->prefill(begun->handle, prompt, true, logits);
      (b == &drawing ? in_draw : in_plain).push_back({begun->handle, 0});
    }
    history.push_back(prompt);
    const int32_t first = Sampler(params[i]).sample_at(logits, prompt, {}, 0);
    history.back().push_back(first);
    in_draw.back().token = in_plain.back().token = first;
  }
  std::vector<SequenceBackend::DecodeOutput> out_draw, out_plain;
  for (uint64_t step = 1; step <= 12; ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      in_draw[i].sampling = &params[i];
      in_draw[i].counter = step;
      in_draw[i].history = history[i];
      ASSERT_TRUE(drawing.reserve(in_draw[i].handle, 1));
      ASSERT_TRUE(plain.reserve(in_plain[i].handle, 1));
    }
    drawing.decode(in_draw, out_draw, {});
    plain.decode(in_plain, out_plain, {});
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_TRUE(out_draw[i].error.empty()) << out_draw[i].error;
      ASSERT_EQ(out_plain[i].logits.size(), size_t(vocab_));
      const int32_t want = Sampler(params[i]).sample_at(out_plain[i].logits, history[i], {}, step);
      int32_t got = out_draw[i].token;
      if (on_cuda()) {
        EXPECT_TRUE(out_draw[i].logits.empty()) << "row " << i << ": the device drew it, no logits cross";
        EXPECT_EQ(got, want) << "row " << i << ", step " << step;
      } else {
        EXPECT_EQ(got, -1) << "the CPU backend returns logits";
        ASSERT_EQ(std::memcmp(out_draw[i].logits.data(), out_plain[i].logits.data(), size_t(vocab_) * 4), 0);
      }
      history[i].push_back(want);
      in_draw[i].token = in_plain[i].token = want;
    }
  }
}

// A seeded sampled request through the scheduler draws the same tokens alone, inside a batch of
// 64 (greedy and sampled neighbours of other lengths, some constrained by penalties or a
// logit bias) with batch invariance on, and on a second run; on CUDA every sampled row of
// every step is drawn on the device.
TEST_P(PagedBackendTest, ASeededSampledRequestIsTheSameAloneInABatchOf64AndAgain) {
  InvariantScope invariant(true);
  std::mt19937 rng(23);
  constexpr int kMax = 16;
  auto params_of = [](int i) {
    SequenceParams p;
    p.max_tokens = kMax;
    p.sampler.seed = 500 + uint64_t(i);
    p.sampler.temperature = i % 4 == 0 ? 0.0f : 0.7f + 0.1f * float(i % 5);
    p.sampler.top_p = i % 3 == 0 ? 0.9f : 1.0f;
    p.sampler.top_k = i % 5 == 1 ? 30 : 0;
    if (i % 7 == 2) p.sampler.frequency_penalty = 0.5f, p.sampler.presence_penalty = 0.3f;
    if (i % 11 == 3) p.sampler.logit_bias = {{3, 2.0f}, {4, -100.0f}};
    return p;
  };
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 64; ++i) prompts.push_back(random_prompt(rng, 3 + (i * 5) % 23, vocab_));
  auto run = [&](const std::vector<int>& which, int max_sequences) {
    PagedBackend backend(*model_, options(max_sequences));
    SchedulerOptions so;
    so.prefill_chunk = 64;
    Scheduler sched(backend, so);
    std::vector<std::shared_ptr<SequenceChannel>> chans;
    for (int i : which) {
      SequenceRequest r;
      r.id = uint64_t(i);
      r.prompt = prompts[size_t(i)];
      r.params = params_of(i);
      r.channel = std::make_shared<SequenceChannel>();
      chans.push_back(r.channel);
      EXPECT_EQ(sched.submit(std::move(r)), Scheduler::Submit::accepted);
    }
    std::vector<std::vector<int32_t>> out;
    for (auto& ch : chans) {
      std::vector<int32_t> toks;
      for (;;) {
        auto e = ch->pop(60000);
        if (!e) {
          ADD_FAILURE() << "timeout";
          break;
        }
        if (e->kind != SequenceEvent::Kind::token) {
          EXPECT_EQ(e->error, "");
          break;
        }
        toks.push_back(e->token);
      }
      out.push_back(toks);
    }
    return out;
  };
  std::vector<int> all(64);
  for (int i = 0; i < 64; ++i) all[size_t(i)] = i;
  const auto batch = run(all, 64);
  const auto again = run(all, 64);
  EXPECT_EQ(batch, again);
  for (int i : {1, 2, 3, 9, 40}) {
    const auto alone = run({i}, 1);
    ASSERT_EQ(alone[0].size(), size_t(kMax)) << "request " << i;
    EXPECT_EQ(alone[0], batch[size_t(i)]) << "request " << i << " (temperature " << params_of(i).sampler.temperature << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Families, PagedBackendTest, OSPREY_MODELS_ON_DEVICES(testing::kFamilies));

// ---- The scheduler over the paged backend ----

namespace {

struct Collected {
  std::vector<int32_t> tokens;
  std::string finish_reason, error;
};

Collected collect(SequenceChannel& ch) {
  Collected c;
  for (;;) {
    auto e = ch.pop(60000);
    if (!e) {
      c.error = "timeout";
      return c;
    }
    if (e->kind == SequenceEvent::Kind::token) {
      c.tokens.push_back(e->token);
      continue;
    }
    c.finish_reason = e->finish_reason;
    c.error = e->error;
    return c;
  }
}

std::vector<Collected> serve_all(Model& model, const PagedBackendOptions& o, const std::vector<std::vector<int32_t>>& prompts,
                                 int max_tokens, SchedulerStats* stats_out = nullptr, PagedPoolStats* pool_out = nullptr) {
  PagedBackend backend(model, o);
  std::vector<Collected> out(prompts.size());
  {
    SchedulerOptions so;
    so.prefill_chunk = 16;
    Scheduler sched(backend, so);
    std::vector<std::shared_ptr<SequenceChannel>> chans;
    for (size_t i = 0; i < prompts.size(); ++i) {
      SequenceRequest r;
      r.id = i;
      r.prompt = prompts[i];
      r.params.max_tokens = max_tokens;
      r.channel = std::make_shared<SequenceChannel>();
      chans.push_back(r.channel);
      EXPECT_EQ(sched.submit(std::move(r)), Scheduler::Submit::accepted);
    }
    for (size_t i = 0; i < prompts.size(); ++i) out[i] = collect(*chans[i]);
    // A task on the engine thread runs after the step that ended the last sequence has
    // published its statistics.
    sched.run_on_engine([&] {
      if (pool_out) *pool_out = backend.pool_stats();
    });
    if (stats_out) *stats_out = sched.stats();
  }
  return out;
}

// Options of the scheduler tests: `max_sequences` at once, a context of 256 rows, blocks of 4.
PagedBackendOptions small_blocks(int64_t max_sequences) {
  PagedBackendOptions o;
  o.max_sequences = max_sequences;
  o.context_size = 256;
  o.block_size = 4;
  return o;
}

// The bytes of a pool of n_blocks blocks of 4 rows of `model`'s layers.
int64_t pool_bytes(const Model& model, int64_t n_blocks) {
  PagedPoolParams probe;
  for (int64_t l = 0; l < model.info().n_layers; ++l) probe.layers.push_back(model.kv_params(l));
  probe.block_size = 4;
  return n_blocks * paged_block_bytes(probe);
}

}  // namespace

TEST(PagedScheduler, PreemptionLosesNoRequestAndChangesNoToken) {
  InvariantScope invariant(true);
  std::unique_ptr<Model> model = load_model(fixture("llama"));
  std::mt19937 rng(3);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(random_prompt(rng, 10 + 7 * i, model->info().vocab_size));
  constexpr int kMax = 40;

  // Alone: one sequence at a time in a pool that holds it.
  const PagedBackendOptions alone = small_blocks(1);
  const std::vector<Collected> ref = serve_all(*model, alone, prompts, kMax);

  // Eight at once in a pool of 40 blocks of 4 rows: 160 rows against the 8 * 40 + 276 the
  // sequences reach, so running sequences are preempted and computed again.
  PagedBackendOptions tight = alone;
  tight.max_sequences = 8;
  tight.kv_cache_bytes = pool_bytes(*model, 40);
  SchedulerStats stats;
  PagedPoolStats pool;
  const std::vector<Collected> got = serve_all(*model, tight, prompts, kMax, &stats, &pool);
  EXPECT_GT(stats.n_preempted, 0u) << "the pool was meant to run out";
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i].error, "") << "request " << i;
    EXPECT_EQ(got[i].finish_reason, "length") << "request " << i;
    EXPECT_EQ(got[i].tokens, ref[i].tokens) << "request " << i;
  }
  EXPECT_EQ(pool.n_in_use, 0);
  EXPECT_EQ(stats.n_running, 0);
}

TEST(PagedScheduler, ASequenceLargerThanThePoolFailsWithAnError) {
  std::unique_ptr<Model> model = load_model(fixture("llama"));
  PagedBackendOptions o = small_blocks(2);
  o.kv_cache_bytes = pool_bytes(*model, 4);  // 16 rows
  std::mt19937 rng(9);
  const std::vector<Collected> got =
      serve_all(*model, o, {random_prompt(rng, 30, 512), random_prompt(rng, 6, 512)}, 30);
  EXPECT_NE(got[0].error.find("more KV blocks than the pool has"), std::string::npos) << got[0].error;
  EXPECT_NE(got[1].error.find("the KV pool cannot hold this sequence"), std::string::npos) << got[1].error;
}

// n choices of one prompt (SequenceRequest::forks): the prompt is prefilled once, the choices
// share its blocks, the first write into the shared partial block copies it (copy-on-write),
// and each choice's tokens are those of its seed run alone in a pool of its own.
TEST(PagedScheduler, ForkedChoicesShareThePromptAndEqualTheirRunsAlone) {
  InvariantScope invariant(true);
  std::unique_ptr<Model> model = load_model(fixture("llama"));
  std::mt19937 rng(5);
  const std::vector<int32_t> prompt = random_prompt(rng, 10, model->info().vocab_size);  // 2.5 blocks of 4
  const uint64_t seeds[] = {101, 202, 303};
  constexpr int kMax = 24;
  auto params = [&](uint64_t seed) {
    SequenceParams p;
    p.max_tokens = kMax;
    p.sampler.temperature = 1.0f;
    p.sampler.seed = seed;
    return p;
  };
  PagedBackendOptions o;
  o.context_size = 256;
  o.block_size = 4;
  o.prefix_cache = false;

  std::vector<Collected> alone;
  for (uint64_t seed : seeds) {
    o.max_sequences = 1;
    PagedBackend backend(*model, o);
    SchedulerOptions so;
    Scheduler sched(backend, so);
    SequenceRequest r;
    r.prompt = prompt;
    r.params = params(seed);
    r.channel = std::make_shared<SequenceChannel>();
    auto ch = r.channel;
    ASSERT_EQ(sched.submit(std::move(r)), Scheduler::Submit::accepted);
    alone.push_back(collect(*ch));
  }

  o.max_sequences = 3;
  PagedBackend backend(*model, o);
  SchedulerStats stats;
  PagedPoolStats pool;
  KVCounters counters;
  std::vector<Collected> got;
  {
    SchedulerOptions so;
    Scheduler sched(backend, so);
    SequenceRequest r;
    r.prompt = prompt;
    r.params = params(seeds[0]);
    r.channel = std::make_shared<SequenceChannel>();
    std::vector<std::shared_ptr<SequenceChannel>> chans = {r.channel};
    for (int k = 1; k < 3; ++k) {
      r.forks.push_back({params(seeds[k]), std::make_shared<SequenceChannel>()});
      chans.push_back(r.forks.back().channel);
    }
    ASSERT_EQ(sched.submit(std::move(r)), Scheduler::Submit::accepted);
    for (auto& ch : chans) got.push_back(collect(*ch));
    sched.run_on_engine([&] {
      pool = backend.pool_stats();
      counters = backend.kv_counters();
    });
    stats = sched.stats();
  }
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(got[k].error, "") << "choice " << k;
    EXPECT_EQ(got[k].finish_reason, "length") << "choice " << k;
    EXPECT_EQ(got[k].tokens, alone[k].tokens) << "choice " << k;
  }
  EXPECT_NE(got[0].tokens, got[1].tokens);
  EXPECT_NE(got[1].tokens, got[2].tokens);
  EXPECT_EQ(stats.n_prompt_tokens, prompt.size()) << "the prompt is prefilled once";
  EXPECT_EQ(stats.n_generated_tokens, uint64_t(3 * kMax));
  // The shared partial block is copied by the two choices that write into it second and third
  // (one copying write per layer each); the first finds it held by nobody else by then.
  EXPECT_GE(counters.n_copying_writes, uint64_t(2 * model->info().n_layers));
  EXPECT_EQ(pool.n_in_use, 0);
}

// A request of n choices that is cancelled while it waits ends every choice; one of more
// choices than the backend runs at once is refused.
TEST(PagedScheduler, ACancelledRequestEndsAllItsChoices) {
  std::unique_ptr<Model> model = load_model(fixture("llama"));
  PagedBackend backend(*model, small_blocks(2));
  SchedulerOptions so;
  Scheduler sched(backend, so);
  std::mt19937 rng(7);
  auto request = [&](int n_forks) {
    SequenceRequest r;
    r.prompt = random_prompt(rng, 12, model->info().vocab_size);
    r.params.max_tokens = 200;
    r.channel = std::make_shared<SequenceChannel>();
    for (int k = 0; k < n_forks; ++k) r.forks.push_back({r.params, std::make_shared<SequenceChannel>()});
    return r;
  };
  EXPECT_THROW(sched.submit(request(2)), InvalidInput);
  // Running: cancelling every channel (as the server does when its client leaves) ends both.
  SequenceRequest running = request(1);
  std::vector<std::shared_ptr<SequenceChannel>> chans = {running.channel, running.forks[0].channel};
  ASSERT_EQ(sched.submit(std::move(running)), Scheduler::Submit::accepted);
  // Waiting behind it (both sequences are taken): cancelling its prompt's channel ends the fork too.
  SequenceRequest waiting = request(1);
  auto waiting_fork = waiting.forks[0].channel;
  auto waiting_main = waiting.channel;
  ASSERT_EQ(sched.submit(std::move(waiting)), Scheduler::Submit::accepted);
  ASSERT_TRUE(chans[0]->pop(60000).has_value());  // the first token: it runs
  waiting_main->cancel();
  EXPECT_EQ(collect(*waiting_fork).finish_reason, "cancelled");
  EXPECT_EQ(collect(*waiting_main).finish_reason, "cancelled");
  for (auto& ch : chans) ch->cancel();
  for (auto& ch : chans) EXPECT_EQ(collect(*ch).finish_reason, "cancelled");
  sched.run_on_engine([] {});
  EXPECT_EQ(sched.stats().n_running, 0);
  EXPECT_EQ(sched.stats().n_cancelled, 4u);
}

}  // namespace osprey
