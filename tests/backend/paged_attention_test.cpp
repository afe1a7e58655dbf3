// The paged KV ops on every device:
// ops::attention over a paged pool against a double-precision loop written here, its batch
// invariance (each sequence's row bit for bit the same alone and in a batch), its agreement
// with the dense op on the gathered blocks, and the write_kv_paged / gather_kv_blocks round trip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#include "core/half.h"
#include "support/device_test.h"
#include "support/numeric.h"

namespace osprey {
namespace {

ops::PagedKeys& paged(ops::AttentionParams& p) { return std::get<ops::PagedKeys>(p.keys); }

using testing::rel_error;

using testing::bf16_nearest_even;

double bits_to_double(uint16_t b, bool bf16) { return bf16 ? double(bf16_to_f32(b)) : double(f16_to_f32(b)); }

struct PagedCase {
  int64_t n_kv_heads = 2, group = 1, head_dim = 64, block_size = 16;
  bool bf16 = false;
  int window = 0;
  float softcap = 0.0f;
  float scale = 0.0f;  // 0: 1 / sqrt(head_dim)
  std::vector<int64_t> lens;
  int64_t extra_blocks = 3;  // pool blocks no sequence owns
  int64_t table_pad = 2;     // table columns past the longest sequence's blocks
  int64_t q_row_pad = 0;     // elements between query rows past n_heads * head_dim

  int64_t n_heads() const { return n_kv_heads * group; }
  float used_scale() const { return scale > 0.0f ? scale : 1.0f / std::sqrt(float(head_dim)); }
  std::string str() const {
    std::string s = "kv=" + std::to_string(n_kv_heads) + " group=" + std::to_string(group) + " head_dim=" +
                    std::to_string(head_dim) + " block=" + std::to_string(block_size) + (bf16 ? " bf16" : " f16") +
                    " window=" + std::to_string(window) + " softcap=" + std::to_string(softcap) + " lens=";
    for (int64_t l : lens) s += std::to_string(l) + ",";
    return s;
  }
};

// Host data of one case: a pool whose unused rows are NaN (a kernel that reads past a sequence's
// keys, or a block no table names, fails), shuffled block tables, random queries.
struct PagedData {
  int64_t n_blocks = 0, max_blocks = 0;
  std::vector<uint16_t> k, v;          // [n_blocks, n_kv_heads, block_size, head_dim] bits
  std::vector<int32_t> tables;         // [n, max_blocks], -1 past each sequence's blocks
  std::vector<int32_t> lens;           // [n]
  std::vector<float> q;                // [n, n_heads * head_dim + q_row_pad]
};

PagedData make_data(const PagedCase& c, std::mt19937& rng) {
  PagedData d;
  const int64_t n = int64_t(c.lens.size()), bs = c.block_size, D = c.head_dim, hk = c.n_kv_heads;
  int64_t used = 0, longest = 0;
  for (int64_t l : c.lens) used += (l + bs - 1) / bs, longest = std::max(longest, (l + bs - 1) / bs);
  d.n_blocks = used + c.extra_blocks;
  d.max_blocks = std::max<int64_t>(1, longest + c.table_pad);
  const uint16_t nan_bits = c.bf16 ? 0x7fc0 : 0x7e00;
  d.k.assign(size_t(d.n_blocks * hk * bs * D), nan_bits);
  d.v = d.k;
  std::vector<int32_t> ids(size_t(d.n_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  d.tables.assign(size_t(n * d.max_blocks), -1);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  auto round = [&](float x) { return c.bf16 ? bf16_nearest_even(x) : f32_to_f16(x); };
  size_t next = 0;
  for (int64_t i = 0; i < n; ++i) {
    d.lens.push_back(int32_t(c.lens[size_t(i)]));
    for (int64_t b = 0; b * bs < c.lens[size_t(i)]; ++b) d.tables[size_t(i * d.max_blocks + b)] = ids[next++];
    for (int64_t j = 0; j < c.lens[size_t(i)]; ++j) {
      const int64_t blk = d.tables[size_t(i * d.max_blocks + j / bs)];
      for (int64_t h = 0; h < hk; ++h)
        for (int64_t e = 0; e < D; ++e) {
          const size_t at = size_t(((blk * hk + h) * bs + j % bs) * D + e);
          d.k[at] = round(uni(rng));
          d.v[at] = round(uni(rng));
        }
    }
  }
  const int64_t row = c.n_heads() * D + c.q_row_pad;
  d.q.resize(size_t(n * row));
  for (auto& x : d.q) x = uni(rng);
  return d;
}

// [n, n_heads * head_dim] in double, from the definition.
std::vector<double> reference(const PagedCase& c, const PagedData& d) {
  const int64_t n = int64_t(c.lens.size()), bs = c.block_size, D = c.head_dim, H = c.n_heads();
  const int64_t row = H * D + c.q_row_pad;
  std::vector<double> out(size_t(n * H * D), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = c.lens[size_t(i)], p = len - 1;
    const int64_t lo = c.window > 0 ? std::max<int64_t>(0, p - c.window + 1) : 0;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kvh = h / c.group;
      std::vector<double> s;
      double mx = -INFINITY;
      for (int64_t j = lo; j <= p; ++j) {
        const int64_t blk = d.tables[size_t(i * d.max_blocks + j / bs)];
        const size_t at = size_t(((blk * c.n_kv_heads + kvh) * bs + j % bs) * D);
        double dot = 0.0;
        for (int64_t e = 0; e < D; ++e) dot += double(d.q[size_t(i * row + h * D + e)]) * bits_to_double(d.k[at + e], c.bf16);
        dot *= double(c.used_scale());
        if (c.softcap > 0.0f) dot = c.softcap * std::tanh(dot / c.softcap);
        s.push_back(dot);
        mx = std::max(mx, dot);
      }
      double sum = 0.0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int64_t j = lo; j <= p; ++j) {
        const int64_t blk = d.tables[size_t(i * d.max_blocks + j / bs)];
        const size_t at = size_t(((blk * c.n_kv_heads + kvh) * bs + j % bs) * D);
        const double w = s[size_t(j - lo)] / sum;
        for (int64_t e = 0; e < D; ++e) out[size_t((i * H + h) * D + e)] += w * bits_to_double(d.v[at + e], c.bf16);
      }
    }
  }
  return out;
}

class PagedDevice : public testing::DeviceTest {
 protected:
  // Tolerance on ||out - ref|| / ||ref||: the CPU accumulates f32 products of the f32 query;
  // CUDA rounds q and the softmax weights to the pool's type for the tensor cores.
  double tol(bool bf16) const { return on_cuda() ? (bf16 ? 1e-2 : 1e-3) : 1e-4; }

  // The device arrays of a case.
  struct Dev {
    Array q, k, v, tables, lens;
  };
  Dev upload_case(const PagedCase& c, const PagedData& d) const {
    const int64_t n = int64_t(c.lens.size()), H = c.n_heads(), D = c.head_dim;
    const DType dt = c.bf16 ? DType::bf16 : DType::f16;
    const Shape pool{d.n_blocks, c.n_kv_heads, c.block_size, D};
    Dev x;
    Array q_rows = upload(d.q, {n, H * D + c.q_row_pad}, DType::f32);
    // q [n, n_heads, head_dim] as a view of rows of H * D + q_row_pad elements.
    x.q = Array::strided(q_rows.buffer(), q_rows.byte_offset(), {n, H, D}, {H * D + c.q_row_pad, D, 1}, DType::f32);
    x.k = upload(d.k, pool, dt);
    x.v = upload(d.v, pool, dt);
    x.tables = upload(d.tables, {n, d.max_blocks}, DType::i32);
    x.lens = upload(d.lens, {n}, DType::i32);
    return x;
  }
  static ops::AttentionParams params(const PagedCase& c, const Dev& x) {
    ops::AttentionParams p;
    p.scale = c.used_scale();
    p.window = c.window;
    p.softcap = c.softcap;
    p.keys = ops::PagedKeys{x.tables, x.lens};
    return p;
  }
  std::vector<float> run(const PagedCase& c, const PagedData& d) const {
    const Dev x = upload_case(c, d);
    Array out = ops::attention(x.q, x.k, x.v, params(c, x));
    EXPECT_EQ(out.shape(), Shape({int64_t(c.lens.size()), c.n_heads() * c.head_dim}));
    return download<float>(out);
  }
  double error(const PagedCase& c, uint32_t seed) const {
    std::mt19937 rng(seed);
    const PagedData d = make_data(c, rng);
    return rel_error(run(c, d), reference(c, d));
  }
};

class PagedAttention : public PagedDevice {};
class PagedKV : public PagedDevice {};

// Lengths across one, two and three splits of 512 keys, and block boundaries.
const std::vector<int64_t> kLens = {1, 16, 33, 300, 512, 513, 700};

TEST_P(PagedAttention, MatchesDoublePrecisionReference) {
  uint32_t seed = 1;
  for (int64_t bs : {16, 32})
    for (int64_t hd : {64, 128, 256})
      for (int64_t group : {1, 4})
        for (bool bf16 : {false, true}) {
          const PagedCase c{.group = group, .head_dim = hd, .block_size = bs, .bf16 = bf16, .lens = kLens};
          EXPECT_LT(error(c, seed++), tol(bf16)) << c.str();
        }
}

TEST_P(PagedAttention, SlidingWindowAndSoftcap) {
  uint32_t seed = 100;
  for (int window : {1, 20, 100, 600})
    for (float softcap : {0.0f, 5.0f})
      for (bool bf16 : {false, true}) {
        PagedCase c;
        c.head_dim = 128;
        c.group = 4;
        c.bf16 = bf16;
        c.window = window;
        c.softcap = softcap;
        c.scale = softcap > 0.0f ? 1.0f : 0.0f;  // logits past the cap
        c.lens = kLens;
        EXPECT_LT(error(c, seed++), tol(bf16)) << c.str();
      }
}

// Block sizes that do not divide the split, head_dim 32, a GQA ratio past one tile of 8 heads,
// and query rows at a stride.
TEST_P(PagedAttention, OddShapes) {
  uint32_t seed = 200;
  struct Shape_ {
    int64_t bs, hd, group, n_kv, q_row_pad;
  };
  for (const Shape_ s : {Shape_{7, 64, 2, 2, 0}, Shape_{48, 128, 1, 1, 0}, Shape_{16, 32, 4, 2, 0},
                         Shape_{32, 64, 12, 1, 0}, Shape_{16, 128, 4, 2, 64}})
    for (bool bf16 : {false, true}) {
      const PagedCase c{.n_kv_heads = s.n_kv, .group = s.group, .head_dim = s.hd, .block_size = s.bs, .bf16 = bf16,
                        .lens = {1, 7, 300, 1100}, .q_row_pad = s.q_row_pad};
      EXPECT_LT(error(c, seed++), tol(bf16)) << c.str() << " q_row_pad=" << s.q_row_pad;
    }
}

// Each sequence of a batch of 17 gives the same bits as when it runs alone (n = 1, a table of
// just its own blocks), though the batch's table is wider and its neighbours differ in length.
TEST_P(PagedAttention, EachRowIsBitwiseTheSameAloneAndInABatch) {
  std::mt19937 len_rng(7);
  std::uniform_int_distribution<int64_t> len_dist(1, 1300);
  for (int variant = 0; variant < 3; ++variant) {
    PagedCase c;
    c.head_dim = variant == 2 ? 64 : 128;
    c.group = variant == 2 ? 1 : 4;
    c.bf16 = variant == 1;
    c.block_size = variant == 2 ? 32 : 16;
    if (variant == 1) c.window = 300, c.softcap = 30.0f;
    for (int i = 0; i < 17; ++i) c.lens.push_back(i == 0 ? 1 : len_dist(len_rng));
    std::mt19937 rng(300 + variant);
    const PagedData d = make_data(c, rng);
    const std::vector<float> batch = run(c, d);
    const int64_t n = int64_t(c.lens.size()), H = c.n_heads(), D = c.head_dim;
    const int64_t row = H * D + c.q_row_pad;
    const Dev x = upload_case(c, d);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t own_blocks = (c.lens[size_t(i)] + c.block_size - 1) / c.block_size;
      std::vector<int32_t> table(d.tables.begin() + i * d.max_blocks, d.tables.begin() + i * d.max_blocks + own_blocks);
      std::vector<float> q(d.q.begin() + i * row, d.q.begin() + i * row + H * D);
      Dev one = x;
      one.q = upload(q, {1, H, D}, DType::f32);
      one.tables = upload(table, {1, own_blocks}, DType::i32);
      one.lens = upload(std::vector<int32_t>{int32_t(c.lens[size_t(i)])}, {1}, DType::i32);
      const std::vector<float> alone = download<float>(ops::attention(one.q, one.k, one.v, params(c, one)));
      ASSERT_EQ(alone.size(), size_t(H * D));
      EXPECT_EQ(std::memcmp(alone.data(), batch.data() + i * H * D, alone.size() * 4), 0)
          << "sequence " << i << " of length " << c.lens[size_t(i)] << ", " << c.str();
    }
  }
}

// The paged op equals the dense op (q_pos0 = len - 1) over the sequence's gathered blocks.
TEST_P(PagedAttention, EqualsDenseAttentionOnGatheredBlocks) {
  uint32_t seed = 400;
  for (bool bf16 : {false, true})
    for (int window : {0, 64}) {
      PagedCase c;
      c.head_dim = 128;
      c.group = 4;
      c.bf16 = bf16;
      c.window = window;
      c.softcap = window > 0 ? 20.0f : 0.0f;
      c.lens = {1, 100, 513, 1030};
      std::mt19937 rng(seed++);
      const PagedData d = make_data(c, rng);
      const std::vector<float> paged = run(c, d);
      const Dev x = upload_case(c, d);
      const int64_t H = c.n_heads(), D = c.head_dim;
      for (size_t i = 0; i < c.lens.size(); ++i) {
        const int64_t len = c.lens[i];
        std::vector<int32_t> ids(d.tables.begin() + int64_t(i) * d.max_blocks,
                                 d.tables.begin() + int64_t(i + 1) * d.max_blocks);
        Array ids_dev = upload(ids, {d.max_blocks}, DType::i32);
        Array kd = ops::gather_kv_blocks(x.k, ids_dev, len), vd = ops::gather_kv_blocks(x.v, ids_dev, len);
        ASSERT_EQ(kd.shape(), Shape({c.n_kv_heads, len, D}));
        std::vector<float> q(d.q.begin() + int64_t(i) * H * D, d.q.begin() + int64_t(i + 1) * H * D);
        ops::AttentionParams p;
        p.q_pos0 = len - 1;
        p.scale = c.used_scale();
        p.window = c.window;
        p.softcap = c.softcap;
        const std::vector<float> dense = download<float>(ops::attention(upload(q, {1, H, D}, DType::f32), kd, vd, p));
        std::vector<double> ref(dense.begin(), dense.end());
        std::vector<float> got(paged.begin() + int64_t(i) * H * D, paged.begin() + int64_t(i + 1) * H * D);
        EXPECT_LT(rel_error(got, ref), tol(bf16)) << "sequence " << i << ", " << c.str();
      }
    }
}

TEST_P(PagedAttention, RejectsBadArguments) {
  PagedCase c;
  c.lens = {5, 40};
  std::mt19937 rng(9);
  const PagedData d = make_data(c, rng);
  const Dev x = upload_case(c, d);
  const ops::AttentionParams good = params(c, x);
  EXPECT_NO_THROW(ops::attention(x.q, x.k, x.v, good));

  Array v_bf16 = ops::cast(x.v, DType::bf16);
  // Keys and values of different types: the CPU reads each in its own (the KV cache types);
  // CUDA takes one 16-bit type for both.
  if (x.q.device().is_cpu())
    EXPECT_NO_THROW(ops::attention(x.q, x.k, v_bf16, good)) << "k and v of different types";
  else
    EXPECT_THROW(ops::attention(x.q, x.k, v_bf16, good), InvalidInput) << "k and v of different types";
  Array k_f32 = ops::cast(x.k, DType::f32);
  EXPECT_THROW(ops::attention(x.q, k_f32, k_f32, good), InvalidInput) << "an f32 pool";
  // Every other block: not contiguous.
  const Shape ps = x.k.shape();
  Array k_strided = Array::strided(x.k.buffer(), x.k.byte_offset(), {ps[0] / 2, ps[1], ps[2], ps[3]},
                                   {2 * ps[1] * ps[2] * ps[3], ps[2] * ps[3], ps[3], 1}, x.k.dtype());
  EXPECT_THROW(ops::attention(x.q, k_strided, k_strided, good), InvalidInput) << "a strided pool";

  ops::AttentionParams p = good;
  paged(p).block_tables = x.tables.slice_rows(0, 1);
  EXPECT_THROW(ops::attention(x.q, x.k, x.v, p), InvalidInput) << "block_tables rows != n";
  p = good;
  paged(p).seq_lens = x.lens.slice_rows(0, 1);
  EXPECT_THROW(ops::attention(x.q, x.k, x.v, p), InvalidInput) << "seq_lens length != n";
  p = good;
  paged(p).block_tables = ops::cast(x.tables, DType::f32);
  EXPECT_THROW(ops::attention(x.q, x.k, x.v, p), InvalidInput) << "f32 block_tables";
  p = good;
  paged(p).block_tables = Array();
  EXPECT_THROW(ops::attention(x.q, x.k, x.v, p), InvalidInput) << "a paged layout without block_tables";
  p = good;
  p.window = -1;
  EXPECT_THROW(ops::attention(x.q, x.k, x.v, p), InvalidInput) << "negative window";

  // q of another head_dim, and a head count that is no multiple of the kv heads.
  const int64_t n = int64_t(c.lens.size()), H = c.n_heads(), D = c.head_dim;
  Array q_wide = upload(std::vector<float>(size_t(n * H * 2 * D), 0.5f), {n, H, 2 * D}, DType::f32);
  EXPECT_THROW(ops::attention(q_wide, x.k, x.v, good), InvalidInput) << "head_dim mismatch";
  Array q_odd = upload(std::vector<float>(size_t(n * 3 * D), 0.5f), {n, 3, D}, DType::f32);
  EXPECT_THROW(ops::attention(q_odd, x.k, x.v, good), InvalidInput) << "3 heads over 2 kv heads";

  if (!on_cuda()) {  // the host reads tables and lengths only on the CPU
    std::vector<int32_t> lens = d.lens;
    lens[1] = int32_t(d.max_blocks * c.block_size + 1);
    p = good;
    paged(p).seq_lens = upload(lens, {n}, DType::i32);
    EXPECT_THROW(ops::attention(x.q, x.k, x.v, p), InvalidInput) << "a length past the table";
    std::vector<int32_t> tables = d.tables;
    tables[0] = int32_t(d.n_blocks);
    p = good;
    paged(p).block_tables = upload(tables, {n, d.max_blocks}, DType::i32);
    EXPECT_THROW(ops::attention(x.q, x.k, x.v, p), InvalidInput) << "a block id outside the pool";
  } else {
    PagedCase c48 = c;
    c48.head_dim = 48;
    std::mt19937 rng48(10);
    const PagedData d48 = make_data(c48, rng48);
    const Dev x48 = upload_case(c48, d48);
    EXPECT_THROW(ops::attention(x48.q, x48.k, x48.v, params(c48, x48)), Unsupported) << "head_dim 48 on CUDA";
  }
}

// write_kv_paged then gather_kv_blocks: each written row comes back exactly as its rounded
// input, rows of a negative slot are written nowhere, and no other pool element changes.
TEST_P(PagedKV, WriteThenGatherRoundTrips) {
  constexpr int64_t kBlocks = 6, kHeads = 2, kBs = 4, kDim = 32, kPad = 8;
  constexpr uint16_t kSentinel = 0x7bcd;
  std::mt19937 rng(11);
  for (bool bf16 : {false, true}) {
    const DType dt = bf16 ? DType::bf16 : DType::f16;
    // Rows 0..4 to slots 9, 10, -1, 3, 22; row 2 is padding.
    const std::vector<int32_t> slots = {9, 10, -1, 3, 22};
    const int64_t n = int64_t(slots.size()), row = kHeads * kDim + kPad;
    // bf16: random floats (rounded to nearest even); f16: values exact in f16.
    std::vector<float> k(size_t(n * row)), v(k.size());
    std::uniform_real_distribution<float> uni(-100.0f, 100.0f);
    std::uniform_int_distribution<int> q(-128, 128);
    for (size_t e = 0; e < k.size(); ++e) {
      k[e] = bf16 ? uni(rng) : float(q(rng)) / 8.0f;
      v[e] = bf16 ? uni(rng) : float(q(rng)) / 8.0f;
    }
    auto rounded = [&](float x) { return bf16 ? bf16_nearest_even(x) : f32_to_f16(x); };
    Array keys = upload(std::vector<uint16_t>(size_t(kBlocks * kHeads * kBs * kDim), kSentinel),
                        {kBlocks, kHeads, kBs, kDim}, dt);
    Array values = ops::cast(keys, dt);
    Array k_rows = upload(k, {n, row}, DType::f32), v_rows = upload(v, {n, row}, DType::f32);
    auto heads = [&](const Array& rows) {
      return Array::strided(rows.buffer(), rows.byte_offset(), {n, kHeads, kDim}, {row, kDim, 1}, DType::f32);
    };
    ops::write_kv_paged(keys, values, heads(k_rows), heads(v_rows), upload(slots, {n}, DType::i32));

    const std::vector<uint16_t> kp = download<uint16_t>(keys), vp = download<uint16_t>(values);
    for (int64_t b = 0; b < kBlocks; ++b)
      for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t r = 0; r < kBs; ++r) {
          const int64_t slot = b * kBs + r;
          const auto it = std::find(slots.begin(), slots.end(), int32_t(slot));
          const int64_t i = it == slots.end() ? -1 : int64_t(it - slots.begin());
          for (int64_t e = 0; e < kDim; ++e) {
            const size_t at = size_t(((b * kHeads + h) * kBs + r) * kDim + e);
            const size_t src = size_t(i * row + h * kDim + e);
            ASSERT_EQ(kp[at], i < 0 ? kSentinel : rounded(k[src])) << "key slot " << slot << " head " << h;
            ASSERT_EQ(vp[at], i < 0 ? kSentinel : rounded(v[src])) << "value slot " << slot << " head " << h;
          }
        }

    // A sequence over blocks 2, 5 (slots 8..11, 20..23): its rows 1, 2 and 6 were written.
    const std::vector<int32_t> ids = {2, 5};
    Array got = ops::gather_kv_blocks(keys, upload(ids, {2}, DType::i32), 7);
    ASSERT_EQ(got.shape(), Shape({kHeads, 7, kDim}));
    ASSERT_EQ(got.dtype(), dt);
    const std::vector<uint16_t> g = download<uint16_t>(got);
    for (int64_t h = 0; h < kHeads; ++h)
      for (int64_t j = 0; j < 7; ++j)
        for (int64_t e = 0; e < kDim; ++e) {
          const int64_t slot = ids[size_t(j / kBs)] * kBs + j % kBs;
          ASSERT_EQ(g[size_t((h * 7 + j) * kDim + e)],
                    kp[size_t(((slot / kBs * kHeads + h) * kBs + slot % kBs) * kDim + e)])
              << "gathered row " << j << " head " << h;
        }
    const int64_t written[][2] = {{1, 0}, {2, 1}, {6, 4}};  // sequence row, source row
    for (const auto& w : written)
      for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t e = 0; e < kDim; ++e)
          ASSERT_EQ(g[size_t((h * 7 + w[0]) * kDim + e)], rounded(k[size_t(w[1] * row + h * kDim + e)]))
              << "round trip of row " << w[1];
  }
}

TEST_P(PagedKV, RejectsBadArguments) {
  const DType dt = DType::f16;
  Array keys = upload(std::vector<uint16_t>(4 * 2 * 8 * 16, 0), {4, 2, 8, 16}, dt);
  Array values = ops::cast(keys, dt);
  Array rows = upload(std::vector<float>(3 * 2 * 16, 1.0f), {3, 2, 16}, DType::f32);
  Array slots = upload(std::vector<int32_t>{0, 1, 2}, {3}, DType::i32);
  EXPECT_NO_THROW(ops::write_kv_paged(keys, values, rows, rows, slots));
  // Keys and values of different types: the CPU stores each in its own; CUDA refuses.
  if (keys.device().is_cpu())
    EXPECT_NO_THROW(ops::write_kv_paged(keys, ops::cast(values, DType::bf16), rows, rows, slots))
        << "keys and values of different types";
  else
    EXPECT_THROW(ops::write_kv_paged(keys, ops::cast(values, DType::bf16), rows, rows, slots), InvalidInput)
        << "keys and values of different types";
  EXPECT_THROW(ops::write_kv_paged(keys, values, rows, rows, slots.slice_rows(0, 2)), InvalidInput)
      << "slots length != n";
  EXPECT_THROW(ops::write_kv_paged(keys, values, rows, rows, ops::cast(slots, DType::f32)), InvalidInput)
      << "f32 slots";
  Array rows3 = upload(std::vector<float>(3 * 3 * 16, 1.0f), {3, 3, 16}, DType::f32);
  EXPECT_THROW(ops::write_kv_paged(keys, values, rows3, rows3, slots), InvalidInput) << "3 heads into 2";
  EXPECT_THROW(ops::write_kv_paged(keys, values, rows, rows.slice_rows(0, 2), slots.slice_rows(0, 2)), InvalidInput)
      << "k and v row counts";
  Array keys3 = keys.reshape({4 * 2, 8, 16});
  EXPECT_THROW(ops::write_kv_paged(keys3, keys3, rows, rows, slots), InvalidInput) << "a 3-d pool";
  if (!on_cuda()) {
    Array past = upload(std::vector<int32_t>{0, 32, 1}, {3}, DType::i32);
    EXPECT_THROW(ops::write_kv_paged(keys, values, rows, rows, past), InvalidInput) << "a slot past the pool";
    EXPECT_THROW(ops::gather_kv_blocks(keys, upload(std::vector<int32_t>{0, 4}, {2}, DType::i32), 9), InvalidInput)
        << "a block id outside the pool";
  }
  Array ids = upload(std::vector<int32_t>{0, 1}, {2}, DType::i32);
  EXPECT_THROW(ops::gather_kv_blocks(keys, ids, 17), InvalidInput) << "too few block ids";
  EXPECT_THROW(ops::gather_kv_blocks(keys, ids, -1), InvalidInput) << "negative n_rows";
  EXPECT_THROW(ops::gather_kv_blocks(keys, ops::cast(ids, DType::f32), 4), InvalidInput) << "f32 block ids";
}

INSTANTIATE_TEST_SUITE_P(Devices, PagedAttention, OSPREY_DEVICE_LEVELS);
INSTANTIATE_TEST_SUITE_P(Devices, PagedKV, OSPREY_DEVICE_LEVELS);

}  // namespace
}  // namespace osprey
