#include "backend/cpu/basic_ops.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"

namespace osprey::cpu {
OSPREY_CPU_LEVEL_BEGIN
namespace {

// Converts n elements of `src` (dtype dt) to f32.
void to_f32(const void* src, DType dt, int64_t n, float* dst) {
  switch (dt) {
    case DType::f32: std::memcpy(dst, src, size_t(n) * 4); return;
    case DType::f16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::bf16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    default: throw Unsupported(std::string("conversion to float32 from ") + dtype_name(dt));
  }
}

// Row-parallel loop over `rows` rows for element-wise kernels.
template <typename F>
void for_rows(int64_t rows, int64_t cols, F&& f) {
  int64_t min_chunk = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols));
  cpu_pool().parallel_for(rows, min_chunk, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) f(r);
  });
}

// Row-parallel loop over the rows of x's last dimension d: f(x row, out row, d).
template <typename F>
void for_row_pairs(const Array& x, Array& out, F&& f) {
  const int64_t d = x.dim(-1), rows = x.numel() / d;
  const float* xp = x.data<float>();
  float* op = out.data<float>();
  for_rows(rows, d, [&](int64_t r) { f(xp + r * d, op + r * d, d); });
}

// Gated activation over rows: out[j] = act(gate[j]) * up[j].
template <typename Act>
void gated(const Array& gate, const Array& up, Array& out, Act act) {
  const int64_t cols = gate.dim(-1), rows = gate.numel() / cols;
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* o = out.data<float>();
  for_rows(rows, cols, [&](int64_t r) {
    for (int64_t j = r * cols; j < (r + 1) * cols; ++j) o[j] = act(g[j]) * u[j];
  });
}

// Weight vector of any float dtype as f32 (norm weights are small; converted per call).
std::vector<float> vector_f32(const Array& w) {
  std::vector<float> v(size_t(w.numel()));
  to_f32(w.raw(), w.dtype(), w.numel(), v.data());
  return v;
}

}  // namespace

void embedding(const Array& table, const Array& ids, float scale, Array& out) {
  const int64_t n = ids.numel(), d = table.dim(1);
  const auto* id = ids.data<int32_t>();
  const char* base = static_cast<const char*>(table.raw());
  const size_t row_bytes = size_t(d) * table.itemsize();
  for (int64_t i = 0; i < n; ++i) {
    float* o = out.data<float>() + i * d;
    to_f32(base + size_t(id[i]) * row_bytes, table.dtype(), d, o);
    if (scale != 1.0f)
      for (int64_t j = 0; j < d; ++j) o[j] *= scale;
  }
}

void rms_norm(const Array& x, const Array& weight, float eps, bool unit_offset, Array& out) {
  // NOTE: models keep norm weights in f32, so the common path reads them in place.
  std::vector<float> converted;
  const float* w = weight.dtype() == DType::f32 ? weight.data<float>() : (converted = vector_f32(weight)).data();
  const float offset = unit_offset ? 1.0f : 0.0f;
  for_row_pairs(x, out, [&](const float* xr, float* o, int64_t d) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += double(xr[j]) * xr[j];
    float inv = 1.0f / std::sqrt(float(ss / double(d)) + eps);
    for (int64_t j = 0; j < d; ++j) o[j] = xr[j] * inv * (w[j] + offset);
  });
}

void layer_norm(const Array& x, const Array& weight, const Array& bias, float eps, Array& out) {
  std::vector<float> w = vector_f32(weight);
  std::vector<float> b = bias.defined() ? vector_f32(bias) : std::vector<float>(size_t(x.dim(-1)), 0.0f);
  for_row_pairs(x, out, [&](const float* xr, float* o, int64_t d) {
    double mean = 0;
    for (int64_t j = 0; j < d; ++j) mean += xr[j];
    mean /= double(d);
    double var = 0;
    for (int64_t j = 0; j < d; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    var /= double(d);
    float inv = 1.0f / std::sqrt(float(var) + eps);
    for (int64_t j = 0; j < d; ++j) o[j] = float(xr[j] - mean) * inv * w[size_t(j)] + b[size_t(j)];
  });
}

void add_(Array& x, const Array& y) {
  float* a = x.data<float>();
  const float* b = y.data<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
}

void scale_(Array& x, float s) {
  float* a = x.data<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) a[i] *= s;
}

void silu_mul(const Array& gate, const Array& up, Array& out) {
  gated(gate, up, out, [](float g) { return g / (1.0f + std::exp(-g)); });
}

namespace {

inline float gelu_tanh(float x) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(kC * (x + 0.044715f * x * x * x)));
}

}  // namespace

void gelu_tanh_mul(const Array& gate, const Array& up, Array& out) { gated(gate, up, out, gelu_tanh); }

void gelu_tanh_mul_split(const Array& gu, Array& out) {
  const int64_t f = out.dim(1), rows = out.dim(0);
  const float* in = gu.data<float>();
  float* o = out.data<float>();
  for_rows(rows, f, [&](int64_t r) {
    const float* g = in + r * 2 * f;
    const float* u = g + f;
    float* orow = o + r * f;
    for (int64_t j = 0; j < f; ++j) orow[j] = gelu_tanh(g[j]) * u[j];
  });
}

void head_rms_norm_(Array& x, const Array& weight, float eps, bool unit_offset) {
  const int64_t n = x.dim(0), heads = x.dim(1), hd = x.dim(2);
  const int64_t row_stride = n == 1 ? heads * hd : x.strides()[0];
  const float* w = weight.data<float>();
  const float offset = unit_offset ? 1.0f : 0.0f;
  float* xp = x.data<float>();
  for_rows(n, heads * hd, [&](int64_t i) {
    for (int64_t h = 0; h < heads; ++h) {
      float* v = xp + i * row_stride + h * hd;
      double ss = 0;
      for (int64_t j = 0; j < hd; ++j) ss += double(v[j]) * v[j];
      const float inv = 1.0f / std::sqrt(float(ss / double(hd)) + eps);
      for (int64_t j = 0; j < hd; ++j) v[j] = v[j] * inv * (w[j] + offset);
    }
  });
}

void softcap_(Array& x, float cap) {
  float* a = x.data<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) a[i] = cap * std::tanh(a[i] / cap);
}

void rope_(Array& x, const Array& positions, const Array& inv_freq, bool interleaved, float mscale) {
  const int64_t n = x.dim(0), heads = x.dim(1), hd = x.dim(2), half = hd / 2;
  const int64_t row_stride = n == 1 ? heads * hd : x.strides()[0];
  const auto* pos = positions.data<int32_t>();
  const float* inv = inv_freq.data<float>();
  float* xp = x.data<float>();
  for_rows(n, heads * hd, [&](int64_t i) {
    thread_local std::vector<float> cs, sn;
    cs.resize(size_t(half));
    sn.resize(size_t(half));
    for (int64_t k = 0; k < half; ++k) {
      // NOTE: the angle is formed in f32 as the reference implementations do.
      float angle = float(pos[i]) * inv[k];
      cs[size_t(k)] = std::cos(angle) * mscale;
      sn[size_t(k)] = std::sin(angle) * mscale;
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = xp + i * row_stride + h * hd;
      for (int64_t k = 0; k < half; ++k) {
        int64_t a = interleaved ? 2 * k : k;
        int64_t b = interleaved ? 2 * k + 1 : k + half;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * cs[size_t(k)] - x1 * sn[size_t(k)];
        v[b] = x1 * cs[size_t(k)] + x0 * sn[size_t(k)];
      }
    }
  });
}

namespace {

inline float read_as_f32(const char* p, DType dt) {
  switch (dt) {
    case DType::f32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::f16: { uint16_t v; std::memcpy(&v, p, 2); return f16_to_f32(v); }
    case DType::bf16: { uint16_t v; std::memcpy(&v, p, 2); return bf16_to_f32(v); }
    case DType::i32: { int32_t v; std::memcpy(&v, p, 4); return float(v); }
    default: throw Unsupported(std::string("copy from ") + dtype_name(dt));
  }
}

inline void write_from_f32(char* p, DType dt, float v) {
  switch (dt) {
    case DType::f32: std::memcpy(p, &v, 4); return;
    case DType::f16: { uint16_t h = f32_to_f16(v); std::memcpy(p, &h, 2); return; }
    case DType::bf16: { uint16_t h = f32_to_bf16(v); std::memcpy(p, &h, 2); return; }
    case DType::i32: { int32_t i = int32_t(v); std::memcpy(p, &i, 4); return; }
    default: throw Unsupported(std::string("copy to ") + dtype_name(dt));
  }
}

}  // namespace

void copy_into(const Array& dst, const Array& src) {
  // Collapse to 4 dims (leading ones), then copy the innermost dimension in runs.
  Shape shape, ds, ss;
  shape.n = ds.n = ss.n = 4;
  const int lead = 4 - dst.ndim();
  for (int i = 0; i < 4; ++i) {
    bool pad = i < lead;
    shape.d[i] = pad ? 1 : dst.shape().d[i - lead];
    ds.d[i] = pad ? 0 : dst.strides().d[i - lead];
    ss.d[i] = pad ? 0 : src.strides().d[i - lead];
  }
  const size_t di = dst.itemsize(), si = src.itemsize();
  char* dp = static_cast<char*>(dst.raw());
  const char* sp = static_cast<const char*>(src.raw());
  const bool same = dst.dtype() == src.dtype() && ds.d[3] == 1 && ss.d[3] == 1;
  for (int64_t a = 0; a < shape.d[0]; ++a)
    for (int64_t b = 0; b < shape.d[1]; ++b)
      for (int64_t c = 0; c < shape.d[2]; ++c) {
        char* drow = dp + (a * ds.d[0] + b * ds.d[1] + c * ds.d[2]) * int64_t(di);
        const char* srow = sp + (a * ss.d[0] + b * ss.d[1] + c * ss.d[2]) * int64_t(si);
        if (same) {
          std::memcpy(drow, srow, size_t(shape.d[3]) * di);
          continue;
        }
        for (int64_t e = 0; e < shape.d[3]; ++e)
          write_from_f32(drow + e * ds.d[3] * int64_t(di), dst.dtype(), read_as_f32(srow + e * ss.d[3] * int64_t(si), src.dtype()));
      }
}

OSPREY_CPU_LEVEL_END
}  // namespace osprey::cpu
