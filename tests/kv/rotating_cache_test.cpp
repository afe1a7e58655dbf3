// RotatingKVCache: attention through the ring against a plain double-precision sliding-window
// attention over the full key list (CPU and CUDA), its ownership rule after the wrap (with a
// subclass that drops the rule to prove the tests catch the corruption), its exact write
// counts, and trimming after the wrap.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/graph.h"
#include "backend/ops.h"
#include "core/error.h"
#include "kv/dense_cache.h"
#include "kv/replay.h"
#include "kv/rotating_cache.h"
#include "support/device_test.h"
#include "support/kv_params.h"
#include "support/numeric.h"

namespace osprey {
namespace {

constexpr int64_t kHeads = 4, kKVHeads = 2, kDim = 64;

// Every position's q [kHeads, kDim], k and v [kKVHeads, kDim]: k and v are multiples of 1/64
// in [-2, 2], exact in f16 and bf16, so the reference needs no rounding.
struct Sequence {
  std::vector<float> q, k, v;
  Sequence(int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uq(-1.0f, 1.0f);
    std::uniform_int_distribution<int> ukv(-128, 128);
    q.resize(size_t(n * kHeads * kDim));
    k.resize(size_t(n * kKVHeads * kDim));
    v.resize(k.size());
    for (auto& x : q) x = uq(rng);
    for (auto& x : k) x = float(ukv(rng)) / 64.0f;
    for (auto& x : v) x = float(ukv(rng)) / 64.0f;
  }
};

// Query at position t sees keys (t - window, t]: softmax(scale q.k) v in double,
// [n, kHeads * kDim] for positions [p0, p0 + n).
std::vector<double> sliding_reference(const Sequence& s, int64_t p0, int64_t n, int64_t window) {
  const double scale = 1.0 / std::sqrt(double(kDim));
  const int64_t group = kHeads / kKVHeads;
  std::vector<double> out(size_t(n * kHeads * kDim), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = p0 + i, lo = std::max<int64_t>(0, t - window + 1);
    for (int64_t h = 0; h < kHeads; ++h) {
      const int64_t hk = h / group;
      std::vector<double> w;
      for (int64_t j = lo; j <= t; ++j) {
        double dot = 0.0;
        for (int64_t d = 0; d < kDim; ++d)
          dot += double(s.q[size_t((t * kHeads + h) * kDim + d)]) * double(s.k[size_t((j * kKVHeads + hk) * kDim + d)]);
        w.push_back(dot * scale);
      }
      const double m = *std::max_element(w.begin(), w.end());
      double sum = 0.0;
      for (auto& x : w) sum += (x = std::exp(x - m));
      for (int64_t j = lo; j <= t; ++j)
        for (int64_t d = 0; d < kDim; ++d)
          out[size_t((i * kHeads + h) * kDim + d)] +=
              w[size_t(j - lo)] / sum * double(s.v[size_t((j * kKVHeads + hk) * kDim + d)]);
    }
  }
  return out;
}

// Rows [p0, p0 + n) of a per-position table of `width` floats, as f32 [n, heads, kDim].
Array slice(const std::vector<float>& table, int64_t p0, int64_t n, int64_t heads, Device device) {
  Array a = Array::empty({n, heads, kDim}, DType::f32);
  std::memcpy(a.data<float>(), table.data() + p0 * heads * kDim, size_t(a.numel()) * 4);
  return ops::to_device(a, device);
}

Array positions(int64_t p0, int64_t n, Device device) {
  Array a = Array::empty({n}, DType::i32);
  for (int64_t i = 0; i < n; ++i) a.data<int32_t>()[i] = int32_t(p0 + i);
  return ops::to_device(a, device);
}

std::vector<float> host_floats(const Array& a) {
  Array h = ops::to_device(a, Device::cpu());
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

KVCacheParams ring_params(int64_t window, DType dtype, Device device, bool inplace = true) {
  KVCacheParams p = testing::kv_params(kKVHeads, kDim, dtype);
  p.window = window;
  p.device = device;
  p.inplace = inplace;
  return p;
}

// Writes positions [L, L + n) of `s` and returns attention for them, as a family does.
std::vector<float> step(KVCache& c, const Sequence& s, int64_t n, int64_t window, Device device) {
  const int64_t L = c.offset();
  Array q = slice(s.q, L, n, kHeads, device);
  Array out;
  {
    KVView view = c.update_and_fetch(slice(s.k, L, n, kKVHeads, device), slice(s.v, L, n, kKVHeads, device),
                                     positions(L, n, device));
    ops::AttentionParams ap = view.attention_params();
    ap.scale = 1.0f / std::sqrt(float(kDim));
    ap.window = int(window);
    out = ops::attention(q, view.keys, view.values, ap);
  }  // the view goes, as it does in a family's layer
  return host_floats(out);
}

class RingAttention : public testing::DeviceTest {
 protected:
  // The CPU computes in f32 from the exact rows; CUDA rounds q and the softmax weights to the
  // cache's 16-bit type for the tensor cores.
  double tolerance(DType dtype) const { return !on_cuda() ? 1e-4 : dtype == DType::bf16 ? 1e-2 : 2e-3; }
};

// Chunk schedules past three wraps: single rows, chunks of 3, of window and of 2 * window + 1
// rows, in several orders, over windows 4..16, f16 and bf16, GQA (4 query heads over 2).
TEST_P(RingAttention, MatchesSlidingWindowReferenceOverChunkSchedules) {
  uint32_t seed = 1;
  for (int64_t window : {4, 7, 16})
    for (DType dtype : {DType::f16, DType::bf16}) {
      const std::vector<std::vector<int64_t>> schedules = {
          {1},                                  // decode only
          {3},                                  // chunks of 3
          {window},                             // chunks of window
          {2 * window + 1, 1},                  // a long prefill, then decode
          {1, 3, window, 2 * window + 1, 1, 1}  // everything mixed
      };
      const int64_t total = 4 * window + 5;
      for (const auto& pattern : schedules) {
        const Sequence s(total, seed++);
        std::unique_ptr<KVCache> c = make_kv_cache(ring_params(window, dtype, device()));
        ASSERT_NE(dynamic_cast<RotatingKVCache*>(c.get()), nullptr);
        std::string sched;
        for (size_t i = 0; c->offset() < total; ++i) {
          const int64_t n = std::min(pattern[std::min(i, pattern.size() - 1)], total - c->offset());
          const int64_t p0 = c->offset();
          sched += std::to_string(n) + " ";
          const std::vector<float> got = step(*c, s, n, window, device());
          const double err = testing::rel_error(got, sliding_reference(s, p0, n, window));
          ASSERT_LT(err, tolerance(dtype)) << dtype_name(dtype) << " window " << window << " rows [" << p0 << ", "
                                           << p0 + n << ") after chunks " << sched;
        }
        EXPECT_EQ(c->capacity(), window) << "the ring never grows";
      }
    }
}

// One decode step captured as a graph and replayed across the wrap (CUDA): the write's row and
// the query's position come from device memory, the launch shape from the ring's size.
TEST_P(RingAttention, ReplayedDecodeStepAcrossTheWrap) {
  if (!on_cuda()) GTEST_SKIP() << "graphs are a CUDA feature";
  const int64_t window = 8, total = 5 * window;
  for (DType dtype : {DType::f16, DType::bf16}) {
    const Sequence s(total, 77);
    RotatingKVCache c(ring_params(window, dtype, device()));
    (void)step(c, s, 3, window, device());  // prefill (copying)
    (void)step(c, s, 1, window, device());  // in place, eager (sizes the scratch)
    Array k = Array::empty({1, kKVHeads, kDim}, DType::f32, device());
    Array v = Array::empty({1, kKVHeads, kDim}, DType::f32, device());
    Array q = Array::empty({1, kHeads, kDim}, DType::f32, device());
    Array pos = positions(c.offset(), 1, device());
    Array out;
    ASSERT_TRUE(c.next_write_in_place(1));
    auto fill = [&](int64_t p) {
      ops::copy_into(k, slice(s.k, p, 1, kKVHeads, device()));
      ops::copy_into(v, slice(s.v, p, 1, kKVHeads, device()));
      ops::copy_into(q, slice(s.q, p, 1, kHeads, device()));
      ops::fill_i32_(pos, int32_t(p));
    };
    fill(c.offset());
    const int64_t p_cap = c.offset();
    auto graph = CapturedGraph::capture(device(), [&] {
      KVView view = c.update_and_fetch(k, v, pos);
      ops::AttentionParams ap = view.attention_params();
      ap.scale = 1.0f / std::sqrt(float(kDim));
      ap.window = int(window);
      out = ops::attention(q, view.keys, view.values, ap);
    });
    graph->replay();
    EXPECT_LT(testing::rel_error(host_floats(out), sliding_reference(s, p_cap, 1, window)), tolerance(dtype));
    while (c.offset() < total) {
      const int64_t p = c.offset();
      ASSERT_TRUE(c.next_write_in_place(1)) << "position " << p;
      fill(p);
      graph->replay();
      c.commit_replayed_write();
      ASSERT_LT(testing::rel_error(host_floats(out), sliding_reference(s, p, 1, window)), tolerance(dtype))
          << dtype_name(dtype) << " replayed at position " << p;
    }
    EXPECT_EQ(c.counters().n_copying_writes, 1u);
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, RingAttention, OSPREY_DEVICES);

// ---- ownership, counters, trim (CPU) ----

constexpr int64_t kWindow = 8;

// The rotating cache without the rule after the wrap: it writes in place whoever else holds
// its buffers.
class UnguardedRingCache final : public RotatingKVCache {
 public:
  using RotatingKVCache::RotatingKVCache;

 protected:
  bool sole_holder() const override { return true; }
};

std::unique_ptr<KVCache> ring_cache(bool guarded, bool inplace = true) {
  const KVCacheParams p = ring_params(kWindow, DType::f16, Device::cpu(), inplace);
  if (guarded) return std::make_unique<RotatingKVCache>(p);
  return std::make_unique<UnguardedRingCache>(p);
}

// Writes n positions of `s` without attention.
void write(KVCache& c, const Sequence& s, int64_t n) {
  const int64_t L = c.offset();
  c.update_and_fetch(slice(s.k, L, n, kKVHeads, Device::cpu()), slice(s.v, L, n, kKVHeads, Device::cpu()));
}

// The rows a state reads: those of its last min(offset, R) positions, [0, min(offset, R)).
std::vector<uint16_t> bytes_of(const KVState& st) {
  std::vector<uint16_t> out;
  const int64_t live = std::min(st.offset, st.keys.dim(1));
  for (const Array* a : {&st.keys, &st.values})
    for (int64_t h = 0; h < a->dim(0); ++h) {
      const uint16_t* p = a->data<uint16_t>() + h * a->strides()[0];
      out.insert(out.end(), p, p + live * kDim);
    }
  return out;
}

// Snapshot at 12 (past the wrap at 8) and at 5 (before it); the cache decodes 30 more rows.
// Returns whether both snapshots still read exactly their rows.
bool snapshots_survive(bool guarded) {
  const Sequence s(64, 3);
  auto c = ring_cache(guarded);
  write(*c, s, 5);
  const KVState early = c->snapshot();
  const std::vector<uint16_t> early_bytes = bytes_of(early);
  for (int i = 0; i < 7; ++i) write(*c, s, 1);
  const KVState late = c->snapshot();
  const std::vector<uint16_t> late_bytes = bytes_of(late);
  for (int i = 0; i < 30; ++i) write(*c, s, 1);
  return bytes_of(early) == early_bytes && bytes_of(late) == late_bytes;
}

TEST(RotatingKVCache, SnapshotSurvivesDecodingPastTheWrap) { EXPECT_TRUE(snapshots_survive(true)); }

TEST(RotatingKVCache, WithoutTheSoleHolderRuleTheSnapshotIsOverwritten) {
  // Proves the test above can fail: the same scenario, minus the rule, corrupts a snapshot.
  EXPECT_FALSE(snapshots_survive(false));
}

// A snapshot at 12, the original decoding on with other rows, then the snapshot restored and
// decoded: its attention must equal, bit for bit, that of a cache recomputed from scratch.
// Returns the number of differing output elements.
size_t restored_vs_recomputed(bool guarded) {
  const Sequence base(64, 4), other(64, 5);
  auto c = ring_cache(guarded);
  write(*c, base, 12);
  const KVState snap = c->snapshot();
  for (int i = 0; i < 20; ++i) {
    const int64_t L = c->offset();
    c->update_and_fetch(slice(other.k, L, 1, kKVHeads, Device::cpu()), slice(other.v, L, 1, kKVHeads, Device::cpu()));
  }
  auto restored = ring_cache(guarded);
  restored->restore(snap);
  RotatingKVCache fresh(ring_params(kWindow, DType::f16, Device::cpu()));
  write(fresh, base, 12);
  size_t diff = 0;
  for (int i = 0; i < 20; ++i) {
    const std::vector<float> a = step(*restored, base, 1, kWindow, Device::cpu());
    const std::vector<float> b = step(fresh, base, 1, kWindow, Device::cpu());
    for (size_t e = 0; e < a.size(); ++e) diff += std::memcmp(&a[e], &b[e], 4) != 0;
  }
  return diff;
}

TEST(RotatingKVCache, RestoredSnapshotDecodesLikeARecompute) { EXPECT_EQ(restored_vs_recomputed(true), 0u); }

TEST(RotatingKVCache, WithoutTheSoleHolderRuleTheRestoredSnapshotDiverges) {
  EXPECT_GT(restored_vs_recomputed(false), 0u);
}

TEST(RotatingKVCache, ExactWriteCountsOverAScriptedSequence) {
  const Sequence s(64, 6);
  RotatingKVCache c(ring_params(kWindow, DType::f16, Device::cpu()));
  const uint64_t row_bytes = 2 * uint64_t(kKVHeads * kDim) * 2;  // keys and values, f16
  auto expect = [&](uint64_t copying, uint64_t inplace, uint64_t bytes, const char* when) {
    EXPECT_EQ(c.counters().n_copying_writes, copying) << when;
    EXPECT_EQ(c.counters().n_inplace_writes, inplace) << when;
    EXPECT_EQ(c.counters().bytes_copied, bytes) << when;
  };
  write(c, s, 5);
  expect(1, 0, 0, "prefill of 5 into an empty cache");
  for (int i = 0; i < 10; ++i) write(c, s, 1);  // positions 5..14: the wrap at 8 stays in place
  expect(1, 10, 0, "decode past the wrap");
  KVState snap = c.snapshot();
  write(c, s, 1);  // row 15 % 8 holds position 7, which the snapshot holds
  expect(2, 10, 7 * row_bytes, "first write with a snapshot held");
  for (int i = 0; i < 3; ++i) write(c, s, 1);
  expect(2, 13, 7 * row_bytes, "decode on the new ring");
  c.restore(snap);
  EXPECT_EQ(c.offset(), 15);
  write(c, s, 1);
  expect(3, 13, 14 * row_bytes, "first write after a restore");
  for (int i = 0; i < 2; ++i) write(c, s, 1);
  expect(3, 15, 14 * row_bytes, "decode after the restore, the snapshot still held");
  write(c, s, 3);
  expect(4, 15, 21 * row_bytes, "a chunk of 3 carries the 7 positions before it");
}

TEST(RotatingKVCache, SnapshotBeforeTheWrapCostsOneCopyAtTheWrap) {
  const Sequence s(64, 7);
  RotatingKVCache c(ring_params(kWindow, DType::f16, Device::cpu()));
  write(c, s, 3);
  const KVState snap = c.snapshot();
  for (int i = 0; i < 5; ++i) write(c, s, 1);  // positions 3..7: rows the snapshot does not read
  EXPECT_EQ(c.counters().n_inplace_writes, 5u);
  EXPECT_EQ(c.counters().n_copying_writes, 1u);
  write(c, s, 1);  // position 8 overwrites row 0, which the snapshot holds
  EXPECT_EQ(c.counters().n_copying_writes, 2u);
  write(c, s, 1);
  EXPECT_EQ(c.counters().n_inplace_writes, 6u);
}

TEST(RotatingKVCache, InPlaceWritesOffAlwaysCopy) {
  const Sequence s(64, 8);
  auto c = ring_cache(true, /*inplace=*/false);
  write(*c, s, 3);
  for (int i = 0; i < 12; ++i) write(*c, s, 1);
  EXPECT_EQ(c->counters().n_inplace_writes, 0u);
  EXPECT_EQ(c->counters().n_copying_writes, 13u);
  EXPECT_FALSE(c->replayable()->next_write_in_place(1));
}

TEST(RotatingKVCache, TrimAfterTheWrapOnlyWhereTheRowsAreHeld) {
  const Sequence s(64, 9);
  RotatingKVCache c(ring_params(kWindow, DType::f16, Device::cpu()));
  write(c, s, 5);
  EXPECT_TRUE(c.can_trim(3));  // before the wrap every row is held
  c.trim(3);
  EXPECT_EQ(c.offset(), 2);
  for (int i = 0; i < 18; ++i) write(c, s, 1);  // to 20
  EXPECT_TRUE(c.can_trim(0));
  EXPECT_TRUE(c.can_trim(1));  // the next query, at 19, sees 12..19: all held
  EXPECT_FALSE(c.can_trim(2));  // at 18 it would see 11, overwritten by 19
  EXPECT_THROW(c.trim(2), InvalidInput);
  EXPECT_EQ(c.offset(), 20);
  EXPECT_TRUE(c.can_trim(20));
  EXPECT_TRUE(c.can_trim(100));
  c.trim(1);
  EXPECT_FALSE(c.can_trim(1));
  c.trim(100);
  EXPECT_EQ(c.offset(), 0);
}

TEST(RotatingKVCache, TrimByOneAfterTheWrapDecodesLikeARecompute) {
  const Sequence s(64, 10), other(64, 11);
  RotatingKVCache c(ring_params(kWindow, DType::f16, Device::cpu()));
  write(c, s, 19);
  {  // position 19 from another sequence, then dropped again
    c.update_and_fetch(slice(other.k, 19, 1, kKVHeads, Device::cpu()), slice(other.v, 19, 1, kKVHeads, Device::cpu()));
  }
  c.rewind_own_write(1);
  RotatingKVCache fresh(ring_params(kWindow, DType::f16, Device::cpu()));
  write(fresh, s, 19);
  const uint64_t inplace_before = c.counters().n_inplace_writes;
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(step(c, s, 1, kWindow, Device::cpu()), step(fresh, s, 1, kWindow, Device::cpu())) << i;
  EXPECT_EQ(c.counters().n_inplace_writes, inplace_before + 10) << "a rewind keeps the guard armed";
}

TEST(RotatingKVCache, SequenceTrimIsAllOrNothing) {
  const Sequence s(64, 12);
  std::vector<std::unique_ptr<KVCache>> layers;
  KVCacheParams dense = ring_params(0, DType::f16, Device::cpu());
  layers.push_back(make_kv_cache(dense));
  layers.push_back(make_kv_cache(ring_params(kWindow, DType::f16, Device::cpu())));
  ASSERT_NE(dynamic_cast<DenseKVCache*>(layers[0].get()), nullptr);
  SequenceCache seq(std::move(layers));
  for (size_t l = 0; l < 2; ++l) write(seq.layer(l), s, 20);
  EXPECT_TRUE(seq.can_trim(1));
  EXPECT_FALSE(seq.can_trim(5));
  EXPECT_THROW(seq.trim(5), InvalidInput);
  EXPECT_EQ(seq.layer(0).offset(), 20);
  EXPECT_EQ(seq.layer(1).offset(), 20);
  seq.trim(20);
  EXPECT_EQ(seq.offset(), 0);
}

// Views that leave out keys a query sees are refused, not read short.
TEST(RotatingKVCache, AttentionRefusesViewsMissingVisibleKeys) {
  const Sequence s(64, 14);
  RotatingKVCache c(ring_params(kWindow, DType::f16, Device::cpu()));
  write(c, s, 20);
  const Array q1 = slice(s.q, 20, 1, kHeads, Device::cpu());
  KVView ring = c.update_and_fetch(slice(s.k, 20, 1, kKVHeads, Device::cpu()), slice(s.v, 20, 1, kKVHeads, Device::cpu()));
  ops::AttentionParams ap = ring.attention_params();
  ASSERT_TRUE(std::holds_alternative<ops::RingKeys>(ap.keys));
  EXPECT_EQ(std::get<ops::RingKeys>(ap.keys).rows, kWindow);
  ap.window = 0;  // a ring cannot serve full attention
  EXPECT_THROW(ops::attention(q1, ring.keys, ring.values, ap), InvalidInput);
  ap.window = kWindow + 1;
  EXPECT_THROW(ops::attention(q1, ring.keys, ring.values, ap), InvalidInput);
  const Array q3 = slice(s.q, 21, 3, kHeads, Device::cpu());
  KVView lin = c.update_and_fetch(slice(s.k, 21, 3, kKVHeads, Device::cpu()), slice(s.v, 21, 3, kKVHeads, Device::cpu()));
  ops::AttentionParams lp = lin.attention_params();
  ASSERT_TRUE(std::holds_alternative<ops::LinearKeys>(lp.keys));
  EXPECT_EQ(std::get<ops::LinearKeys>(lp.keys).key_pos0, 21 - (kWindow - 1));
  lp.window = kWindow + 1;  // the first query would see position 13, not in the view
  EXPECT_THROW(ops::attention(q3, lin.keys, lin.values, lp), InvalidInput);
  lp.window = kWindow;
  EXPECT_NO_THROW(ops::attention(q3, lin.keys, lin.values, lp));
}

TEST(RotatingKVCache, RejectsStatesThatDoNotFit) {
  RotatingKVCache c(ring_params(kWindow, DType::f16, Device::cpu()));
  RotatingKVCache other(ring_params(kWindow * 2, DType::f16, Device::cpu()));
  const Sequence s(64, 13);
  write(other, s, 3);
  EXPECT_THROW(c.restore(other.snapshot()), InvalidInput);
  RotatingKVCache bf(ring_params(kWindow, DType::bf16, Device::cpu()));
  write(bf, s, 3);
  EXPECT_THROW(c.restore(bf.snapshot()), InvalidInput);
  EXPECT_THROW({ RotatingKVCache bad(ring_params(kWindow, DType::f32, Device::cpu())); }, Unsupported);
  EXPECT_THROW({ RotatingKVCache bad(ring_params(-1, DType::f16, Device::cpu())); }, InvalidInput);
}

}  // namespace
}  // namespace osprey
