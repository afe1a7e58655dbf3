// The KV cache types (--cache-type-k, --cache-type-v) through the caches: keys and values keep
// their own types; the in-place arm and the copying arm (OSPREY_KV_INPLACE_WRITE=0) store the same
// bytes for every type; a snapshot keeps its rows while the cache writes on in place; a state of
// another type is refused; the paged pool's copy-on-write keeps the type; fixed fp8 scales (a
// checkpoint's k_scale / v_scale) store each row as the scale and the codes of x / scale, in
// both arms and the pool, and bad ones are refused; the names are parsed and CUDA refuses what
// it cannot store, by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#include "formats/hub_quant.h"
#include "kv/dense_cache.h"
#include "kv/paged_pool.h"
#include "kv/paged_pools.h"
#include "kv/rotating_cache.h"

namespace osprey {
namespace {

constexpr int64_t kHeads = 2, kDim = 64;

struct Types {
  DType k, v;
};
// Both packed formats, each with a 16-bit partner, and the two 16-bit types mixed.
constexpr Types kPairs[] = {{DType::q8_0, DType::q8_0},     {DType::fp8_e4m3, DType::fp8_e4m3},
                            {DType::q8_0, DType::f16},      {DType::bf16, DType::fp8_e4m3},
                            {DType::f16, DType::bf16},      {DType::fp8_e4m3, DType::q8_0}};

std::string label(const Types& t) { return std::string(dtype_name(t.k)) + "/" + dtype_name(t.v); }

KVCacheParams params(const Types& t, bool inplace, int64_t window = 0) {
  KVCacheParams p;
  p.n_kv_heads = kHeads;
  p.head_dim = kDim;
  p.step = 8;
  p.inplace = inplace;
  p.k_type = t.k;
  p.v_type = t.v;
  p.window = window;
  return p;
}

Array rows(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  Array a = Array::empty({n, kHeads, kDim}, DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = u(rng);
  return a;
}

// The bytes of rows [r0, r0 + n) of every head of a [heads, cap, width] array.
std::vector<uint8_t> bytes_of(const Array& a, int64_t r0, int64_t n) {
  std::vector<uint8_t> out;
  const size_t row = size_t(a.dim(2)) * a.itemsize();
  for (int64_t h = 0; h < a.dim(0); ++h) {
    const uint8_t* p = static_cast<const uint8_t*>(a.raw()) + size_t(h * a.strides()[0]) * a.itemsize() + size_t(r0) * row;
    out.insert(out.end(), p, p + size_t(n) * row);
  }
  return out;
}

// Prefill chunks and single-row decode steps, the same rows in both arms.
void script(KVCache& c, uint32_t seed, int64_t n_steps) {
  std::mt19937 rng(seed);
  c.update_and_fetch(rows(5, rng), rows(5, rng));
  for (int64_t i = 0; i < n_steps; ++i) c.update_and_fetch(rows(1, rng), rows(1, rng));
  c.update_and_fetch(rows(3, rng), rows(3, rng));
  for (int64_t i = 0; i < 4; ++i) c.update_and_fetch(rows(1, rng), rows(1, rng));
}

// The script on both arms (in-place writes on, then off); their snapshots.
std::pair<KVState, KVState> script_both(KVCache& on, KVCache& off, uint32_t seed, int64_t n_steps) {
  script(on, seed, n_steps);
  script(off, seed, n_steps);
  return {on.snapshot(), off.snapshot()};
}

// The first n rows of a and b hold the same key and value bytes.
void expect_same_rows(const KVState& a, const KVState& b, int64_t n, const Types& t) {
  EXPECT_EQ(bytes_of(a.keys, 0, n), bytes_of(b.keys, 0, n)) << label(t);
  EXPECT_EQ(bytes_of(a.values, 0, n), bytes_of(b.values, 0, n)) << label(t);
}

}  // namespace

TEST(KVCacheTypes, DenseArmsStoreTheSameBytesForEveryType) {
  for (const Types& t : kPairs) {
    DenseKVCache on(params(t, true)), off(params(t, false));
    const auto [a, b] = script_both(on, off, 11, 30);
    ASSERT_EQ(a.offset, 42);
    ASSERT_EQ(b.offset, 42);
    EXPECT_EQ(a.keys.dtype(), t.k) << label(t);
    EXPECT_EQ(a.values.dtype(), t.v) << label(t);
    EXPECT_EQ(a.keys.dim(2), packed_row_width(t.k, kDim)) << label(t);
    expect_same_rows(a, b, 42, t);
    // 34 single rows, of which 5 grow the buffers (step 8: at rows 8, 16, 24, 32, 40).
    EXPECT_EQ(on.counters().n_inplace_writes, 29u) << label(t);
    EXPECT_EQ(off.counters().n_inplace_writes, 0u) << label(t);
  }
}

TEST(KVCacheTypes, RotatingArmsStoreTheSameBytesForEveryType) {
  for (const Types& t : kPairs) {
    RotatingKVCache on(params(t, true, 8)), off(params(t, false, 8));
    const auto [a, b] = script_both(on, off, 12, 21);  // past two wraps of the ring of 8
    EXPECT_EQ(a.keys.dtype(), t.k) << label(t);
    expect_same_rows(a, b, 8, t);
    EXPECT_GT(on.counters().n_inplace_writes, 0u) << label(t);
    EXPECT_EQ(off.counters().n_inplace_writes, 0u) << label(t);
  }
}

TEST(KVCacheTypes, ASnapshotKeepsItsRowsWhileTheCacheWritesOnInPlace) {
  for (const Types& t : kPairs) {
    DenseKVCache c(params(t, true));
    std::mt19937 rng(5);
    c.update_and_fetch(rows(4, rng), rows(4, rng));
    for (int i = 0; i < 8; ++i) c.update_and_fetch(rows(1, rng), rows(1, rng));
    const KVState s = c.snapshot();
    const std::vector<uint8_t> k0 = bytes_of(s.keys, 0, 12), v0 = bytes_of(s.values, 0, 12);
    const uint64_t inplace0 = c.counters().n_inplace_writes;
    // Past a growth (step 8), then a trim and rewrite of the snapshot's rows.
    for (int i = 0; i < 20; ++i) c.update_and_fetch(rows(1, rng), rows(1, rng));
    c.trim(25);
    for (int i = 0; i < 6; ++i) c.update_and_fetch(rows(1, rng), rows(1, rng));
    EXPECT_GT(c.counters().n_inplace_writes, inplace0 + 10) << label(t);
    EXPECT_EQ(bytes_of(s.keys, 0, 12), k0) << label(t);
    EXPECT_EQ(bytes_of(s.values, 0, 12), v0) << label(t);
    // Restored into a cache of the same types, it reads back its rows.
    DenseKVCache r(params(t, true));
    r.restore(s);
    EXPECT_EQ(bytes_of(r.snapshot().keys, 0, 12), k0) << label(t);
  }
}

TEST(KVCacheTypes, AStateOfAnotherTypeIsRefused) {
  DenseKVCache q(params({DType::q8_0, DType::q8_0}, true));
  std::mt19937 rng(6);
  q.update_and_fetch(rows(3, rng), rows(3, rng));
  DenseKVCache f16(params({DType::f16, DType::f16}, true)), mixed(params({DType::q8_0, DType::f16}, true));
  EXPECT_THROW(f16.restore(q.snapshot()), InvalidInput);
  EXPECT_THROW(mixed.restore(q.snapshot()), InvalidInput);
  RotatingKVCache ring(params({DType::fp8_e4m3, DType::fp8_e4m3}, true, 4));
  EXPECT_THROW(ring.restore(q.snapshot()), InvalidInput);
}

TEST(KVCacheTypes, ThePagedPoolKeepsTheTypeThroughCopyOnWrite) {
  PagedPoolParams pp;
  pp.layers = {params({DType::q8_0, DType::fp8_e4m3}, true), params({DType::fp8_e4m3, DType::bf16}, true)};
  pp.block_size = 4;
  pp.n_blocks = 8;
  PagedPool pool(pp);
  ASSERT_EQ(pool.keys(0).dtype(), DType::q8_0);
  ASSERT_EQ(pool.values(0).dtype(), DType::fp8_e4m3);
  ASSERT_EQ(pool.values(1).dtype(), DType::bf16);
  EXPECT_EQ(pool.keys(0).dim(3), packed_row_width(DType::q8_0, kDim));
  EXPECT_EQ(paged_block_bytes(pp), int64_t(pp.layers[0].row_bytes(4) + pp.layers[1].row_bytes(4)));
  std::mt19937 rng(8);
  auto write = [&](PagedPool::SeqId s, int64_t n) {
    ASSERT_TRUE(pool.reserve(s, n));
    Array slots = Array::empty({n}, DType::i32);
    pool.slots(s, pool.length(s), n, slots.data<int32_t>());
    for (size_t l = 0; l < pool.n_layers(); ++l) ops::write_kv_paged(pool.keys(l), pool.values(l), rows(n, rng), rows(n, rng), slots);
    pool.commit(s, n);
  };
  // A partial block shared by a fork, then written by both: the fork's write copies it.
  const PagedPool::SeqId a = pool.create();
  write(a, 6);
  const int32_t shared = pool.block_table(a)[1];
  auto block_bytes = [&](int32_t b) {
    std::vector<uint8_t> out;
    for (size_t l = 0; l < pool.n_layers(); ++l)
      for (const Array* x : {&pool.keys(l), &pool.values(l)}) {
        const size_t n = size_t(x->numel() / x->dim(0)) * x->itemsize();
        const uint8_t* p = static_cast<const uint8_t*>(x->raw()) + size_t(b) * n;
        out.insert(out.end(), p, p + n);
      }
    return out;
  };
  const std::vector<uint8_t> before = block_bytes(shared);
  const PagedPool::SeqId b = pool.fork(a);
  write(b, 1);
  EXPECT_EQ(pool.stats().n_cow, 1u);
  const int32_t copy = pool.block_table(b)[1];
  ASSERT_NE(copy, shared);
  // The original block is untouched; the copy holds its two committed rows byte for byte.
  EXPECT_EQ(block_bytes(shared), before);
  const std::vector<uint8_t> after = block_bytes(copy);
  size_t row_off = 0;
  for (size_t l = 0; l < pool.n_layers(); ++l)
    for (const Array* x : {&pool.keys(l), &pool.values(l)}) {
      const size_t row = size_t(x->dim(3)) * x->itemsize(), n = size_t(x->numel() / x->dim(0)) * x->itemsize();
      for (int64_t h = 0; h < kHeads; ++h) {
        const size_t at = row_off + size_t(h) * 4 * row;
        EXPECT_TRUE(std::equal(before.begin() + long(at), before.begin() + long(at + 2 * row), after.begin() + long(at)))
            << "layer " << l << " head " << h;
      }
      row_off += n;
    }
}

namespace {

// Fixed scales: per head for the keys (the first small enough that |x| <= 3 saturates some
// codes at 448), one for every head for the values.
const std::vector<float> kKeyScales = {0.004f, 0.0123f}, kValueScales = {0.02f};

KVCacheParams fixed_params(bool inplace, int64_t window = 0) {
  KVCacheParams p = params({DType::fp8_e4m3, DType::fp8_e4m3}, inplace, window);
  p.k_scales = kKeyScales;
  p.v_scales = kValueScales;
  return p;
}

// Row r of head h of a [heads, cap, width] array of bytes.
const uint8_t* row_at(const Array& a, int64_t h, int64_t r) {
  return static_cast<const uint8_t*>(a.raw()) + size_t(h * a.strides()[0] + r * a.strides()[1]);
}

// The fp8 row of x with the fixed scale s: s as float32, then e4m3(x / s) by formats/hub_quant's
// nearest-code table search (saturating), computed independently of the KV writer.
std::vector<uint8_t> ref_fixed_fp8(const float* x, int64_t n, float s) {
  std::vector<uint8_t> out(4);
  std::memcpy(out.data(), &s, 4);
  for (int64_t i = 0; i < n; ++i) out.push_back(float_to_e4m3(double(x[i] / s)));
  return out;
}

void expect_fixed_row(const uint8_t* got, const float* x, float s, const std::string& where) {
  const std::vector<uint8_t> want = ref_fixed_fp8(x, kDim, s);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), got)) << where;
}

// A prefill of 5 rows and 30 single-row steps on cache c; the rows written, [35][kHeads][kDim]
// keys then values.
std::pair<std::vector<float>, std::vector<float>> fixed_script(KVCache& c) {
  std::mt19937 rng(21);
  std::vector<float> ks, vs;
  auto step = [&](int64_t n) {
    const Array k = rows(n, rng), v = rows(n, rng);
    ks.insert(ks.end(), k.data<float>(), k.data<float>() + k.numel());
    vs.insert(vs.end(), v.data<float>(), v.data<float>() + v.numel());
    c.update_and_fetch(k, v);
  };
  step(5);
  for (int i = 0; i < 30; ++i) step(1);
  return {ks, vs};
}

}  // namespace

TEST(KVCacheTypes, FixedFp8ScalesStoreEachRowAsTheCodesOfXOverTheScaleInBothArms) {
  int saturated = 0;
  for (int64_t window : {int64_t(0), int64_t(8)}) {
    std::unique_ptr<KVCache> on, off;
    if (window) {
      on = std::make_unique<RotatingKVCache>(fixed_params(true, window));
      off = std::make_unique<RotatingKVCache>(fixed_params(false, window));
    } else {
      on = std::make_unique<DenseKVCache>(fixed_params(true));
      off = std::make_unique<DenseKVCache>(fixed_params(false));
    }
    const auto [ks, vs] = fixed_script(*on);
    fixed_script(*off);
    EXPECT_GT(on->counters().n_inplace_writes, 0u);
    EXPECT_EQ(off->counters().n_inplace_writes, 0u);
    const KVState a = on->snapshot(), b = off->snapshot();
    const int64_t first = window ? 35 - window : 0;
    for (const KVState* st : {&a, &b})
      for (int64_t p = first; p < 35; ++p)
        for (int64_t h = 0; h < kHeads; ++h) {
          const int64_t r = window ? p % window : p;
          const std::string where = std::string(st == &a ? "in place" : "copying") + ", window " +
                                    std::to_string(window) + ", position " + std::to_string(p) + ", head " +
                                    std::to_string(h);
          const float* k = ks.data() + (p * kHeads + h) * kDim;
          expect_fixed_row(row_at(st->keys, h, r), k, kKeyScales[size_t(h)], "keys, " + where);
          expect_fixed_row(row_at(st->values, h, r), vs.data() + (p * kHeads + h) * kDim, kValueScales[0],
                           "values, " + where);
          for (int64_t d = 0; d < kDim; ++d) saturated += std::fabs(k[d] / kKeyScales[size_t(h)]) > 464.0f;
        }
  }
  EXPECT_GT(saturated, 0) << "no key saturated: the saturating case is not covered";
}

TEST(KVCacheTypes, FixedFp8ScalesReachThePagedPoolsWrites) {
  PagedPoolsParams pp;
  pp.layers = {fixed_params(true)};
  pp.block_size = 4;
  pp.n_blocks = {4};
  PagedPools pools(pp);
  ASSERT_EQ(pools.layer_params(0).k_scales, kKeyScales);
  ASSERT_EQ(pools.layer_params(0).v_scales, kValueScales);
  std::mt19937 rng(5);
  const Array k = rows(3, rng), v = rows(3, rng);
  Array slots = Array::empty({3}, DType::i32);
  const int32_t at[] = {9, 2, 14};  // blocks 2, 0, 3
  std::copy(at, at + 3, slots.data<int32_t>());
  ops::write_kv_paged(pools.keys(0), pools.values(0), k, v, slots, pools.layer_params(0).row_scales());
  const Array& keys = pools.keys(0);
  const Array& values = pools.values(0);
  const int64_t width = keys.dim(3);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t h = 0; h < kHeads; ++h) {
      const int64_t row = ((at[i] / 4) * kHeads + h) * 4 + at[i] % 4;
      const std::string where = "row " + std::to_string(i) + ", head " + std::to_string(h);
      expect_fixed_row(static_cast<const uint8_t*>(keys.raw()) + row * width, k.data<float>() + (i * kHeads + h) * kDim,
                       kKeyScales[size_t(h)], "keys, " + where);
      expect_fixed_row(static_cast<const uint8_t*>(values.raw()) + row * width,
                       v.data<float>() + (i * kHeads + h) * kDim, kValueScales[0], "values, " + where);
    }
}

TEST(KVCacheTypes, BadFixedScalesAreRefusedByName) {
  std::mt19937 rng(6);
  const Array k = rows(1, rng), v = rows(1, rng);
  auto refused = [&](DType kt, std::vector<float> ks, const std::string& needle) {
    Array keys = Array::zeros({kHeads, 4, packed_row_width(kt, kDim)}, kt);
    Array values = Array::zeros({kHeads, 4, packed_row_width(DType::fp8_e4m3, kDim)}, DType::fp8_e4m3);
    try {
      ops::write_kv_rows(keys, values, k, v, 0, {}, 0, {ks, {}});
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused(DType::q8_0, {0.5f}, "fixed keys scales apply to fp8_e4m3 rows");
  refused(DType::f16, {0.5f}, "fixed keys scales apply to fp8_e4m3 rows");
  refused(DType::fp8_e4m3, {0.5f, 0.5f, 0.5f}, "3 fixed keys scales for 2 kv heads");
  refused(DType::fp8_e4m3, {0.5f, 0.0f}, "a fixed keys scale is 0");
  refused(DType::fp8_e4m3, {-1.0f}, "a fixed keys scale is -1");
}

TEST(KVCacheTypes, NamesParseAndUnknownOnesAreRefusedListingTheAccepted) {
  EXPECT_EQ(parse_kv_cache_type("f16", "--cache-type-k"), DType::f16);
  EXPECT_EQ(parse_kv_cache_type("bf16", "--cache-type-k"), DType::bf16);
  EXPECT_EQ(parse_kv_cache_type("q8_0", "--cache-type-v"), DType::q8_0);
  EXPECT_EQ(parse_kv_cache_type("fp8", "--cache-type-v"), DType::fp8_e4m3);
  EXPECT_STREQ(kv_cache_type_name(DType::fp8_e4m3), "fp8");
  try {
    parse_kv_cache_type("q4_0", "--cache-type-v");
    FAIL() << "q4_0 parsed";
  } catch (const InvalidInput& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--cache-type-v"), std::string::npos) << m;
    EXPECT_NE(m.find("'q4_0'"), std::string::npos) << m;
    EXPECT_NE(m.find("f16, bf16, q8_0, fp8"), std::string::npos) << m;
  }
}

TEST(KVCacheTypes, CudaRefusesWhatItCannotStoreByName) {
  auto message = [](const KVCacheParams& p) {
    try {
      check_kv_cache_types(p);
    } catch (const Unsupported& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  KVCacheParams p = params({DType::q8_0, DType::f16}, true);
  p.device = Device::cuda(0);
  EXPECT_EQ(message(p), "--cache-type-k q8_0 is not supported on cuda yet");
  p.k_type = DType::f16;
  p.v_type = DType::fp8_e4m3;
  EXPECT_EQ(message(p), "--cache-type-v fp8 is not supported on cuda yet");
  p.v_type = DType::bf16;
  EXPECT_NE(message(p).find("--cache-type-k f16 with --cache-type-v bf16"), std::string::npos) << message(p);
  p.v_type = DType::f16;
  EXPECT_EQ(message(p), "");
  // The CPU takes every pair; q8_0 needs head_dim % 32 == 0.
  KVCacheParams c = params({DType::q8_0, DType::bf16}, true);
  EXPECT_EQ(message(c), "");
  c.head_dim = 48;
  EXPECT_NE(message(c).find("head_dim"), std::string::npos);
  EXPECT_THROW(DenseKVCache{c}, Unsupported);
}

}  // namespace osprey
