// The attention kernels (cpu::attention at every level of the CPU kernels, with one and three
// threads; cuda::attention) against a naive double-precision softmax(q k^T) v over the same
// f16 or bf16 cache (tests/support/attention_reference.h). Cache rows past the live length
// hold NaN and outputs start as NaN, so a read past the length or an unwritten element fails.
// The CUDA kernels' own paths (tensor-core tiles, device positions, captured graphs) are in
// cuda_attention_test.cpp.
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
#include "support/attention_reference.h"
#include "support/device_test.h"
#include "support/numeric.h"

#ifdef OSPREY_WITH_CUDA
#include "backend/cuda/kernels.h"
#include "support/cuda_buffers.h"
#endif

namespace osprey {
namespace {

using testing::AttnCase;
using testing::AttnData;

// max |got - ref| over max |ref| (NaN anywhere: infinite).
double max_rel_error(const std::vector<float>& got, const std::vector<double>& ref) {
  double max_err = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = std::fabs(double(got[i]) - ref[i]);
    max_err = std::isnan(e) ? INFINITY : std::max(max_err, e);
    max_ref = std::max(max_ref, std::fabs(ref[i]));
  }
  return max_ref > 0.0 ? max_err / max_ref : max_err;
}

std::vector<float> cpu_attention(const AttnCase& s, const AttnData& d, ThreadPool& pool) {
  std::vector<float> out(d.q.size(), std::nanf(""));
  cpu::AttentionArgs a;
  testing::set_attention_args(a, s, d);
  a.q = d.q.data();
  a.k = d.k.data();
  a.v = d.v.data();
  a.out = out.data();
  cpu::kernels().attention(a, pool);
  return out;
}

#ifdef OSPREY_WITH_CUDA
std::vector<float> cuda_attention(const AttnCase& s, const AttnData& d) {
  testing::DeviceVec<float> q(d.q), out(std::vector<float>(d.q.size(), std::nanf("")));
  testing::DeviceVec<uint16_t> k(d.k), v(d.v);
  cuda::AttentionArgs a{};
  testing::set_attention_args(a, s, d);
  a.q = q.get();
  a.k = k.get();
  a.v = v.get();
  a.out = out.get();
  cuda::attention(a, testing::st());
  return out.download();
}
#endif

class Attention : public testing::DeviceTest {
 protected:
  // The case at each of `head_dims` (and, on the CPU, with one and with three threads) against
  // the reference. The CPU computes in f32 from the 16-bit rows: max error over max |ref| under
  // 1e-4. CUDA's tensor-core paths round q * scale and the softmax weights to the rows' type:
  // ||got - ref|| / ||ref|| under 1e-3 with f16 rows, 1e-2 with bf16 (8 significant bits).
  void expect_close(AttnCase s, const std::string& what, std::initializer_list<int64_t> head_dims = {64, 128, 80}) {
    uint32_t seed = 17;
    for (int64_t head_dim : head_dims) {
      s.head_dim = head_dim;
      if (on_cuda()) {
        EXPECT_LT(error(s, seed++, nullptr), s.bf16 ? 1e-2 : 1e-3) << what << " head_dim=" << head_dim;
        continue;
      }
      for (ThreadPool* pool : {&pool1_, &pool3_})
        EXPECT_LT(error(s, seed++, pool), 1e-4) << what << " head_dim=" << head_dim << " threads=" << pool->n_threads();
    }
  }

 private:
  double error(const AttnCase& s, uint32_t seed, ThreadPool* pool) const {
    std::mt19937 rng(seed);
    const AttnData d = testing::make_attn_data(s, rng);
    const std::vector<double> ref = testing::attention_reference(s, d, testing::attention_scale(s));
    if (pool) return max_rel_error(cpu_attention(s, d, *pool), ref);
#ifdef OSPREY_WITH_CUDA
    return testing::rel_error(cuda_attention(s, d), ref);
#else
    ADD_FAILURE() << "a CUDA instance in a build without CUDA";
    return INFINITY;
#endif
  }

  ThreadPool pool1_{1}, pool3_{3};
};

// n query rows at positions [pos0, pos0 + n), over the keys [0, pos0 + n): a prefill at
// pos0 = 0, a decode step at n = 1, a chunk after cached rows otherwise.
void at_rows(AttnCase& s, int64_t n, int64_t pos0) {
  s.n = n;
  s.q_pos0 = pos0;
  s.n_keys = pos0 + n;
}

TEST_P(Attention, DecodeOverThousandsOfKeys) {
  AttnCase s;
  at_rows(s, 1, 2999);
  s.scale = 0.5f;  // peaked enough that the running max matters
  expect_close(s, "decode L=3000", {64, 80, 96, 128, 256});
  s.row_major_heads = true;
  expect_close(s, "decode L=3000 [L, kv, hd] cache", {128});
  s.row_major_heads = false;
  s.head_pad = 4;  // rows not 16-byte aligned
  expect_close(s, "decode L=3000 unaligned rows", {64, 80});
}

TEST_P(Attention, DecodeShortCache) {
  for (int64_t L : {1, 2, 17, 64, 65, 600}) {
    AttnCase s;
    at_rows(s, 1, L - 1);
    expect_close(s, "decode L=" + std::to_string(L));
  }
}

TEST_P(Attention, Prefill) {
  AttnCase s;
  at_rows(s, 37, 0);
  expect_close(s, "prefill n=L=37", {64, 80, 96, 128, 256});
  at_rows(s, 150, 0);
  expect_close(s, "prefill n=L=150");
  s.n_heads = 16;  // 8 query heads per kv head
  expect_close(s, "prefill n=L=150 GQA 16:2", {128});
}

TEST_P(Attention, ChunkAfterCachedRows) {
  AttnCase s;
  at_rows(s, 5, 20);
  expect_close(s, "chunk n=5 pos0=20 L=25");
  at_rows(s, 70, 130);
  expect_close(s, "chunk n=70 pos0=130 L=200");
  at_rows(s, 4, 2996);
  expect_close(s, "chunk n=4 pos0=2996 L=3000 (keys split)");
}

TEST_P(Attention, SlidingWindow) {
  AttnCase s;
  s.window = 16;
  at_rows(s, 37, 0);
  expect_close(s, "prefill window=16");
  at_rows(s, 1, 2999);
  expect_close(s, "decode window=16");
  s.window = 700;
  expect_close(s, "decode window=700");
  at_rows(s, 5, 20);
  s.window = 4;
  expect_close(s, "chunk window=4");
}

TEST_P(Attention, Softcap) {
  AttnCase s;
  s.softcap = 5.0f;
  s.scale = 1.0f;  // logits well past the cap
  at_rows(s, 37, 0);
  expect_close(s, "prefill softcap");
  at_rows(s, 1, 2999);
  expect_close(s, "decode softcap");
  at_rows(s, 1, 1499);
  s.window = 100;
  expect_close(s, "decode softcap + window");
}

TEST_P(Attention, HeadGroupings) {
  for (int64_t kv : {1, 8}) {
    AttnCase s;
    s.n_kv_heads = kv;
    at_rows(s, 33, 0);
    expect_close(s, "prefill grouping kv=" + std::to_string(kv));
    at_rows(s, 1, 999);
    expect_close(s, "decode grouping kv=" + std::to_string(kv));
  }
}

TEST_P(Attention, InterleavedCacheLayout) {
  AttnCase s;
  s.row_major_heads = true;
  at_rows(s, 6, 40);
  expect_close(s, "chunk [L, kv, D] layout");
  at_rows(s, 1, 899);
  expect_close(s, "decode [L, kv, D] layout");
}

// Head sizes that are not a multiple of the CPU's vector width, and CUDA's CUDA-core path.
TEST_P(Attention, HeadDimsOffTheVectorWidth) {
  AttnCase s;
  at_rows(s, 40, 0);
  expect_close(s, "prefill", {72, 40, 256});
  at_rows(s, 1, 699);
  expect_close(s, "decode", {72, 40, 256});
}

// bf16 rows, with keys and values up to 2e5 (past f16's 65504, which would make them inf):
// q small enough that the logits stay of order one (rounding q to bf16 then moves them by well
// under 1%).
TEST_P(Attention, Bf16RowsBeyondTheF16Range) {
  AttnCase s;
  s.bf16 = true;
  s.kv_range = 2.0e5f;
  s.q_range = 2.0e-5f;
  at_rows(s, 37, 0);
  expect_close(s, "bf16 prefill");
  at_rows(s, 5, 130);
  s.window = 50;
  expect_close(s, "bf16 chunk with window");
  s.window = 0;
  at_rows(s, 1, 2999);
  expect_close(s, "bf16 decode L=3000");
  s.softcap = 4.0f;
  s.window = 100;
  expect_close(s, "bf16 decode softcap + window", {64, 72});
}

TEST_P(Attention, RowWithoutVisibleKeysIsZero) {
  // Query rows past the cache end see keys only up to L - 1; with a window of 2, rows at
  // positions >= L + 1 see none.
  expect_close({.n = 4, .n_keys = 11, .q_pos0 = 10, .window = 2}, "rows beyond the cache");
}

INSTANTIATE_TEST_SUITE_P(Devices, Attention, OSPREY_DEVICE_LEVELS);

}  // namespace
}  // namespace osprey
