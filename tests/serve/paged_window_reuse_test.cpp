// Multi-turn reuse over sliding-window models in the paged pool (serve/paged_backend.h) sized
// as `osprey serve -np 1` sizes it (no byte budget, the model's context, blocks of 16, prefill
// chunks of 512): a turn that repeats the previous turn's prompt and reply reuses every full
// block of it, although the windowed layers' group holds only about a window and a chunk, and
// its reply is the fresh run's (batch invariance on: the same tokens, and the same logits bit
// for bit where the cached rows were prefilled as the fresh run prefills them); a prefix whose
// window's rows are gone is not used.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "backend/ops.h"
#include "serve/invariant_scope.h"
#include "serve/paged_backend.h"
#include "model/model.h"
#include "support/device_test.h"
#include "support/test_util.h"

namespace osprey {
namespace {

std::filesystem::path fixture(const std::string& family) { return testing::source_dir() / "tests/fixtures/models" / family; }

std::vector<int32_t> random_tokens(std::mt19937& rng, int64_t n, int64_t vocab) {
  std::uniform_int_distribution<int32_t> d(0, int32_t(vocab - 1));
  std::vector<int32_t> p(static_cast<size_t>(n), 0);
  for (auto& t : p) t = d(rng);
  return p;
}

// One request as the scheduler runs it alone: the prompt's uncached rest prefilled in chunks of
// the backend's prefill chunk, then n_steps greedy steps; the sequence ends holding every token
// but the last (whose row is never written). tokens: the prompt, then the reply.
struct Turn {
  int64_t n_cached = -1;
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

Turn run_turn(PagedBackend& backend, const std::vector<int32_t>& prompt, int n_steps, int64_t chunk) {
  Turn r;
  auto b = backend.begin(prompt, "");
  EXPECT_TRUE(b.has_value()) << "the request was not admitted";
  if (!b) return r;
  r.n_cached = b->n_cached;
  std::vector<float> logits;
  for (int64_t at = b->n_cached; at < int64_t(prompt.size()); at += chunk) {
    const int64_t n = std::min<int64_t>(chunk, int64_t(prompt.size()) - at);
    EXPECT_TRUE(backend.reserve(b->handle, n));
    backend.prefill(b->handle, std::span<const int32_t>(prompt).subspan(size_t(at), size_t(n)), true, logits);
  }
  r.tokens = prompt;
  SequenceBackend::DecodeInput in;
  in.handle = b->handle;
  in.token = argmax(logits);
  r.logits.push_back(logits);
  r.tokens.push_back(in.token);
  std::vector<SequenceBackend::DecodeOutput> out;
  for (int s = 0; s < n_steps; ++s) {
    EXPECT_TRUE(backend.reserve(in.handle, 1));
    backend.decode(std::span<const SequenceBackend::DecodeInput>(&in, 1), out, {});
    EXPECT_TRUE(out[0].error.empty()) << out[0].error;
    r.logits.push_back(out[0].logits);
    in.token = argmax(out[0].logits);
    r.tokens.push_back(in.token);
  }
  backend.end(in.handle, std::span<const int32_t>(r.tokens).first(r.tokens.size() - 1));
  return r;
}

class PagedWindowReuseTest : public testing::DeviceTestOf<testing::ModelCase> {
 protected:
  void SetUp() override {
    DeviceTestOf::SetUp();
    if (IsSkipped()) return;
    LoadOptions lo;
    lo.device = device();
    model_ = load_model(fixture(GetParam().model), lo);
    vocab_ = model_->info().vocab_size;
    // The fixtures' window of 16 rows (one block): the pool's windowed group holds
    // ceil((16 - 1 + 512) / 16) + 2 = 35 blocks per sequence, 560 rows, fewer than a turn.
    bool windowed = false;
    for (int64_t l = 0; l < model_->info().n_layers; ++l) windowed = windowed || model_->kv_params(l).window == kWindow;
    ASSERT_TRUE(windowed) << GetParam().model << " has no layer of window " << kWindow;
  }

  // As `osprey serve -np 1` sizes the pool: the defaults of PagedBackendOptions but one sequence.
  PagedBackendOptions serve_options(bool inplace = true) const {
    PagedBackendOptions o;
    o.max_sequences = 1;
    o.inplace = inplace;
    return o;
  }

  // Turn 2's reply computed from nothing, in a fresh pool.
  Turn fresh(const std::vector<int32_t>& prompt, int n_steps) {
    PagedBackend backend(*model_, serve_options());
    return run_turn(backend, prompt, n_steps, backend_chunk_);
  }

  // The same greedy tokens, and logits the same bit for bit where every cached row was written
  // by a prefill as the fresh run writes it. A cached reply's rows were written by decode steps,
  // whose paged attention sums a full-attention layer's keys in splits of 128 where the fresh
  // run's prefill sums them in one pass: close then (f32 activations, bf16 rows), not equal. A
  // wrong or stale row is far past that tolerance.
  void expect_same_reply(const Turn& got, const Turn& want, bool bitwise) {
    EXPECT_EQ(got.tokens, want.tokens);
    ASSERT_EQ(got.logits.size(), want.logits.size());
    for (size_t i = 0; i < want.logits.size(); ++i) {
      if (bitwise)
        ASSERT_EQ(std::memcmp(got.logits[i].data(), want.logits[i].data(), size_t(vocab_) * 4), 0) << "step " << i;
      else
        ASSERT_LT(testing::relative_row_error(got.logits[i].data(), want.logits[i].data(), vocab_), 1e-3) << "step " << i;
    }
  }

  static constexpr int64_t kWindow = 16;
  const int64_t backend_chunk_ = PagedBackendOptions{}.prefill_chunk;
  std::unique_ptr<Model> model_;
  int64_t vocab_ = 0;
};

// Turn 1: a 600-token prompt and 40 steps, 640 rows written (the 41st token's is not). Turn 2
// repeats all 641 tokens and adds 30. Its cached prefix: the 40 full blocks of turn 1 (640
// rows); a query at position 640 sees rows (624, 640], all in block 39, which turn 1 held when
// it ended; the full-attention group (where there is one) holds every block. So 640 tokens are
// cached, and 31 computed.
constexpr int64_t kPrompt1 = 600, kSteps1 = 40, kNew = 30, kWant = 640;

TEST_P(PagedWindowReuseTest, TheNextTurnReusesTheWholeConversation) {
  BatchInvariantScope invariant(true);
  std::mt19937 rng(3);
  const std::vector<int32_t> prompt1 = random_tokens(rng, kPrompt1, vocab_);
  for (bool inplace : {true, false}) {
    SCOPED_TRACE(inplace ? "in-place writes" : "copying writes");
    PagedBackend backend(*model_, serve_options(inplace));
    const Turn t1 = run_turn(backend, prompt1, int(kSteps1), backend_chunk_);
    ASSERT_EQ(t1.n_cached, 0);
    std::vector<int32_t> prompt2 = t1.tokens;
    for (int32_t t : random_tokens(rng, kNew, vocab_)) prompt2.push_back(t);
    const Turn t2 = run_turn(backend, prompt2, 12, backend_chunk_);
    EXPECT_EQ(t2.n_cached, kWant);
    expect_same_reply(t2, fresh(prompt2, 12), false);
    // Turn 3 continues turn 2 the same way: 671 + 12 rows written, 683 rounded down to 672.
    std::vector<int32_t> prompt3 = t2.tokens;
    for (int32_t t : random_tokens(rng, kNew, vocab_)) prompt3.push_back(t);
    const Turn t3 = run_turn(backend, prompt3, 12, backend_chunk_);
    EXPECT_EQ(t3.n_cached, 672);
    expect_same_reply(t3, fresh(prompt3, 12), false);
    EXPECT_EQ(backend.pool_stats().n_in_use, 0);
  }
}

TEST_P(PagedWindowReuseTest, AnotherRequestBetweenTwoTurnsLeavesTheConversationCached) {
  // A request of another conversation as long as turn 1 (a title for the chat, say) runs between
  // turns 1 and 2: it needs as many blocks of the windowed group as turn 1 did, and turn 2 still
  // finds turn 1's window: 640 tokens, as above.
  BatchInvariantScope invariant(true);
  std::mt19937 rng(4);
  const std::vector<int32_t> prompt1 = random_tokens(rng, kPrompt1, vocab_);
  PagedBackend backend(*model_, serve_options());
  const Turn t1 = run_turn(backend, prompt1, int(kSteps1), backend_chunk_);
  const Turn other = run_turn(backend, random_tokens(rng, kPrompt1, vocab_), int(kSteps1), backend_chunk_);
  ASSERT_EQ(other.n_cached, 0);
  std::vector<int32_t> prompt2 = t1.tokens;
  for (int32_t t : random_tokens(rng, kNew, vocab_)) prompt2.push_back(t);
  const Turn t2 = run_turn(backend, prompt2, 12, backend_chunk_);
  EXPECT_EQ(t2.n_cached, kWant);
  expect_same_reply(t2, fresh(prompt2, 12), false);
}

TEST_P(PagedWindowReuseTest, APromptThatLeavesTheConversationEarlyReusesOnlyWhatItsWindowStillHas) {
  // Prompts that share turn 1's first tokens and then differ. Turn 1's windowed group, 37
  // blocks (35 for a sequence, 2 for a finished one's window), wrote its blocks 0 to 39: the
  // first chunk (512 rows) took 32 blocks and gave back 0 to 30 to the prefix cache; the second
  // (88 rows) and the 40 steps took 8 more: the 5 free ones, then 3 evicted, the least recently
  // given back (0, 1 and 2).
  // A prefix of k blocks is usable where the window of a query at 16k, rows (16k - 16, 16k),
  // lies in blocks still held:
  //   - 40 shared tokens: 2 blocks would need block 1, 1 block would need block 0: none cached
  //     (the full-attention group still has them all, but cannot be used alone);
  //   - 300 shared tokens: 18 blocks (288 rows) need block 17, still held: 288 cached.
  // Each reply must be the fresh run's.
  BatchInvariantScope invariant(true);
  std::mt19937 rng(5);
  const std::vector<int32_t> prompt1 = random_tokens(rng, kPrompt1, vocab_);
  const std::vector<int32_t> tail = random_tokens(rng, kNew, vocab_);
  for (auto [shared, want] : {std::pair<int64_t, int64_t>{40, 0}, {300, 288}}) {
    SCOPED_TRACE(std::to_string(shared) + " shared tokens");
    PagedBackend backend(*model_, serve_options());
    run_turn(backend, prompt1, int(kSteps1), backend_chunk_);
    std::vector<int32_t> branch(prompt1.begin(), prompt1.begin() + shared);
    branch.insert(branch.end(), tail.begin(), tail.end());
    const Turn t = run_turn(backend, branch, 12, backend_chunk_);
    EXPECT_EQ(t.n_cached, want);
    expect_same_reply(t, fresh(branch, 12), true);
  }
}

INSTANTIATE_TEST_SUITE_P(Windowed, PagedWindowReuseTest,
                         OSPREY_MODELS_ON_DEVICES(std::vector<std::string>({"gemma3", "cohere2", "mistral"})));

}  // namespace
}  // namespace osprey
