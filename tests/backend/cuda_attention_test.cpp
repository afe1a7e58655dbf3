// cuda::attention's tensor-core paths (split-K decode, flash prefill), its device-side
// positions (q_pos_dev / max_keys, replayed from one captured graph) and the CUDA-core
// fallback, against the double-precision reference of tests/support. Cache rows past the
// live length hold NaN and outputs start as NaN, so a read past the length or an unwritten
// element fails.
#ifdef OSPREY_WITH_CUDA

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "backend/cuda_available.h"
#include "core/error.h"
#include "support/attention_reference.h"
#include "support/cuda_buffers.h"
#include "support/numeric.h"

namespace osprey {
namespace {


using testing::AttnCase;
using testing::AttnData;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr uint16_t kF16NaN = 0x7e00;
// ||got - ref|| / ||ref||: f16 K/V, q * scale and the softmax weights rounded to f16 for the
// tensor cores, f32 accumulation.
constexpr double kTol = 1e-3;

using testing::DeviceVec;
using testing::rel_error;
using testing::st;
using testing::sync;


size_t count_bit_differences(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

std::string describe(const AttnCase& s) {
  return "n=" + std::to_string(s.n) + " q_pos0=" + std::to_string(s.q_pos0) + " n_keys=" + std::to_string(s.n_keys) +
         " heads=" + std::to_string(s.n_heads) + "/" + std::to_string(s.n_kv_heads) +
         " head_dim=" + std::to_string(s.head_dim) + " window=" + std::to_string(s.window) +
         " softcap=" + std::to_string(s.softcap) + (s.row_major_heads ? " [L, kv, hd] cache" : "");
}

// `d` moved into a [n_kv_heads, capacity, head_dim] cache whose rows from s.n_keys on are NaN.
AttnData with_capacity(const AttnCase& s, const AttnData& d, int64_t capacity) {
  const int64_t D = s.head_dim;
  AttnData w;
  w.q = d.q;
  w.row_stride = D;
  w.head_stride = capacity * D;
  w.k.assign(size_t(s.n_kv_heads * capacity * D), kF16NaN);
  w.v.assign(w.k.size(), kF16NaN);
  for (int64_t h = 0; h < s.n_kv_heads; ++h)
    for (int64_t j = 0; j < s.n_keys; ++j)
      for (int64_t e = 0; e < D; ++e) {
        w.k[size_t(h * w.head_stride + j * D + e)] = d.k[size_t(h * d.head_stride + j * d.row_stride + e)];
        w.v[size_t(h * w.head_stride + j * D + e)] = d.v[size_t(h * d.head_stride + j * d.row_stride + e)];
      }
  return w;
}

// Device buffers of one case; upload() replaces their contents with data of the same sizes.
struct DeviceCase {
  explicit DeviceCase(const AttnData& d)
      : q(d.q), k(d.k), v(d.v), out(std::vector<float>(d.q.size(), kNaN)), out_size(d.q.size()) {}
  void upload(const AttnData& d) {
    q.upload(d.q);
    k.upload(d.k);
    v.upload(d.v);
  }
  // Host positions (q_pos_dev null); the caller sets q_pos_dev / max_keys.
  cuda::AttentionArgs args(const AttnCase& s, const AttnData& d) const {
    cuda::AttentionArgs a{};
    testing::set_attention_args(a, s, d);
    a.q = q.get();
    a.k = k.get();
    a.v = v.get();
    a.out = out.get();
    return a;
  }
  std::vector<float> run(const cuda::AttentionArgs& a) {
    clear_out();
    cuda::attention(a, st());
    return out.download();
  }
  void clear_out() { out.upload(std::vector<float>(out_size, kNaN)); }

  DeviceVec<float> q;
  DeviceVec<uint16_t> k, v;
  DeviceVec<float> out;
  size_t out_size;  // [n, n_heads * head_dim]
};

// Host positions, launch shape from n_keys.
double host_error(const AttnCase& s, uint32_t seed) {
  std::mt19937 rng(seed);
  const AttnData d = testing::make_attn_data(s, rng);
  DeviceCase dc(d);
  const std::vector<float> got = dc.run(dc.args(s, d));
  return rel_error(got, testing::attention_reference(s, d, testing::attention_scale(s)));
}

TEST(CudaFlashAttention, PrefillAcrossLengthsHeadDimsAndGroups) {
  SKIP_WITHOUT_CUDA();
  struct Shape {
    int64_t head_dim, group, n_kv_heads;
  };
  const Shape shapes[] = {{64, 1, 2}, {64, 4, 2}, {64, 8, 2}, {128, 1, 2}, {128, 4, 2},
                          {128, 8, 2}, {256, 1, 2}, {256, 4, 2}, {256, 8, 2}};
  // n = 512 keeps to a few shapes: the reference is slow.
  const Shape big[] = {{128, 4, 2}, {64, 8, 1}, {256, 1, 2}};
  uint32_t seed = 100;
  for (int64_t n : {1, 7, 64, 100, 512})
    for (int64_t q_pos0 : {0, 45}) {
      std::vector<Shape> list(n == 512 ? std::begin(big) : std::begin(shapes), n == 512 ? std::end(big) : std::end(shapes));
      for (const Shape& sh : list) {
        AttnCase s;
        s.n = n;
        s.q_pos0 = q_pos0;
        s.n_keys = q_pos0 + n;
        s.head_dim = sh.head_dim;
        s.n_kv_heads = sh.n_kv_heads;
        s.n_heads = sh.group * sh.n_kv_heads;
        EXPECT_LT(host_error(s, seed++), kTol) << describe(s);
      }
    }
}

// bf16 K and V (q and P rounded to bf16 for the bf16 mma): the tensor-core prefill and decode
// kernels and the CUDA-core fallback (head_dim 80), with keys and values past f16's range.
TEST(CudaFlashAttention, Bf16RowsBeyondTheF16Range) {
  SKIP_WITHOUT_CUDA();
  // bf16 keeps 8 significant bits where f16 keeps 11.
  constexpr double kTolBf16 = 1e-2;
  uint32_t seed = 700;
  for (int64_t hd : {64, 128, 256, 80})
    for (int64_t n : {1, 3, 100})
      for (int window : {0, 40}) {
        AttnCase s;
        s.bf16 = true;
        s.kv_range = 2.0e5f;
        s.q_range = 2.0e-5f;  // logits of order 1, so rounding q to bf16 moves them by well under 1%
        s.n = n;
        s.q_pos0 = 300;
        s.n_keys = 300 + n;
        s.head_dim = hd;
        s.n_heads = 8;
        s.n_kv_heads = 2;
        s.window = window;
        EXPECT_LT(host_error(s, seed++), kTolBf16) << "bf16 " << describe(s);
      }
}

TEST(CudaFlashAttention, SlidingWindowAndSoftcap) {
  SKIP_WITHOUT_CUDA();
  uint32_t seed = 300;
  for (int64_t hd : {64, 128, 256})
    for (int64_t n : {3, 100})
      for (int64_t q_pos0 : {0, 300}) {
        AttnCase s;
        s.n = n;
        s.q_pos0 = q_pos0;
        s.n_keys = q_pos0 + n;
        s.head_dim = hd;
        s.n_heads = 8;
        s.n_kv_heads = 2;
        for (int window : {16, 64, 150}) {
          s.window = window;
          EXPECT_LT(host_error(s, seed++), kTol) << describe(s);
        }
        s.window = 0;
        s.scale = 4.0f / std::sqrt(float(hd));  // logits well past the cap
        s.softcap = 3.0f;
        EXPECT_LT(host_error(s, seed++), kTol) << describe(s);
        s.window = 40;
        EXPECT_LT(host_error(s, seed++), kTol) << describe(s);
      }
}

TEST(CudaFlashAttention, StridedCacheViews) {
  SKIP_WITHOUT_CUDA();
  uint32_t seed = 500;
  AttnCase s;
  s.head_dim = 128;
  s.n_heads = 16;
  s.n_kv_heads = 4;
  s.row_major_heads = true;  // [capacity, n_kv_heads, head_dim]: row stride n_kv_heads * head_dim
  for (int64_t n : {1, 64}) {
    s.n = n;
    s.n_keys = 1000;
    s.q_pos0 = 1000 - n;
    EXPECT_LT(host_error(s, seed++), kTol) << describe(s);
  }
  s.row_major_heads = false;
  // Live rows past the last query's position are not visible to it.
  for (int64_t n : {2, 20}) {
    s.n = n;
    s.q_pos0 = 100;
    s.n_keys = 200;
    EXPECT_LT(host_error(s, seed++), kTol) << describe(s);
  }
  // Rows whose window lies past the live keys see nothing: zeros.
  for (int64_t n : {3, 8}) {
    s.n = n;
    s.q_pos0 = 100;
    s.n_keys = 102;
    s.window = 2;
    EXPECT_LT(host_error(s, seed++), kTol) << describe(s);
  }
}

TEST(CudaFlashAttention, RejectsUnsupportedHeadDim) {
  SKIP_WITHOUT_CUDA();
  AttnCase s;
  s.head_dim = 100;  // not a multiple of 8
  EXPECT_THROW(host_error(s, 1), Unsupported);
}

// One graph captured with q_pos_dev and max_keys, replayed at several lengths: each replay
// matches the reference and is bit-identical to an eager call with host positions and the
// same max_keys.
void check_device_positions(AttnCase s, std::initializer_list<int64_t> lengths, int64_t max_keys, uint32_t seed,
                            bool graph) {
  std::mt19937 rng(seed);
  auto data_for = [&](int64_t L) {
    s.n_keys = L;
    s.q_pos0 = L - s.n;
    return with_capacity(s, testing::make_attn_data(s, rng), max_keys);
  };
  AttnData d = data_for(*lengths.begin());
  DeviceCase dc(d);
  DeviceVec<int32_t> pos(std::vector<int32_t>{int32_t(s.q_pos0)});
  cuda::AttentionArgs dev = dc.args(s, d);
  dev.q_pos0 = -12345;  // must be ignored
  dev.n_keys = 1;       // likewise
  dev.q_pos_dev = pos.get();
  dev.max_keys = max_keys;
  (void)dc.run(dev);  // settles scratch and kernel attributes before the capture

  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    OSPREY_CUDA_CHECK(cudaStreamBeginCapture(st(), cudaStreamCaptureModeThreadLocal));
    try {
      cuda::attention(dev, st());
    } catch (...) {
      cudaStreamEndCapture(st(), &g);
      throw;
    }
    OSPREY_CUDA_CHECK(cudaStreamEndCapture(st(), &g));
    OSPREY_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  }
  for (int64_t L : lengths) {
    d = data_for(L);
    dc.upload(d);
    pos.upload(std::vector<int32_t>{int32_t(s.q_pos0)});
    std::vector<float> got;
    if (graph) {
      dc.clear_out();
      OSPREY_CUDA_CHECK(cudaGraphLaunch(exec, st()));
      got = dc.out.download();
    } else {
      got = dc.run(dev);
    }
    const std::vector<double> ref = testing::attention_reference(s, d, testing::attention_scale(s));
    EXPECT_LT(rel_error(got, ref), s.bf16 ? 1e-2 : kTol) << describe(s) << " device position, max_keys " << max_keys;

    cuda::AttentionArgs host = dc.args(s, d);
    host.max_keys = max_keys;
    EXPECT_EQ(count_bit_differences(dc.run(host), got), 0u) << describe(s) << " host vs device position";
    host.max_keys = 0;  // launch shape from n_keys
    EXPECT_LT(rel_error(dc.run(host), ref), s.bf16 ? 1e-2 : kTol) << describe(s) << " host position";
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (g) cudaGraphDestroy(g);
}

TEST(CudaFlashAttention, DecodeFromDevicePositionOneGraphManyLengths) {
  SKIP_WITHOUT_CUDA();
  uint32_t seed = 700;
  for (int64_t hd : {64, 128, 256})
    for (int64_t n : {1, 3})
      for (int window : {0, 100}) {
        AttnCase s;
        s.n = n;
        s.head_dim = hd;
        s.n_kv_heads = hd == 128 ? 8 : 2;  // the Llama-3.1-8B shape at 128
        s.n_heads = 4 * s.n_kv_heads;
        s.window = window;
        s.scale = 0.5f;  // peaked: the running max matters across splits
        check_device_positions(s, {n, 255, 256, 1000, 4095}, 4096, seed++, /*graph=*/true);
      }
}

TEST(CudaFlashAttention, PrefillFromDevicePosition) {
  SKIP_WITHOUT_CUDA();
  uint32_t seed = 900;
  for (int64_t hd : {64, 128, 256})
    for (int64_t n : {7, 64}) {
      AttnCase s;
      s.n = n;
      s.head_dim = hd;
      s.n_heads = 8;
      s.n_kv_heads = 2;
      check_device_positions(s, {n, 264, 1000}, 1024, seed++, /*graph=*/true);
    }
}

// A short chunk after cached rows with the device position and max_keys equal to the keys
// (the paged backend's prefill over gathered rows): few rows, f16 and bf16, with and without a
// window, grouped heads.
TEST(CudaFlashAttention, ShortChunkAfterCachedRowsAtExactCapacity) {
  SKIP_WITHOUT_CUDA();
  uint32_t seed = 1100;
  for (int64_t hd : {64, 128})
    for (int64_t n : {2, 3, 4, 5, 8})
      for (bool bf16 : {false, true})
        for (int window : {0, 16}) {
          AttnCase s;
          s.n = n;
          s.head_dim = hd;
          s.n_heads = 4;
          s.n_kv_heads = 2;
          s.window = window;
          s.bf16 = bf16;
          if (bf16) s.q_range = 0.05f;
          const int64_t len = n + 8;
          check_device_positions(s, {len}, len, seed++, /*graph=*/false);
        }
}

TEST(CudaFlashAttention, FallbackHeadDimsFromDevicePosition) {
  SKIP_WITHOUT_CUDA();
  uint32_t seed = 1100;
  for (int64_t hd : {80, 96})
    for (int64_t n : {1, 9}) {
      AttnCase s;
      s.n = n;
      s.head_dim = hd;
      s.n_heads = 8;
      s.n_kv_heads = 2;
      check_device_positions(s, {n, 1000, 3000}, 4096, seed++, /*graph=*/false);
    }
}

TEST(CudaFlashAttention, DevicePositionNeedsMaxKeys) {
  SKIP_WITHOUT_CUDA();
  AttnCase s;
  s.n_keys = 10;
  s.q_pos0 = 9;
  std::mt19937 rng(1);
  const AttnData d = testing::make_attn_data(s, rng);
  DeviceCase dc(d);
  DeviceVec<int32_t> pos(std::vector<int32_t>{9});
  cuda::AttentionArgs a = dc.args(s, d);
  a.q_pos_dev = pos.get();
  EXPECT_THROW(cuda::attention(a, st()), InvalidInput);
  a.q_pos_dev = nullptr;
  a.max_keys = 5;  // below n_keys
  EXPECT_THROW(cuda::attention(a, st()), InvalidInput);
}

// Median milliseconds of `exec` over `reps` replays.
double median_ms(cudaGraphExec_t exec, int reps) {
  cudaEvent_t e0, e1;
  OSPREY_CUDA_CHECK(cudaEventCreate(&e0));
  OSPREY_CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) OSPREY_CUDA_CHECK(cudaGraphLaunch(exec, st()));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    OSPREY_CUDA_CHECK(cudaEventRecord(e0, st()));
    OSPREY_CUDA_CHECK(cudaGraphLaunch(exec, st()));
    OSPREY_CUDA_CHECK(cudaEventRecord(e1, st()));
    OSPREY_CUDA_CHECK(cudaEventSynchronize(e1));
    float x = 0.0f;
    OSPREY_CUDA_CHECK(cudaEventElapsedTime(&x, e0, e1));
    ms.push_back(x);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// `calls` attention launches captured in one graph.
cudaGraphExec_t capture(const std::vector<cuda::AttentionArgs>& calls) {
  for (const auto& a : calls) cuda::attention(a, st());  // scratch and attributes settle first
  sync();
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  OSPREY_CUDA_CHECK(cudaStreamBeginCapture(st(), cudaStreamCaptureModeThreadLocal));
  for (const auto& a : calls) cuda::attention(a, st());
  OSPREY_CUDA_CHECK(cudaStreamEndCapture(st(), &g));
  OSPREY_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  cudaGraphDestroy(g);
  return exec;
}

// Llama-3.1-8B attention: 32 query heads, 8 kv heads, head_dim 128.
TEST(CudaFlashAttention, DISABLED_AttentionSpeed) {
  SKIP_WITHOUT_CUDA();
  constexpr int64_t kHeads = 32, kKv = 8, kD = 128, kLayers = 16;  // 16 caches in turn: more than L2
  auto f16_buffer = [](size_t elems) {
    uint16_t* p = nullptr;
    OSPREY_CUDA_CHECK(cudaMalloc(&p, elems * 2));
    OSPREY_CUDA_CHECK(cudaMemset(p, 0x2c, elems * 2));  // 0x2c2c: about 0.066 in f16
    return p;
  };
  auto f32_buffer = [](size_t elems) {
    float* p = nullptr;
    OSPREY_CUDA_CHECK(cudaMalloc(&p, elems * 4));
    OSPREY_CUDA_CHECK(cudaMemset(p, 0, elems * 4));
    return p;
  };

  for (int64_t L : {256, 2048, 8192, 32768}) {
    const int64_t cap = (L + 1 + 255) / 256 * 256;
    const size_t cache = size_t(kKv * cap * kD);
    uint16_t* k = f16_buffer(cache * kLayers);
    uint16_t* v = f16_buffer(cache * kLayers);
    float* q = f32_buffer(size_t(kHeads * kD * kLayers));
    float* out = f32_buffer(size_t(kHeads * kD * kLayers));
    DeviceVec<int32_t> pos(std::vector<int32_t>{int32_t(L - 1)});
    std::vector<cuda::AttentionArgs> calls;
    for (int64_t layer = 0; layer < kLayers; ++layer) {
      cuda::AttentionArgs a{};
      a.q = q + layer * kHeads * kD;
      a.n = 1;
      a.n_heads = kHeads;
      a.head_dim = kD;
      a.k = k + layer * cache;
      a.v = v + layer * cache;
      a.n_kv_heads = kKv;
      a.n_keys = L;
      a.k_head_stride = a.v_head_stride = cap * kD;
      a.k_row_stride = a.v_row_stride = kD;
      a.scale = 1.0f / std::sqrt(float(kD));
      a.out = out + layer * kHeads * kD;
      a.q_pos_dev = pos.get();
      a.max_keys = cap;
      calls.push_back(a);
    }
    cudaGraphExec_t exec = capture(calls);
    const double us = median_ms(exec, 21) * 1e3 / double(kLayers);
    const double bytes = 2.0 * double(kKv * L * kD) * 2.0;
    std::printf("decode  L=%-5lld  %7.2f us/layer  %7.1f GB/s of K/V  (32 layers: %.3f ms per token)\n",
                static_cast<long long>(L), us, bytes / (us * 1e3), 32.0 * us * 1e-3);
    cudaGraphExecDestroy(exec);
    cudaFree(k);
    cudaFree(v);
    cudaFree(q);
    cudaFree(out);
  }

  for (int64_t n : {512, 2048}) {
    const int64_t cap = (n + 255) / 256 * 256;
    const size_t cache = size_t(kKv * cap * kD);
    constexpr int64_t kCalls = 4;
    uint16_t* k = f16_buffer(cache * kCalls);
    uint16_t* v = f16_buffer(cache * kCalls);
    float* q = f32_buffer(size_t(n * kHeads * kD * kCalls));
    float* out = f32_buffer(size_t(n * kHeads * kD * kCalls));
    std::vector<cuda::AttentionArgs> calls;
    for (int64_t c = 0; c < kCalls; ++c) {
      cuda::AttentionArgs a{};
      a.q = q + c * n * kHeads * kD;
      a.n = n;
      a.n_heads = kHeads;
      a.head_dim = kD;
      a.k = k + c * cache;
      a.v = v + c * cache;
      a.n_kv_heads = kKv;
      a.n_keys = n;
      a.k_head_stride = a.v_head_stride = cap * kD;
      a.k_row_stride = a.v_row_stride = kD;
      a.q_pos0 = 0;
      a.scale = 1.0f / std::sqrt(float(kD));
      a.out = out + c * n * kHeads * kD;
      calls.push_back(a);
    }
    cudaGraphExec_t exec = capture(calls);
    const double ms = median_ms(exec, 21) / double(kCalls);
    const double flops = 4.0 * double(kD) * double(kHeads) * double(n) * double(n + 1) / 2.0;
    std::printf("prefill n=%-5lld  %7.1f us/layer  %7.1f TFLOP/s (causal)  (32 layers: %.3f ms)\n",
                static_cast<long long>(n), ms * 1e3, flops / (ms * 1e-3) / 1e12, 32.0 * ms);
    cudaGraphExecDestroy(exec);
    cudaFree(k);
    cudaFree(v);
    cudaFree(q);
    cudaFree(out);
  }
}

}  // namespace
}  // namespace osprey

#endif  // OSPREY_WITH_CUDA
