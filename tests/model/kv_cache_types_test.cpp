// Models decoding over the KV cache types (--cache-type-k, --cache-type-v) on the CPU:
//  - the in-place arm and the copying arm (OSPREY_KV_INPLACE_WRITE=0) give bit-identical logits
//    for every pair of types, on the demo model (dense layers) and the Gemma 3 fixture (its
//    sliding-window layers through the rotating cache);
//  - on the demo model (trained: its distributions are peaked, unlike a random fixture's), a
//    quantized cache follows the 16-bit cache's greedy tokens: teacher-forced on the f16 run's
//    tokens, every step whose f16 margin (top logit minus the runner-up) is at least kMargin
//    picks the same token, and the logits stay within a bound of the f16 ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model/model.h"
#include "support/test_util.h"
#include "tokenizer/tokenizer.h"

namespace osprey {
namespace {

struct Types {
  DType k, v;
};

std::string label(const Types& t) { return std::string(dtype_name(t.k)) + "/" + dtype_name(t.v); }

std::filesystem::path demo_dir() { return testing::source_dir() / "models/demo"; }

struct Steps {
  std::vector<std::vector<float>> logits;  // per step, the last position's row
  KVCounters counters;
};

// The prompt at once, then `forced` one token at a time (n_steps of them; an empty list:
// greedy, each step feeding the last step's argmax).
Steps decode(Model& m, const KVCacheParams& co, const std::vector<int32_t>& prompt, const std::vector<int32_t>& forced,
             int n_steps) {
  SequenceCache cache = m.make_cache(co);
  Steps s;
  const int64_t vocab = m.info().vocab_size;
  auto keep = [&](const Array& logits) {
    const float* row = logits.data<float>() + (logits.numel() - vocab);
    s.logits.emplace_back(row, row + vocab);
  };
  keep(m.forward(testing::tokens_of(prompt), cache, false));
  for (int i = 0; i < n_steps; ++i) {
    const std::vector<float>& last = s.logits.back();
    const int32_t next = forced.empty() ? int32_t(std::max_element(last.begin(), last.end()) - last.begin())
                                        : forced[size_t(i)];
    keep(m.forward(testing::tokens_of({next}), cache, false));
  }
  s.counters = cache.counters();
  return s;
}

int32_t argmax(const std::vector<float>& row) { return int32_t(std::max_element(row.begin(), row.end()) - row.begin()); }

float margin(const std::vector<float>& row) {
  std::vector<float> r = row;
  std::partial_sort(r.begin(), r.begin() + 2, r.end(), std::greater<float>());
  return r[0] - r[1];
}

KVCacheParams options(const Types& t, bool inplace) {
  KVCacheParams co;
  co.inplace = inplace;
  co.step = 16;  // growths inside the run
  co.k_type = t.k;
  co.v_type = t.v;
  return co;
}

}  // namespace

TEST(KVCacheTypesModel, InPlaceAndCopyingArmsGiveIdenticalLogits) {
  const Types pairs[] = {{DType::q8_0, DType::q8_0},
                         {DType::fp8_e4m3, DType::fp8_e4m3},
                         {DType::q8_0, DType::bf16},
                         {DType::f16, DType::fp8_e4m3},
                         {DType::bf16, DType::f16}};
  for (const std::filesystem::path& dir : {demo_dir(), testing::source_dir() / "tests/fixtures/models/gemma3"}) {
    auto model = load_model(dir);
    const std::vector<int32_t> prompt = {1, 57, 301, 9, 120, 44, 87, 12, 5, 61, 33};  // ids < 512 (the fixture's vocab)
    for (const Types& t : pairs) {
      const Steps on = decode(*model, options(t, true), prompt, {}, 40);
      const Steps off = decode(*model, options(t, false), prompt, {}, 40);
      ASSERT_EQ(on.logits.size(), off.logits.size());
      for (size_t i = 0; i < on.logits.size(); ++i)
        ASSERT_EQ(std::memcmp(on.logits[i].data(), off.logits[i].data(), on.logits[i].size() * sizeof(float)), 0)
            << dir.filename() << " " << label(t) << ": step " << i;
      EXPECT_GT(on.counters.n_inplace_writes, 0u) << label(t);
      EXPECT_EQ(off.counters.n_inplace_writes, 0u) << label(t);
    }
  }
}

TEST(KVCacheTypesModel, QuantizedCachesFollowTheF16GreedyTokens) {
  // The bounds: the largest logit change over the run as a fraction of the f16 row's range
  // (max - min) is about half of each bound as measured here (q8_0 0.0020, fp8 0.0095, q8_0 keys
  // with fp8 values 0.0034, bf16 0.0004: at most about 0.2 of a logit), so a step whose f16 margin
  // is at least kMargin = 0.5 keeps its token; 44 of the 65 steps have that margin.
  constexpr float kMargin = 0.5f;
  auto model = load_model(demo_dir());
  const Tokenizer tok = Tokenizer::load(demo_dir());
  const std::vector<int32_t> prompt = tok.encode("Once upon a time, there was a little girl named", true);
  const int n = 64;
  const Steps ref = decode(*model, options({DType::f16, DType::f16}, true), prompt, {}, n);
  std::vector<int32_t> tokens;
  for (int i = 0; i < n; ++i) tokens.push_back(argmax(ref.logits[size_t(i)]));
  struct Bound {
    Types t;
    double max_relative;  // the largest |logit - f16 logit| / the f16 row's range
  };
  const Bound bounds[] = {{{DType::q8_0, DType::q8_0}, 0.004},
                          {{DType::fp8_e4m3, DType::fp8_e4m3}, 0.02},
                          {{DType::q8_0, DType::fp8_e4m3}, 0.007},
                          {{DType::bf16, DType::bf16}, 0.001}};
  for (const Bound& b : bounds) {
    const Steps got = decode(*model, options(b.t, true), prompt, tokens, n);
    int checked = 0, same = 0;
    double worst = 0.0;
    for (size_t i = 0; i < ref.logits.size(); ++i) {
      worst = std::max(worst, testing::relative_row_error(got.logits[i].data(), ref.logits[i].data(),
                                                          int64_t(ref.logits[i].size())));
      if (margin(ref.logits[i]) < kMargin) continue;
      ++checked;
      same += argmax(got.logits[i]) == argmax(ref.logits[i]);
      EXPECT_EQ(argmax(got.logits[i]), argmax(ref.logits[i]))
          << label(b.t) << ": step " << i << " (f16 margin " << margin(ref.logits[i]) << ")";
    }
    EXPECT_GE(checked, n / 2) << label(b.t) << ": too few steps with an f16 margin of " << kMargin;
    EXPECT_LT(worst, b.max_relative) << label(b.t) << ": the largest logit change";
    std::printf("[ kv types ] %s: %d of %d steps with f16 margin >= %.2f keep the token; largest logit change %.4f "
                "of the row's range\n",
                label(b.t).c_str(), same, checked, double(kMargin), worst);
  }
}

}  // namespace osprey
