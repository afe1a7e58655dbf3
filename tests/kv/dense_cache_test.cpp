#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/buffer.h"
#include "core/half.h"
#include "kv/dense_cache.h"

namespace osprey {
namespace {

constexpr int64_t kHeads = 2, kDim = 4;

KVCacheParams params(int64_t step = 256, bool inplace = true) {
  KVCacheParams p;
  p.n_kv_heads = kHeads;
  p.head_dim = kDim;
  p.step = step;
  p.inplace = inplace;
  return p;
}

// The dense cache without the guard's identity and length rules: every single-row write that
// fits goes in place, whoever else holds the buffers.
class UnguardedKVCache final : public DenseKVCache {
 public:
  using DenseKVCache::DenseKVCache;

 protected:
  bool owns_current_state() const override { return true; }
};

std::unique_ptr<KVCache> make_cache(bool guarded) {
  if (guarded) return std::make_unique<DenseKVCache>(params());
  return std::make_unique<UnguardedKVCache>(params());
}

// n rows [n, heads, dim] whose values encode (position, tag): exact in fp16.
Array rows(int64_t pos0, int64_t n, int tag) {
  Array a = Array::empty({n, kHeads, kDim}, DType::f32);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < kHeads; ++h)
      for (int64_t d = 0; d < kDim; ++d)
        a.data<float>()[(i * kHeads + h) * kDim + d] = float((pos0 + i) % 1000) + 0.25f * float(tag) + 0.0625f * float(h * kDim + d);
  return a;
}

void write(KVCache& c, int64_t n, int tag) {
  Array k = rows(c.offset(), n, tag);
  Array v = rows(c.offset(), n, tag + 1);
  c.update_and_fetch(k, v);
}

// The fp16 bytes of rows [0, n) of a state's keys and values, head by head.
std::vector<uint16_t> rows_of(const KVState& s, int64_t n) {
  std::vector<uint16_t> out;
  for (const Array* a : {&s.keys, &s.values})
    for (int64_t h = 0; h < kHeads; ++h) {
      const uint16_t* p = a->data<uint16_t>() + h * a->strides()[0];
      out.insert(out.end(), p, p + n * kDim);
    }
  return out;
}

// The value at key row `row`, head 0, dim 0, as the cache would serve it now.
float key_at(KVCache& c, int64_t row) {
  KVState s = c.snapshot();
  return f16_to_f32(s.keys.data<uint16_t>()[row * s.keys.strides()[1]]);
}

}  // namespace

TEST(KVCache, OwnSingleTokenWritesGoInPlaceAfterOnePrefillCopy) {
  DenseKVCache c(params());
  write(c, 5, 0);
  EXPECT_EQ(c.counters().n_copying_writes, 1u);
  for (int i = 0; i < 10; ++i) write(c, 1, 0);
  EXPECT_EQ(c.counters().n_copying_writes, 1u);
  EXPECT_EQ(c.counters().n_inplace_writes, 10u);
  EXPECT_EQ(c.offset(), 15);
  for (int64_t r = 0; r < 15; ++r) EXPECT_EQ(key_at(c, r), float(r)) << r;
}

TEST(KVCache, UpdateAndFetchReturnsTheLiveWindow) {
  DenseKVCache c(params());
  write(c, 3, 0);
  KVView view = c.update_and_fetch(rows(3, 1, 0), rows(3, 1, 1));
  const Array &k = view.keys, &v = view.values;
  ASSERT_EQ(k.shape(), (Shape{kHeads, 4, kDim}));
  EXPECT_EQ(view.pos0, 3);
  EXPECT_EQ(view.max_keys, 256);  // one growth step
  EXPECT_FALSE(view.positions.defined());
  EXPECT_EQ(f16_to_f32(k.data<uint16_t>()[3 * kDim]), 3.0f);
  EXPECT_EQ(f16_to_f32(v.data<uint16_t>()[3 * kDim]), 3.25f);
  EXPECT_EQ(f16_to_f32(k.data<uint16_t>()[k.strides()[0]]), 0.0f + 0.0625f * kDim);
}

TEST(KVCache, EachWriteProducesNewArraysOverTheSameBufferInPlace) {
  DenseKVCache c(params());
  write(c, 2, 0);
  KVState before = c.snapshot();
  write(c, 1, 0);
  KVState after = c.snapshot();
  EXPECT_NE(before.keys.id(), after.keys.id());
  EXPECT_EQ(before.keys.buffer(), after.keys.buffer());
}

TEST(KVCache, RestoredSnapshotCostsOneCopyingWrite) {
  DenseKVCache c(params());
  write(c, 8, 0);
  KVState snap = c.snapshot();
  for (int i = 0; i < 3; ++i) write(c, 1, 0);
  c.restore(snap);
  const auto before = c.counters();
  write(c, 1, 5);
  EXPECT_EQ(c.counters().n_copying_writes, before.n_copying_writes + 1);
  write(c, 1, 5);
  write(c, 1, 5);
  EXPECT_EQ(c.counters().n_copying_writes, before.n_copying_writes + 1);
  EXPECT_EQ(c.counters().n_inplace_writes, before.n_inplace_writes + 2);
}

TEST(KVCache, TrimCostsOneCopyingWrite) {
  DenseKVCache c(params());
  write(c, 8, 0);
  write(c, 1, 0);
  c.trim(3);
  EXPECT_EQ(c.offset(), 6);
  const auto before = c.counters();
  write(c, 1, 2);
  EXPECT_EQ(c.counters().n_copying_writes, before.n_copying_writes + 1);
  write(c, 1, 2);
  EXPECT_EQ(c.counters().n_inplace_writes, before.n_inplace_writes + 1);
  EXPECT_EQ(key_at(c, 6), 6.5f);
}

TEST(KVCache, AdoptingForeignArraysCopies) {
  DenseKVCache a(params()), b(params());
  write(a, 4, 0);
  write(a, 1, 0);
  b.restore(a.detach());
  EXPECT_EQ(a.offset(), 0);
  EXPECT_EQ(b.offset(), 5);
  write(b, 1, 0);
  EXPECT_EQ(b.counters().n_copying_writes, 1u);
  EXPECT_EQ(b.counters().n_inplace_writes, 0u);
  write(b, 1, 0);
  EXPECT_EQ(b.counters().n_inplace_writes, 1u);
  EXPECT_EQ(key_at(b, 4), 4.0f);
}

TEST(KVCache, MultiTokenWriteCopies) {
  DenseKVCache c(params());
  write(c, 4, 0);
  write(c, 2, 0);
  EXPECT_EQ(c.counters().n_copying_writes, 2u);
  EXPECT_EQ(c.counters().n_inplace_writes, 0u);
}

TEST(KVCache, GrowthCopiesAndCapacityGrowsInSteps) {
  DenseKVCache c(params(4));
  write(c, 3, 0);
  EXPECT_EQ(c.capacity(), 4);
  write(c, 1, 0);  // fills row 3: in place
  EXPECT_EQ(c.counters().n_inplace_writes, 1u);
  write(c, 1, 0);  // no room: copying write into a grown buffer
  EXPECT_EQ(c.counters().n_copying_writes, 2u);
  EXPECT_EQ(c.capacity(), 8);
  EXPECT_EQ(c.counters().bytes_copied, uint64_t(4 * kHeads * kDim * 2 * 2));
  write(c, 1, 0);
  EXPECT_EQ(c.counters().n_inplace_writes, 2u);
  for (int64_t r = 0; r < 6; ++r) EXPECT_EQ(key_at(c, r), float(r));
}

TEST(KVCache, ReservedRowsAreTakenAtTheFirstGrowthThenGrowthIsInSteps) {
  DenseKVCache c(params(4));
  c.reserve(10);
  write(c, 3, 0);
  EXPECT_EQ(c.capacity(), 12);  // 10 rounded up to the step, not 4
  write(c, 3, 0);               // a chunk that fits: copies, same capacity
  EXPECT_EQ(c.capacity(), 12);
  for (int i = 0; i < 6; ++i) write(c, 1, 0);  // rows 6..11 in place
  EXPECT_EQ(c.counters().n_inplace_writes, 6u);
  EXPECT_EQ(c.counters().n_copying_writes, 2u);
  write(c, 1, 0);  // past the reservation: one step
  EXPECT_EQ(c.capacity(), 16);
  for (int64_t r = 0; r < 13; ++r) EXPECT_EQ(key_at(c, r), float(r));
}

TEST(KVCache, BuffersItGrewOutOfGoBackToTheSystemAtTheNextMiss) {
  // Their size is behind the cache; cached, they would stay reserved for nothing.
  Allocator& alloc = cpu_allocator();
  alloc.trim();
  DenseKVCache c(params(256));
  write(c, 3, 0);
  KVState held = c.snapshot();  // the hint waits for the last holder
  write(c, 300, 0);             // grows from 256 to 512 rows
  EXPECT_EQ(c.capacity(), 512);
  held = KVState();
  const size_t old_bytes = 2 * size_t(256 * kHeads * kDim * 2);
  const size_t before = alloc.stats().reserved_bytes;
  auto miss = alloc.allocate(50048);  // a size nothing here has used
  EXPECT_EQ(alloc.stats().reserved_bytes, before + 50048 - old_bytes);
}

TEST(KVCache, SwitchOffCopiesEveryWrite) {
  DenseKVCache c(params(256, false));
  write(c, 4, 0);
  for (int i = 0; i < 5; ++i) write(c, 1, 0);
  EXPECT_EQ(c.counters().n_inplace_writes, 0u);
  EXPECT_EQ(c.counters().n_copying_writes, 6u);
}

namespace {

// Snapshot at S, 300 more single-token writes (crossing a growth), then a cache restored
// from the snapshot and the original diverge. Also a trim-then-write on the original.
// Returns a description of every corruption seen; empty when the snapshot stayed valid.
std::vector<std::string> run_snapshot_scenario(bool guarded) {
  std::vector<std::string> problems;
  constexpr int64_t S = 20;
  std::unique_ptr<KVCache> cp = make_cache(guarded);
  KVCache& c = *cp;
  write(c, S, 0);
  KVState snap = c.snapshot();
  const std::vector<uint16_t> golden = rows_of(snap, S);

  // The original rewinds into the snapshot's rows and writes there, then continues.
  c.trim(2);
  write(c, 1, 3);
  for (int i = 0; i < 300; ++i) write(c, 1, 1);
  if (rows_of(snap, S) != golden) problems.push_back("snapshot rows changed by the original's writes");

  std::unique_ptr<KVCache> dp = make_cache(guarded), ep = make_cache(guarded);
  KVCache &d = *dp, &e = *ep;
  d.restore(snap);
  e.restore(snap);
  for (int i = 0; i < 5; ++i) {
    write(d, 1, 2);
    write(e, 1, 3);
  }
  if (rows_of(snap, S) != golden) problems.push_back("snapshot rows changed by restored caches");
  if (key_at(d, S) != float(S) + 0.5f) problems.push_back("restored cache d lost its own row");
  if (key_at(e, S) != float(S) + 0.75f) problems.push_back("restored cache e lost its own row");
  if (key_at(c, S - 2) != float(S - 2) + 0.75f) problems.push_back("original lost its rewritten row");
  if (key_at(c, S + 100) != float(S + 100) + 0.25f) problems.push_back("original lost a later row");
  return problems;
}

}  // namespace

TEST(KVCache, SharedSnapshotSurvivesContinuedInPlaceWrites) {
  auto problems = run_snapshot_scenario(true);
  EXPECT_TRUE(problems.empty()) << problems.front();
}

TEST(KVCache, SnapshotTestDetectsCorruptionWithoutTheGuard) {
  // Proof that the test above bites: without the identity and length rules, in-place writes
  // land in rows that a snapshot and other caches consider valid.
  auto problems = run_snapshot_scenario(false);
  EXPECT_FALSE(problems.empty());
}

}  // namespace osprey
