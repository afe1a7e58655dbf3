#include "backend/ops.h"

#include "backend/cpu/basic_ops.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace osprey::ops {
namespace {

void require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw InvalidInput(std::string(op) + ": " + what);
}

void require_cpu(const char* op, std::initializer_list<const Array*> arrays) {
  for (const Array* a : arrays)
    if (a->defined() && !a->device().is_cpu())
      throw Unsupported(std::string(op) + " on " + a->device().str() + " is not available in this build");
}

void require_f32_contiguous(const char* op, const char* name, const Array& a) {
  require(a.defined() && a.dtype() == DType::f32 && a.is_contiguous(), op,
          std::string(name) + " must be contiguous float32, got " + describe(a));
}

void require_float_vector(const char* op, const char* name, const Array& a, int64_t n) {
  require(a.defined() && is_float(a.dtype()) && a.ndim() == 1 && a.dim(0) == n && a.is_contiguous(), op,
          std::string(name) + " must be a float vector of " + std::to_string(n) + ", got " + describe(a));
}

}  // namespace

Array embedding(const Array& table, const Array& ids, float scale) {
  require_cpu("embedding", {&table, &ids});
  require(table.ndim() == 2 && is_float(table.dtype()) && table.is_contiguous(), "embedding",
          "table must be a contiguous float matrix, got " + describe(table));
  require(ids.dtype() == DType::i32 && ids.ndim() == 1, "embedding", "ids must be int32 [n], got " + describe(ids));
  const auto* id = ids.data<int32_t>();
  for (int64_t i = 0; i < ids.numel(); ++i)
    if (id[i] < 0 || id[i] >= table.dim(0))
      throw InvalidInput("token id " + std::to_string(id[i]) + " is outside the vocabulary [0, " +
                         std::to_string(table.dim(0)) + ")");
  Array out = Array::empty({ids.numel(), table.dim(1)}, DType::f32, ids.device());
  cpu::embedding(table, ids, scale, out);
  return out;
}

Array rms_norm(const Array& x, const Array& weight, float eps, bool unit_offset) {
  require_cpu("rms_norm", {&x, &weight});
  require_f32_contiguous("rms_norm", "x", x);
  require_float_vector("rms_norm", "weight", weight, x.dim(-1));
  Array out = Array::empty(x.shape(), DType::f32, x.device());
  cpu::rms_norm(x, weight, eps, unit_offset, out);
  return out;
}

Array layer_norm(const Array& x, const Array& weight, const Array& bias, float eps) {
  require_cpu("layer_norm", {&x, &weight, &bias});
  require_f32_contiguous("layer_norm", "x", x);
  require_float_vector("layer_norm", "weight", weight, x.dim(-1));
  if (bias.defined()) require_float_vector("layer_norm", "bias", bias, x.dim(-1));
  Array out = Array::empty(x.shape(), DType::f32, x.device());
  cpu::layer_norm(x, weight, bias, eps, out);
  return out;
}

Array linear(const Array& x, const Array& w, const Array& bias) {
  require_cpu("linear", {&x, &w, &bias});
  require_f32_contiguous("linear", "x", x);
  require(w.ndim() == 2 && is_float(w.dtype()) && w.is_contiguous(), "linear",
          "weight must be a contiguous float matrix, got " + describe(w));
  const int64_t in = w.dim(1), out_features = w.dim(0);
  require(x.dim(-1) == in, "linear", "input " + describe(x) + " does not match weight " + describe(w));
  if (bias.defined()) {
    require(bias.dtype() == DType::f32 && bias.numel() == out_features, "linear",
            "bias must be float32 [" + std::to_string(out_features) + "], got " + describe(bias));
  }
  const int64_t n = x.numel() / in;
  Array y = Array::empty({n, out_features}, DType::f32, x.device());
  cpu::linear(x.data<float>(), n, in, w.raw(), w.dtype(), out_features,
              bias.defined() ? bias.data<float>() : nullptr, y.data<float>(), cpu_pool());
  return y;
}

void add_(Array& x, const Array& y) {
  require_cpu("add_", {&x, &y});
  require_f32_contiguous("add_", "x", x);
  require_f32_contiguous("add_", "y", y);
  require(x.numel() == y.numel(), "add_", "shapes differ: " + describe(x) + " and " + describe(y));
  cpu::add_(x, y);
}

void scale_(Array& x, float s) {
  require_cpu("scale_", {&x});
  require_f32_contiguous("scale_", "x", x);
  cpu::scale_(x, s);
}

Array silu_mul(const Array& gate, const Array& up) {
  require_cpu("silu_mul", {&gate, &up});
  require_f32_contiguous("silu_mul", "gate", gate);
  require_f32_contiguous("silu_mul", "up", up);
  require(gate.shape() == up.shape(), "silu_mul", "shapes differ: " + describe(gate) + " and " + describe(up));
  Array out = Array::empty(gate.shape(), DType::f32, gate.device());
  cpu::silu_mul(gate, up, out);
  return out;
}

Array gelu_tanh_mul(const Array& gate, const Array& up) {
  require_cpu("gelu_tanh_mul", {&gate, &up});
  require_f32_contiguous("gelu_tanh_mul", "gate", gate);
  require_f32_contiguous("gelu_tanh_mul", "up", up);
  require(gate.shape() == up.shape(), "gelu_tanh_mul", "shapes differ: " + describe(gate) + " and " + describe(up));
  Array out = Array::empty(gate.shape(), DType::f32, gate.device());
  cpu::gelu_tanh_mul(gate, up, out);
  return out;
}

void rope_(Array& x, const Array& positions, const Array& inv_freq, bool interleaved, float mscale) {
  require_cpu("rope_", {&x, &positions, &inv_freq});
  require_f32_contiguous("rope_", "x", x);
  require(x.ndim() == 3 && x.dim(2) % 2 == 0, "rope_", "x must be [n, heads, even head_dim], got " + describe(x));
  require(positions.dtype() == DType::i32 && positions.numel() == x.dim(0), "rope_",
          "positions must be int32 [" + std::to_string(x.dim(0)) + "], got " + describe(positions));
  require(inv_freq.dtype() == DType::f32 && inv_freq.numel() == x.dim(2) / 2, "rope_",
          "inv_freq must be float32 [head_dim / 2], got " + describe(inv_freq));
  cpu::rope_(x, positions, inv_freq, interleaved, mscale);
}

Array attention(const Array& q, const Array& k, const Array& v, const AttentionParams& p) {
  require_cpu("attention", {&q, &k, &v});
  require_f32_contiguous("attention", "q", q);
  require(q.ndim() == 3, "attention", "q must be [n, n_heads, head_dim], got " + describe(q));
  require(k.ndim() == 3 && v.ndim() == 3 && k.dtype() == DType::f16 && v.dtype() == DType::f16, "attention",
          "k and v must be float16 [n_kv_heads, L, head_dim], got " + describe(k) + " and " + describe(v));
  require(k.shape() == v.shape() && k.dim(2) == q.dim(2), "attention",
          "k " + describe(k) + ", v " + describe(v) + " and q " + describe(q) + " disagree");
  require(k.strides()[2] == 1 && v.strides()[2] == 1, "attention", "k and v rows must be contiguous");
  require(k.dim(0) > 0 && q.dim(1) % k.dim(0) == 0, "attention", "n_heads must be a multiple of n_kv_heads");
  require(p.q_pos0 >= 0 && p.q_pos0 + q.dim(0) <= k.dim(1), "attention",
          "query positions run past the " + std::to_string(k.dim(1)) + " cached keys");
  Array out = Array::empty({q.dim(0), q.dim(1) * q.dim(2)}, DType::f32, q.device());
  cpu::AttentionArgs a;
  a.q = q.data<float>();
  a.n = q.dim(0);
  a.n_heads = q.dim(1);
  a.head_dim = q.dim(2);
  a.k = k.data<uint16_t>();
  a.v = v.data<uint16_t>();
  a.n_kv_heads = k.dim(0);
  a.n_keys = k.dim(1);
  a.k_head_stride = k.strides()[0];
  a.k_row_stride = k.strides()[1];
  a.v_head_stride = v.strides()[0];
  a.v_row_stride = v.strides()[1];
  a.q_pos0 = p.q_pos0;
  a.scale = p.scale;
  a.window = p.window;
  a.softcap = p.softcap;
  a.out = out.data<float>();
  cpu::attention(a, cpu_pool());
  return out;
}

void copy_into(const Array& dst, const Array& src) {
  require_cpu("copy_into", {&dst, &src});
  require(dst.shape() == src.shape(), "copy_into", "shapes differ: " + describe(dst) + " and " + describe(src));
  cpu::copy_into(dst, src);
}

Array cast(const Array& src, DType dtype) {
  Array out = Array::empty(src.shape(), dtype, src.device());
  copy_into(out, src);
  return out;
}

}  // namespace osprey::ops
