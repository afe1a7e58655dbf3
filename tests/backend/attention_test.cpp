// cpu::attention against a naive double-precision softmax(q k^T) v.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/kernel_table.h"
#include "core/half.h"
#include "support/attention_reference.h"
#include "support/cpu_levels.h"

namespace osprey {
namespace {

using testing::AttnCase;
using testing::AttnData;
using testing::make_attn_data;

// Max |out - ref| over max |ref|.
double run_and_compare(const AttnCase& s, ThreadPool& pool, uint32_t seed) {
  std::mt19937 rng(seed);
  const AttnData d = make_attn_data(s, rng);
  std::vector<float> out(size_t(s.n * s.n_heads * s.head_dim), std::nanf(""));
  cpu::AttentionArgs a;
  a.q = d.q.data();
  a.n = s.n;
  a.n_heads = s.n_heads;
  a.head_dim = s.head_dim;
  a.k = d.k.data();
  a.v = d.v.data();
  a.bf16 = s.bf16;
  a.n_kv_heads = s.n_kv_heads;
  a.n_keys = s.n_keys;
  a.k_head_stride = a.v_head_stride = d.head_stride;
  a.k_row_stride = a.v_row_stride = d.row_stride;
  a.q_pos0 = s.q_pos0;
  a.scale = s.scale > 0.0f ? s.scale : 1.0f / std::sqrt(float(s.head_dim));
  a.window = s.window;
  a.softcap = s.softcap;
  a.out = out.data();
  cpu::kernels().attention(a, pool);
  const std::vector<double> ref = testing::attention_reference(s, d, s.scale > 0.0f ? s.scale : 1.0 / std::sqrt(double(s.head_dim)));
  double max_err = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = std::fabs(double(out[i]) - ref[i]);
    max_err = std::isnan(e) ? INFINITY : std::max(max_err, e);
    max_ref = std::max(max_ref, std::fabs(ref[i]));
  }
  return max_ref > 0.0 ? max_err / max_ref : max_err;
}

void expect_close(AttnCase s, const char* what, std::initializer_list<int64_t> head_dims = {64, 128, 80}) {
  ThreadPool pool1(1), pool3(3);
  uint32_t seed = 17;
  for (int64_t head_dim : head_dims) {
    s.head_dim = head_dim;
    for (ThreadPool* pool : {&pool1, &pool3}) {
      const double err = run_and_compare(s, *pool, seed++);
      EXPECT_LT(err, 1e-4) << what << " head_dim=" << head_dim << " threads=" << pool->n_threads();
    }
  }
}

class Attention : public testing::CpuLevelTest {};

TEST_P(Attention, DecodeOverThousandsOfKeys) {
  AttnCase s;
  s.n = 1;
  s.n_keys = 3000;
  s.q_pos0 = 2999;
  s.scale = 0.5f;  // peaked enough that the running max matters
  expect_close(s, "decode L=3000");
}

TEST_P(Attention, DecodeShortCache) {
  for (int64_t L : {1, 2, 17, 64, 65, 600}) {
    AttnCase s;
    s.n_keys = L;
    s.q_pos0 = L - 1;
    expect_close(s, ("decode L=" + std::to_string(L)).c_str());
  }
}

TEST_P(Attention, Prefill) {
  AttnCase s;
  s.n = s.n_keys = 37;
  expect_close(s, "prefill n=L=37");
  s.n = s.n_keys = 150;
  expect_close(s, "prefill n=L=150");
}

TEST_P(Attention, ChunkAfterCachedRows) {
  AttnCase s;
  s.n = 5;
  s.q_pos0 = 20;
  s.n_keys = 25;
  expect_close(s, "chunk n=5 pos0=20 L=25");
  s.n = 70;
  s.q_pos0 = 130;
  s.n_keys = 200;
  expect_close(s, "chunk n=70 pos0=130 L=200");
}

TEST_P(Attention, SlidingWindow) {
  AttnCase s;
  s.window = 16;
  s.n = s.n_keys = 37;
  expect_close(s, "prefill window=16");
  s.n = 1;
  s.n_keys = 3000;
  s.q_pos0 = 2999;
  expect_close(s, "decode window=16");
  s.window = 700;
  expect_close(s, "decode window=700");
  s.n = 5;
  s.q_pos0 = 20;
  s.n_keys = 25;
  s.window = 4;
  expect_close(s, "chunk window=4");
}

TEST_P(Attention, Softcap) {
  AttnCase s;
  s.softcap = 5.0f;
  s.scale = 1.0f;  // logits well past the cap
  s.n = s.n_keys = 37;
  expect_close(s, "prefill softcap");
  s.n = 1;
  s.n_keys = 1500;
  s.q_pos0 = 1499;
  s.window = 100;
  expect_close(s, "decode softcap + window");
}

TEST_P(Attention, HeadGroupings) {
  for (int64_t kv : {1, 8}) {
    AttnCase s;
    s.n_kv_heads = kv;
    s.n = s.n_keys = 33;
    expect_close(s, "prefill grouping");
    s.n = 1;
    s.n_keys = 1000;
    s.q_pos0 = 999;
    expect_close(s, "decode grouping");
  }
}

TEST_P(Attention, InterleavedCacheLayout) {
  AttnCase s;
  s.row_major_heads = true;
  s.n = 6;
  s.q_pos0 = 40;
  s.n_keys = 46;
  expect_close(s, "chunk [L, kv, D] layout");
  s.n = 1;
  s.n_keys = 900;
  s.q_pos0 = 899;
  expect_close(s, "decode [L, kv, D] layout");
}

TEST_P(Attention, HeadDimsOffTheVectorWidth) {
  AttnCase s;
  s.n = s.n_keys = 40;
  expect_close(s, "prefill", {72, 40, 256});
  s.n = 1;
  s.n_keys = 700;
  s.q_pos0 = 699;
  expect_close(s, "decode", {72, 40, 256});
}

// bf16 rows, with keys and values up to 2e5 (past f16's 65504, which would make them inf):
// q small enough that the logits stay in a range where the softmax is not one-hot.
TEST_P(Attention, Bf16RowsBeyondTheF16Range) {
  AttnCase s;
  s.bf16 = true;
  s.kv_range = 2.0e5f;
  s.q_range = 2.0e-4f;
  s.n = s.n_keys = 37;
  expect_close(s, "bf16 prefill");
  s.n = 5;
  s.q_pos0 = 130;
  s.n_keys = 135;
  s.window = 50;
  expect_close(s, "bf16 chunk with window");
  s.window = 0;
  s.n = 1;
  s.n_keys = 3000;
  s.q_pos0 = 2999;
  expect_close(s, "bf16 decode L=3000");
  s.softcap = 4.0f;
  s.window = 100;
  expect_close(s, "bf16 decode softcap + window", {64, 72});
}

TEST_P(Attention, RowWithoutVisibleKeysIsZero) {
  // Query rows past the cache end see keys only up to L - 1; with a window of 2, rows at
  // positions >= L + 1 see none.
  AttnCase s;
  s.n = 4;
  s.q_pos0 = 10;
  s.n_keys = 11;
  s.window = 2;
  expect_close(s, "rows beyond the cache");
}

INSTANTIATE_TEST_SUITE_P(CpuLevels, Attention, OSPREY_ALL_CPU_LEVELS);

}  // namespace
}  // namespace osprey
