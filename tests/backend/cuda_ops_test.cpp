// The CUDA kernels of src/backend/cuda against naive double-precision loops on the host.
// Every output buffer is filled with NaN before the kernel runs, so an unwritten element fails.
#ifdef OSPREY_WITH_CUDA

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "backend/cuda_available.h"
#include "core/error.h"
#include "core/half.h"
#include "support/cuda_buffers.h"
#include "support/numeric.h"

namespace osprey {
namespace {


constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

using testing::DeviceVec;
using testing::rel_error;
using testing::random_floats;
using testing::st;
using testing::sync;



// Values stored in `dt` (f32 floats or 16-bit bits) and the exact f32 values they hold.
struct Stored {
  DType dt;
  std::vector<float> f32;
  std::vector<uint16_t> bits;
  std::vector<float> exact;
};

Stored store_as(DType dt, const std::vector<float>& v) {
  Stored s;
  s.dt = dt;
  s.exact.resize(v.size());
  if (dt == DType::f32) s.f32 = s.exact = v;
  else s.bits.resize(v.size());
  for (size_t i = 0; dt != DType::f32 && i < v.size(); ++i) {
    s.bits[i] = dt == DType::f16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
    s.exact[i] = dt == DType::f16 ? f16_to_f32(s.bits[i]) : bf16_to_f32(s.bits[i]);
  }
  return s;
}

// The stored values on the device, whichever their type.
struct DeviceStored {
  explicit DeviceStored(const Stored& s)
      : f32(s.dt == DType::f32 ? s.f32 : std::vector<float>{}), bits(s.dt == DType::f32 ? std::vector<uint16_t>{} : s.bits),
        dt(s.dt) {}
  const void* get() const { return dt == DType::f32 ? static_cast<const void*>(f32.get()) : bits.get(); }
  DeviceVec<float> f32;
  DeviceVec<uint16_t> bits;
  DType dt;
};

const DType kWeightTypes[] = {DType::f32, DType::f16, DType::bf16};

TEST(CudaOps, EmbeddingGathersAndScalesRows) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(1);
  const int64_t vocab = 50, d = 77;
  const std::vector<int32_t> ids = {3, 0, 49, 3, 17, 8, 22, 41, 1};
  const int64_t n = int64_t(ids.size());
  for (DType dt : kWeightTypes) {
    const Stored table = store_as(dt, random_floats(size_t(vocab * d), rng));
    DeviceStored dtable(table);
    DeviceVec<int32_t> dids(ids);
    DeviceVec<float> out(std::vector<float>(size_t(n * d), kNaN));
    cuda::embedding(dtable.get(), dt, dids.get(), n, d, 1.7f, out.get(), st());
    std::vector<double> ref(static_cast<size_t>(n * d));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < d; ++j) ref[size_t(i * d + j)] = double(table.exact[size_t(ids[size_t(i)] * d + j)]) * 1.7f;
    EXPECT_LT(rel_error(out.download(), ref), 1e-6) << dtype_name(dt);
  }
}

std::vector<double> rms_norm_ref(const std::vector<float>& x, const std::vector<float>& w, int64_t d, double eps,
                                 double offset) {
  std::vector<double> out(x.size());
  for (size_t r = 0; r < x.size() / size_t(d); ++r) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += double(x[r * d + j]) * x[r * d + j];
    const double inv = 1.0 / std::sqrt(ss / double(d) + eps);
    for (int64_t j = 0; j < d; ++j) out[r * d + j] = x[r * d + j] * inv * (w[size_t(j)] + offset);
  }
  return out;
}

TEST(CudaOps, RmsNormMatchesReference) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(2);
  for (int64_t d : {64, 1000, 3000}) {
    for (float offset : {0.0f, 1.0f}) {
      const int64_t rows = 5;
      const auto x = random_floats(size_t(rows * d), rng, -3.0f, 3.0f);
      const auto w = random_floats(size_t(d), rng);
      DeviceVec<float> dx(x), dw(w), out(std::vector<float>(x.size(), kNaN));
      cuda::rms_norm(dx.get(), dw.get(), rows, d, 1e-5f, offset, out.get(), st());
      const auto ref = rms_norm_ref(x, w, d, 1e-5, offset);
      EXPECT_LT(rel_error(out.download(), ref), 1e-5) << "d=" << d << " offset=" << offset;
      cuda::rms_norm(dx.get(), dw.get(), rows, d, 1e-5f, offset, dx.get(), st());  // in place
      EXPECT_LT(rel_error(dx.download(), ref), 1e-5) << "in place d=" << d;
    }
  }
}

TEST(CudaOps, LayerNormWithAndWithoutBias) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(3);
  for (int64_t d : {96, 2500}) {
    for (bool with_bias : {false, true}) {
      const int64_t rows = 4;
      const auto x = random_floats(size_t(rows * d), rng, 0.5f, 3.0f);  // a mean far from 0
      const auto w = random_floats(size_t(d), rng), b = random_floats(size_t(d), rng);
      DeviceVec<float> dx(x), dw(w), db(b), out(std::vector<float>(x.size(), kNaN));
      cuda::layer_norm(dx.get(), dw.get(), with_bias ? db.get() : nullptr, rows, d, 1e-5f, out.get(), st());
      std::vector<double> ref(x.size());
      for (int64_t r = 0; r < rows; ++r) {
        double mean = 0, var = 0;
        for (int64_t j = 0; j < d; ++j) mean += x[size_t(r * d + j)];
        mean /= double(d);
        for (int64_t j = 0; j < d; ++j) var += (x[size_t(r * d + j)] - mean) * (x[size_t(r * d + j)] - mean);
        const double inv = 1.0 / std::sqrt(var / double(d) + 1e-5);
        for (int64_t j = 0; j < d; ++j)
          ref[size_t(r * d + j)] = (x[size_t(r * d + j)] - mean) * inv * w[size_t(j)] + (with_bias ? b[size_t(j)] : 0.0);
      }
      EXPECT_LT(rel_error(out.download(), ref), 1e-5) << "d=" << d << " bias=" << with_bias;
    }
  }
}

TEST(CudaOps, ElementwiseOpsAlignedAndUnaligned) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(4);
  const size_t n = 1003;
  for (size_t off : {size_t(0), size_t(1)}) {  // off = 1: pointers not 16-byte aligned
    const auto g = random_floats(n + off, rng, -4.0f, 4.0f), u = random_floats(n + off, rng, -2.0f, 2.0f);
    DeviceVec<float> dg(g), du(u), out(std::vector<float>(n + off, kNaN));
    std::vector<double> ref(n);
    auto got = [&](const DeviceVec<float>& v) {
      auto h = v.download();
      return std::vector<float>(h.begin() + off, h.end());
    };

    cuda::silu_mul(dg.get() + off, du.get() + off, out.get() + off, int64_t(n), st());
    for (size_t i = 0; i < n; ++i) ref[i] = g[i + off] / (1.0 + std::exp(-double(g[i + off]))) * u[i + off];
    EXPECT_LT(rel_error(got(out), ref), 1e-5) << "silu_mul off=" << off;

    cuda::gelu_tanh_mul(dg.get() + off, du.get() + off, out.get() + off, int64_t(n), st());
    for (size_t i = 0; i < n; ++i) {
      const double x = g[i + off];
      ref[i] = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))) * u[i + off];
    }
    EXPECT_LT(rel_error(got(out), ref), 1e-5) << "gelu_tanh_mul off=" << off;

    cuda::add_inplace(dg.get() + off, du.get() + off, int64_t(n), st());
    for (size_t i = 0; i < n; ++i) ref[i] = double(g[i + off]) + u[i + off];
    EXPECT_LT(rel_error(got(dg), ref), 1e-6) << "add off=" << off;

    cuda::scale_inplace(du.get() + off, -0.37f, int64_t(n), st());
    for (size_t i = 0; i < n; ++i) ref[i] = double(u[i + off]) * -0.37f;
    EXPECT_LT(rel_error(got(du), ref), 1e-6) << "scale off=" << off;
  }
}

TEST(CudaOps, RopeBothLayouts) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(5);
  for (int64_t hd : {64, 80, 128}) {
    for (bool interleaved : {false, true}) {
      const int64_t n = 7, heads = 3, half = hd / 2;
      const auto x = random_floats(size_t(n * heads * hd), rng);
      std::vector<int32_t> pos(static_cast<size_t>(n));
      for (auto& p : pos) p = int32_t(rng() % 5000);
      std::vector<float> inv(static_cast<size_t>(half));
      for (int64_t k = 0; k < half; ++k) inv[size_t(k)] = float(std::pow(10000.0, -2.0 * double(k) / double(hd)));
      DeviceVec<float> dx(x), dinv(inv);
      DeviceVec<int32_t> dpos(pos);
      const float mscale = 1.3f;
      cuda::rope_inplace(dx.get(), n, heads, hd, heads * hd, dpos.get(), dinv.get(), interleaved, mscale, st());
      std::vector<double> ref(x.begin(), x.end());
      for (int64_t i = 0; i < n; ++i)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t k = 0; k < half; ++k) {
            const double angle = double(float(pos[size_t(i)]) * inv[size_t(k)]);  // formed in f32
            const double c = std::cos(angle) * mscale, s = std::sin(angle) * mscale;
            const int64_t a = interleaved ? 2 * k : k, b = interleaved ? 2 * k + 1 : k + half;
            const size_t base = size_t((i * heads + h) * hd);
            ref[base + a] = x[base + a] * c - x[base + b] * s;
            ref[base + b] = x[base + b] * c + x[base + a] * s;
          }
      EXPECT_LT(rel_error(dx.download(), ref), 1e-5) << "hd=" << hd << " interleaved=" << interleaved;
    }
  }
}

using LinearFn = void (*)(const float*, int64_t, int64_t, const void*, DType, int64_t, const float*, float*,
                          cudaStream_t);

// Runs `fn` on random data and returns its relative error against a double loop on the
// stored weights and the f32 x.
double linear_error(LinearFn fn, DType dt, int64_t n, int64_t in, int64_t out, bool with_bias, uint32_t seed) {
  std::mt19937 rng(seed);
  const auto x = random_floats(size_t(n * in), rng);
  const Stored w = store_as(dt, random_floats(size_t(out * in), rng));
  const auto bias = random_floats(size_t(out), rng);
  DeviceVec<float> dx(x), dbias(bias), dy(std::vector<float>(size_t(n * out), kNaN));
  DeviceStored dw(w);
  fn(dx.get(), n, in, dw.get(), dt, out, with_bias ? dbias.get() : nullptr, dy.get(), st());
  std::vector<double> ref(static_cast<size_t>(n * out));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t r = 0; r < out; ++r) {
      double sum = with_bias ? bias[size_t(r)] : 0.0;
      for (int64_t k = 0; k < in; ++k) sum += double(x[size_t(j * in + k)]) * w.exact[size_t(r * in + k)];
      ref[size_t(j * out + r)] = sum;
    }
  return rel_error(dy.download(), ref);
}

struct LinearShape {
  int64_t out, in;
};

TEST(CudaOps, LinearGemvStreamsWeights) {
  SKIP_WITHOUT_CUDA();
  // 4500 and 3000 rows pick the 4- and 2-rows-per-warp kernels on a large GPU; in = 1003 and
  // 1001 take the unaligned fallback; in = 1000 ends on a partial 512-byte stride.
  const LinearShape shapes[] = {{257, 1024}, {64, 1000}, {33, 1003}, {4500, 256}, {3000, 264}, {17, 1001}};
  uint32_t seed = 10;
  for (DType dt : kWeightTypes)
    for (const LinearShape& sh : shapes)
      for (int64_t n : {1, 2, 5, 8}) {
        const bool bias = n % 2 == 1;
        EXPECT_LT(linear_error(&cuda::linear, dt, n, sh.in, sh.out, bias, seed++), 1e-5)
            << dtype_name(dt) << " n=" << n << " out=" << sh.out << " in=" << sh.in;
      }
  // More rows than one launch takes: chunks of kGemvMaxRows.
  EXPECT_LT(linear_error(&cuda::linear_gemv, DType::bf16, 21, 512, 130, true, seed++), 1e-5);
}

TEST(CudaOps, LinearGemmThroughCublas) {
  SKIP_WITHOUT_CUDA();
  uint32_t seed = 100;
  for (DType dt : kWeightTypes)
    for (int64_t n : {9, 37})
      for (const LinearShape& sh : {LinearShape{257, 1024}, LinearShape{96, 1000}}) {
        // f16 / bf16: x is rounded to the weights' type before the product.
        const double tol = dt == DType::f32 ? 1e-5 : 1e-2;
        EXPECT_LT(linear_error(&cuda::linear, dt, n, sh.in, sh.out, n == 9, seed++), tol)
            << dtype_name(dt) << " n=" << n << " out=" << sh.out;
      }
}

TEST(CudaOps, CopyStridedCastsAndTransposes) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(6);
  const int64_t shape[4] = {2, 3, 4, 5};
  const int64_t total = 2 * 3 * 4 * 5;
  // src contiguous; dst with the last two dims transposed and a gap per leading index.
  const int64_t ss[4] = {60, 20, 5, 1};
  const int64_t ds[4] = {70, 20, 1, 4};
  const size_t dst_size = 140;
  auto index = [&](const int64_t* strides, int64_t f) {
    const int64_t i3 = f % 5, i2 = f / 5 % 4, i1 = f / 20 % 3, i0 = f / 60;
    return size_t(i0 * strides[0] + i1 * strides[1] + i2 * strides[2] + i3 * strides[3]);
  };
  const auto vals = random_floats(size_t(total), rng, -100.0f, 100.0f);

  for (DType sdt : {DType::f32, DType::f16, DType::bf16}) {
    const Stored src = store_as(sdt, vals);
    DeviceStored dsrc(src);
    for (DType ddt : {DType::f32, DType::f16, DType::bf16, DType::i32}) {
      std::vector<uint32_t> expect(dst_size, 0xdeadbeefu);  // 4-byte slots; 16-bit dtypes use the low half
      for (int64_t f = 0; f < total; ++f) {
        const float v = src.exact[size_t(f)];
        uint32_t bits;
        if (ddt == DType::f32) std::memcpy(&bits, &v, 4);
        else if (ddt == DType::f16) bits = f32_to_f16(v);
        else if (ddt == DType::bf16) bits = f32_to_bf16(v);
        else bits = uint32_t(int32_t(v));
        expect[index(ds, f)] = bits;
      }
      const bool wide = dtype_size(ddt) == 4;
      DeviceVec<uint32_t> d32(std::vector<uint32_t>(dst_size, 0xdeadbeefu));
      DeviceVec<uint16_t> d16(std::vector<uint16_t>(dst_size, 0xbeefu));
      void* dst = wide ? static_cast<void*>(d32.get()) : d16.get();
      cuda::copy_strided(dst, ddt, ds, dsrc.get(), sdt, ss, shape, st());
      const auto got32 = d32.download();
      const auto got16 = d16.download();
      int bad = 0;
      for (size_t i = 0; i < dst_size; ++i) {
        const uint32_t g = wide ? got32[i] : got16[i];
        const uint32_t e = wide ? expect[i] : (expect[i] == 0xdeadbeefu ? 0xbeefu : expect[i]);
        bad += g != e;
      }
      EXPECT_EQ(bad, 0) << dtype_name(sdt) << " -> " << dtype_name(ddt);
    }
  }
  // i32 -> i32 keeps values beyond 2^24 exactly.
  std::vector<int32_t> ints(static_cast<size_t>(total));
  for (auto& v : ints) v = int32_t(rng());
  DeviceVec<int32_t> isrc(ints), idst(std::vector<int32_t>(dst_size, 0));
  cuda::copy_strided(idst.get(), DType::i32, ds, isrc.get(), DType::i32, ss, shape, st());
  const auto got = idst.download();
  int bad = 0;
  for (int64_t f = 0; f < total; ++f) bad += got[index(ds, f)] != ints[size_t(f)];
  EXPECT_EQ(bad, 0);
}

TEST(CudaOps, ArgmaxTakesLowestIndexOfMaximum) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(7);
  const int64_t n = 128256;
  auto x = random_floats(size_t(n), rng, -10.0f, 10.0f);
  x[77777] = 50.0f;
  x[99999] = 50.0f;
  x[5] = kNaN;
  DeviceVec<float> dx(x);
  DeviceVec<int32_t> out(std::vector<int32_t>{-1});
  cuda::argmax(dx.get(), n, out.get(), st());
  EXPECT_EQ(out.download()[0], 77777);

  x[77777] = 20.0f;  // now the later one is the unique max
  dx.upload(x);
  cuda::argmax(dx.get(), n, out.get(), st());
  EXPECT_EQ(out.download()[0], 99999);

  std::vector<float> flat(1000, -3.0f);
  DeviceVec<float> dflat(flat);
  cuda::argmax(dflat.get(), 1000, out.get(), st());
  EXPECT_EQ(out.download()[0], 0);
}

}  // namespace
}  // namespace osprey

#endif  // OSPREY_WITH_CUDA
