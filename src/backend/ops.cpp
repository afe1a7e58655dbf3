#include "backend/ops.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cpu/basic_ops.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/kernel_table.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/kv_quant.h"
#include "backend/op_checks.h"
#include "core/buffer.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace osprey::ops {
namespace {

using detail::on_cuda;
using detail::require;

void require_f32_contiguous(const char* op, const char* name, const Array& a) {
  require(a.defined() && a.dtype() == DType::f32 && a.is_contiguous(), op,
          std::string(name) + " must be contiguous float32, got " + describe(a));
}

void require_float_vector(const char* op, const char* name, const Array& a, int64_t n) {
  require(a.defined() && is_float(a.dtype()) && a.ndim() == 1 && a.dim(0) == n && a.is_contiguous(), op,
          std::string(name) + " must be a float vector of " + std::to_string(n) + ", got " + describe(a));
}

void require_f32(const char* op, const char* name, const Array& a) {
  require(!a.defined() || a.dtype() == DType::f32, op,
          std::string(name) + " must be float32 on CUDA (load converts it), got " + describe(a));
}

// NOTE: relaxed is enough: the mode is set between steps by the thread that runs them (ops
// read it on the calling thread), not raced against running ops.
std::atomic<bool> g_batch_invariant{false};

// A pool array of the paged KV cache: contiguous f16 or bf16 [n_blocks, n_kv_heads,
// block_size, head_dim].
void require_pool(const char* op, const char* name, const Array& a) {
  require(a.defined() && a.ndim() == 4 &&
              (a.dtype() == DType::f16 || a.dtype() == DType::bf16 || is_packed_rows(a.dtype())) && a.is_contiguous(),
          op, std::string(name) + " must be a contiguous float16, bfloat16, q8_0 or fp8_e4m3 pool [n_blocks, n_kv_heads, "
                                  "block_size, row], got " + describe(a));
}

// A pool's rows hold head_dim elements (q8_0: a multiple of 32).
void require_pool_rows(const char* op, const char* name, const Array& a, int64_t head_dim) {
  require(a.dim(3) == packed_row_width(a.dtype(), head_dim) && (a.dtype() != DType::q8_0 || head_dim % 32 == 0), op,
          std::string(name) + " " + describe(a) + " does not hold rows of head_dim " + std::to_string(head_dim));
}

// A dense KV cache buffer: contiguous [n_kv_heads, capacity, packed_row_width(type, head_dim)]
// of f16, bf16 or a packed row format (q8_0 needs head_dim % 32 == 0).
void require_kv_buffer(const char* op, const char* name, const Array& a, int64_t head_dim) {
  const DType dt = a.defined() ? a.dtype() : DType::f32;
  require(a.defined() && a.ndim() == 3 && (dt == DType::f16 || dt == DType::bf16 || is_packed_rows(dt)) &&
              a.is_contiguous() && (dt != DType::q8_0 || head_dim % 32 == 0) &&
              a.dim(2) == packed_row_width(dt, head_dim),
          op, std::string(name) + " must be a contiguous float16, bfloat16, q8_0 or fp8_e4m3 buffer [n_kv_heads, capacity, " +
                  "row] for head_dim " + std::to_string(head_dim) + " (q8_0: a multiple of 32), got " + describe(a));
}

// CUDA stores and reads f16 or bf16 rows, one type for keys and values.
void require_cuda_kv_pair(const char* op, const Array& keys, const Array& values) {
  require((keys.dtype() == DType::f16 || keys.dtype() == DType::bf16) && values.dtype() == keys.dtype(), op,
          std::string("a ") + dtype_name(keys.dtype()) + " key and " + dtype_name(values.dtype()) +
              " value cache is not supported on cuda yet (float16 or bfloat16, the same for both)");
}

// One head's row of head_dim floats quantized into `out` (packed_row_width(dt, head_dim) bytes);
// `fixed`: the head's fixed fp8 scale, or null (the row's own).
void quantize_kv_row(DType dt, const float* x, int64_t head_dim, uint8_t* out, const float* fixed = nullptr) {
  if (dt == DType::q8_0)
    kvq::quantize_row_q8_0(x, head_dim, out);
  else if (fixed)
    kvq::quantize_row_fp8_scaled(x, head_dim, *fixed, out);
  else
    kvq::quantize_row_fp8(x, head_dim, out);
}

// Checks one side's fixed scales (KVRowScales) against its buffer of n_kv heads.
void require_row_scales(const char* op, const char* side, std::span<const float> s, const Array& buf, int64_t n_kv) {
  if (s.empty()) return;
  // Every decode step's write: the messages are made only when a check fails.
  require(buf.dtype() == DType::fp8_e4m3, op, [&] {
    return std::string("fixed ") + side + " scales apply to fp8_e4m3 rows, the " + side + " are " + describe(buf);
  });
  require(int64_t(s.size()) == 1 || int64_t(s.size()) == n_kv, op, [&] {
    return std::to_string(s.size()) + " fixed " + side + " scales for " + std::to_string(n_kv) +
           " kv heads (one per head, or one for all)";
  });
  for (float x : s)
    require(std::isfinite(x) && x > 0.0f, op, [&] { return std::string("a fixed ") + side + " scale is " + std::to_string(x); });
}

// Head h's fixed scale of one side, or null.
const float* head_scale(std::span<const float> s, int64_t h) {
  return s.empty() ? nullptr : &s[s.size() == 1 ? 0 : size_t(h)];
}

KVElem kv_elem(DType dt) {
  switch (dt) {
    case DType::bf16: return KVElem::bf16;
    case DType::q8_0: return KVElem::q8_0;
    case DType::fp8_e4m3: return KVElem::fp8_e4m3;
    default: return KVElem::f16;
  }
}

// An int32 array of `ndim` dimensions, contiguous, whose first dimension is n (n < 0: any).
void require_i32(const char* op, const char* name, const Array& a, int ndim, int64_t n, const std::string& shape) {
  require(a.defined() && a.dtype() == DType::i32 && a.ndim() == ndim && a.is_contiguous() && (n < 0 || a.dim(0) == n),
          op, std::string(name) + " must be contiguous int32 " + shape + ", got " + describe(a));
}

// f32 [n, heads, head_dim] with contiguous heads; rows may be strided.
bool strided_rows(const Array& a, int64_t heads, int64_t head_dim) {
  return a.ndim() == 3 && a.dtype() == DType::f32 && a.dim(1) == heads && a.dim(2) == head_dim &&
         a.strides()[2] == 1 && (heads == 1 || a.strides()[1] == head_dim) &&
         (a.dim(0) <= 1 || a.strides()[0] >= heads * head_dim);
}
int64_t row_stride(const Array& a) { return a.dim(0) <= 1 ? a.dim(1) * a.dim(2) : a.strides()[0]; }

// The block of `table` (host memory) that holds row j, checked against the pool.
int64_t checked_block(const char* op, const char* name, const int32_t* table, int64_t at, int64_t n_blocks) {
  const int64_t b = table[at];
  require(b >= 0 && b < n_blocks, op,
          std::string(name) + " entry " + std::to_string(at) + " is block " + std::to_string(b) +
              ", outside the pool's " + std::to_string(n_blocks) + " blocks");
  return b;
}

Array paged_attention(const Array& q, const Array& k, const Array& v, const AttentionParams& ap, const PagedKeys& p) {
  const char* op = "attention (paged)";
  const bool gpu = on_cuda(op, {&q, &k, &v, &p.block_tables, &p.seq_lens});
  require(q.ndim() == 3 && q.dtype() == DType::f32, op, "q must be float32 [n, n_heads, head_dim], got " + describe(q));
  const int64_t n = q.dim(0), n_heads = q.dim(1), hd = q.dim(2);
  require(strided_rows(q, n_heads, hd), op, "q must have contiguous heads (rows may be strided), got " + describe(q));
  require_pool(op, "k", k);
  require_pool(op, "v", v);
  require(v.dim(0) == k.dim(0) && v.dim(1) == k.dim(1) && v.dim(2) == k.dim(2), op,
          "k and v pools differ: " + describe(k) + " and " + describe(v));
  const int64_t n_blocks = k.dim(0), n_kv = k.dim(1), bs = k.dim(2);
  require_pool_rows(op, "k", k, hd);
  require_pool_rows(op, "v", v, hd);
  require(n_kv > 0 && bs > 0 && n_heads % n_kv == 0, op,
          "n_heads " + std::to_string(n_heads) + " must be a multiple of the pool's n_kv_heads " + std::to_string(n_kv) +
              " (and block_size > 0)");
  require_i32(op, "block_tables", p.block_tables, 2, n, "[" + std::to_string(n) + ", max_blocks]");
  require(p.block_tables.dim(1) >= 1, op, "block_tables must have at least one column, got " + describe(p.block_tables));
  require_i32(op, "seq_lens", p.seq_lens, 1, n, "[" + std::to_string(n) + "]");
  require(ap.window >= 0 && ap.softcap >= 0.0f, op,
          "window " + std::to_string(ap.window) + " and softcap " + std::to_string(ap.softcap) + " must be >= 0");
  const int64_t max_blocks = p.block_tables.dim(1);
  Array out = Array::empty({n, n_heads * hd}, DType::f32, q.device());
  if (n == 0) return out;
  PagedAttentionArgs a;
  a.q = q.data<float>();
  a.q_row_stride = row_stride(q);
  a.n = n;
  a.n_heads = n_heads;
  a.head_dim = hd;
  a.k = k.data<uint16_t>();
  a.v = v.data<uint16_t>();
  a.n_blocks = n_blocks;
  a.n_kv_heads = n_kv;
  a.block_size = bs;
  a.block_tables = p.block_tables.data<int32_t>();
  a.seq_lens = p.seq_lens.data<int32_t>();
  a.max_blocks = max_blocks;
  a.scale = ap.scale;
  a.window = ap.window;
  a.softcap = ap.softcap;
  a.out = out.data<float>();
  a.bf16 = k.dtype() == DType::bf16 && v.dtype() == DType::bf16;
  a.k_elem = kv_elem(k.dtype());
  a.v_elem = kv_elem(v.dtype());
  if (p.split_keys != 0) a.split_keys = p.split_keys;
  require(a.split_keys >= 64 && a.split_keys % 64 == 0 && a.split_keys <= (int64_t(1) << 24), op,
          "split_keys " + std::to_string(a.split_keys) + " must be a positive multiple of 64");
  if (gpu) {
    require_cuda_kv_pair(op, k, v);
    // NOTE: the tables and lengths stay on the device (a captured step replays with new
    // ones); the kernel reads no block outside the pool and clamps lengths to the table.
    cuda_ops::paged_attention(a);
    return out;
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = a.seq_lens[i];
    require(len >= 0 && len <= max_blocks * bs, op,
            "seq_lens[" + std::to_string(i) + "] = " + std::to_string(len) + " is outside [0, " +
                std::to_string(max_blocks * bs) + "] (max_blocks " + std::to_string(max_blocks) + " x block_size " +
                std::to_string(bs) + ")");
    // A sliding window reads no block before the one holding its first visible key (a windowed
    // pool has given those back: -1).
    const int64_t lo = ap.window > 0 ? std::max<int64_t>(0, len - ap.window) : 0;
    for (int64_t b = lo / bs; b * bs < len; ++b) checked_block(op, "block_tables", a.block_tables, i * max_blocks + b, n_blocks);
  }
  cpu::kernels().paged_attention(a, cpu_pool());
  return out;
}

}  // namespace

void set_batch_invariant(bool on) { g_batch_invariant.store(on, std::memory_order_relaxed); }
bool batch_invariant() { return g_batch_invariant.load(std::memory_order_relaxed); }

void check_token_ids(std::span<const int32_t> ids, int64_t vocab, const char* what) {
  for (int32_t id : ids)
    if (id < 0 || id >= vocab)
      throw InvalidInput(std::string(what) + " " + std::to_string(id) + " is outside the vocabulary [0, " +
                         std::to_string(vocab) + ")");
}

Array embedding(const Array& table, const Array& ids, float scale) {
  const bool gpu = on_cuda("embedding", {&table, &ids});
  require(table.ndim() == 2 && is_float(table.dtype()) && table.is_contiguous(), "embedding",
          "table must be a contiguous float matrix, got " + describe(table));
  require(ids.dtype() == DType::i32 && ids.ndim() == 1, "embedding", "ids must be int32 [n], got " + describe(ids));
  Array out = Array::empty({ids.numel(), table.dim(1)}, DType::f32, ids.device());
  if (gpu) {
    // NOTE: ids on the device are not range-checked here (that would need a sync); the
    // generator checks prompt ids, and sampled ids are in range by construction.
    cuda_ops::embedding(table.raw(), table.dtype(), ids.data<int32_t>(), ids.numel(), table.dim(1), scale,
                    out.data<float>());
    return out;
  }
  check_token_ids({ids.data<int32_t>(), size_t(ids.numel())}, table.dim(0));
  cpu::kernels().embedding(table, ids, scale, out);
  return out;
}

Array rms_norm(const Array& x, const Array& weight, float eps, bool unit_offset) {
  const bool gpu = on_cuda("rms_norm", {&x, &weight});
  require_f32_contiguous("rms_norm", "x", x);
  require_float_vector("rms_norm", "weight", weight, x.dim(-1));
  Array out = Array::empty(x.shape(), DType::f32, x.device());
  if (gpu) {
    require_f32("rms_norm", "weight", weight);
    cuda_ops::rms_norm(x.data<float>(), weight.data<float>(), x.numel() / x.dim(-1), x.dim(-1), eps,
                   unit_offset ? 1.0f : 0.0f, out.data<float>());
    return out;
  }
  cpu::kernels().rms_norm(x, weight, eps, unit_offset, out);
  return out;
}

Array layer_norm(const Array& x, const Array& weight, const Array& bias, float eps) {
  const bool gpu = on_cuda("layer_norm", {&x, &weight, &bias});
  require_f32_contiguous("layer_norm", "x", x);
  require_float_vector("layer_norm", "weight", weight, x.dim(-1));
  if (bias.defined()) require_float_vector("layer_norm", "bias", bias, x.dim(-1));
  Array out = Array::empty(x.shape(), DType::f32, x.device());
  if (gpu) {
    require_f32("layer_norm", "weight", weight);
    require_f32("layer_norm", "bias", bias);
    cuda_ops::layer_norm(x.data<float>(), weight.data<float>(), bias.defined() ? bias.data<float>() : nullptr,
                     x.numel() / x.dim(-1), x.dim(-1), eps, out.data<float>());
    return out;
  }
  cpu::kernels().layer_norm(x, weight, bias, eps, out);
  return out;
}

Array linear(const Array& x, const Array& w, const Array& bias) {
  const bool gpu = on_cuda("linear", {&x, &w, &bias});
  require_f32_contiguous("linear", "x", x);
  require(w.ndim() == 2 && is_float(w.dtype()) && w.is_contiguous(), "linear",
          "weight must be a contiguous float matrix, got " + describe(w));
  const int64_t in = w.dim(1), out_features = w.dim(0);
  require(x.dim(-1) == in, "linear", "input " + describe(x) + " does not match weight " + describe(w));
  if (bias.defined())
    require(bias.dtype() == DType::f32 && bias.numel() == out_features, "linear",
            "bias must be float32 [" + std::to_string(out_features) + "], got " + describe(bias));
  const int64_t n = x.numel() / in;
  Array y = Array::empty({n, out_features}, DType::f32, x.device());
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  const bool invariant = batch_invariant();
  if (gpu) {
    cuda_ops::linear(x.data<float>(), n, in, w.raw(), w.dtype(), out_features, b, y.data<float>(), invariant);
    return y;
  }
  if (invariant)
    cpu::kernels().linear_invariant(x.data<float>(), n, in, w.raw(), w.dtype(), out_features, b, y.data<float>(),
                                    cpu_pool());
  else
    cpu::kernels().linear(x.data<float>(), n, in, w.raw(), w.dtype(), out_features, b, y.data<float>(), cpu_pool());
  return y;
}

void add_(Array& x, const Array& y) {
  const bool gpu = on_cuda("add_", {&x, &y});
  require_f32_contiguous("add_", "x", x);
  require_f32_contiguous("add_", "y", y);
  require(x.numel() == y.numel(), "add_", "shapes differ: " + describe(x) + " and " + describe(y));
  if (gpu) {
    cuda_ops::add_inplace(x.data<float>(), y.data<float>(), x.numel());
    return;
  }
  cpu::kernels().add_(x, y);
}

void scale_(Array& x, float s) {
  const bool gpu = on_cuda("scale_", {&x});
  require_f32_contiguous("scale_", "x", x);
  if (gpu) {
    cuda_ops::scale_inplace(x.data<float>(), s, x.numel());
    return;
  }
  cpu::kernels().scale_(x, s);
}

Array add_rms_norm(Array& x, const Array& y, const Array& weight, float eps, bool unit_offset) {
  const bool gpu = on_cuda("add_rms_norm", {&x, &y, &weight});
  require_f32_contiguous("add_rms_norm", "x", x);
  require_f32_contiguous("add_rms_norm", "y", y);
  require(x.shape() == y.shape(), "add_rms_norm", "shapes differ: " + describe(x) + " and " + describe(y));
  require_float_vector("add_rms_norm", "weight", weight, x.dim(-1));
  if (gpu) {
    require_f32("add_rms_norm", "weight", weight);
    Array out = Array::empty(x.shape(), DType::f32, x.device());
    cuda_ops::add_rms_norm(x.data<float>(), y.data<float>(), weight.data<float>(), x.numel() / x.dim(-1), x.dim(-1), eps,
                       unit_offset ? 1.0f : 0.0f, out.data<float>());
    return out;
  }
  cpu::kernels().add_(x, y);
  return rms_norm(x, weight, eps, unit_offset);
}

Array silu_mul_split(const Array& gu) {
  const bool gpu = on_cuda("silu_mul_split", {&gu});
  require_f32_contiguous("silu_mul_split", "gu", gu);
  require(gu.ndim() == 2 && gu.dim(1) % 2 == 0, "silu_mul_split", "gu must be [n, 2f], got " + describe(gu));
  const int64_t n = gu.dim(0), f = gu.dim(1) / 2;
  Array out = Array::empty({n, f}, DType::f32, gu.device());
  if (gpu) {
    cuda_ops::silu_mul_split(gu.data<float>(), n, f, out.data<float>());
    return out;
  }
  const Shape half{n, f}, strides{2 * f, 1};
  Array g = Array::strided(gu.buffer(), gu.byte_offset(), half, strides, DType::f32);
  Array u = Array::strided(gu.buffer(), gu.byte_offset() + size_t(f) * 4, half, strides, DType::f32);
  cpu::kernels().silu_mul(cast(g, DType::f32), cast(u, DType::f32), out);
  return out;
}

Array gelu_tanh_mul_split(const Array& gu) {
  const bool gpu = on_cuda("gelu_tanh_mul_split", {&gu});
  require_f32_contiguous("gelu_tanh_mul_split", "gu", gu);
  require(gu.ndim() == 2 && gu.dim(1) % 2 == 0, "gelu_tanh_mul_split", "gu must be [n, 2f], got " + describe(gu));
  const int64_t n = gu.dim(0), f = gu.dim(1) / 2;
  Array out = Array::empty({n, f}, DType::f32, gu.device());
  if (gpu) {
    cuda_ops::gelu_tanh_mul_split(gu.data<float>(), n, f, out.data<float>());
    return out;
  }
  cpu::kernels().gelu_tanh_mul_split(gu, out);
  return out;
}

void head_rms_norm_(Array& x, const Array& weight, float eps, bool unit_offset) {
  const bool gpu = on_cuda("head_rms_norm_", {&x, &weight});
  require(x.ndim() == 3 && x.dtype() == DType::f32, "head_rms_norm_",
          "x must be float32 [n, heads, head_dim], got " + describe(x));
  require(x.strides()[2] == 1 && (x.dim(1) == 1 || x.strides()[1] == x.dim(2)) &&
              (x.dim(0) == 1 || x.strides()[0] >= x.dim(1) * x.dim(2)),
          "head_rms_norm_", "x must have contiguous heads (rows may be strided), got " + describe(x));
  require(weight.defined() && weight.dtype() == DType::f32 && weight.ndim() == 1 && weight.dim(0) == x.dim(2) &&
              weight.is_contiguous(),
          "head_rms_norm_", "weight must be float32 [" + std::to_string(x.dim(2)) + "], got " + describe(weight));
  const int64_t n = x.dim(0), heads = x.dim(1), hd = x.dim(2);
  const int64_t row_stride = n == 1 ? heads * hd : x.strides()[0];
  if (gpu) {
    cuda_ops::head_rms_norm(x.data<float>(), n, heads, hd, row_stride, weight.data<float>(), eps,
                            unit_offset ? 1.0f : 0.0f);
    return;
  }
  cpu::kernels().head_rms_norm_(x, weight, eps, unit_offset);
}

void softcap_(Array& x, float cap) {
  const bool gpu = on_cuda("softcap_", {&x});
  require_f32_contiguous("softcap_", "x", x);
  require(cap > 0.0f && std::isfinite(cap), "softcap_", "cap must be positive and finite, got " + std::to_string(cap));
  if (gpu) {
    cuda_ops::softcap_inplace(x.data<float>(), cap, x.numel());
    return;
  }
  cpu::kernels().softcap_(x, cap);
}

void write_kv_rows(const Array& keys, const Array& values, const Array& k, const Array& v, int64_t row0,
                   const Array& positions, int64_t ring_rows, const KVRowScales& scales) {
  const bool gpu = on_cuda("write_kv_rows", {&keys, &values, &k, &v, &positions});
  require(k.ndim() == 3, "write_kv_rows", [&] { return "k must be float32 [n, n_kv_heads, head_dim], got " + describe(k); });
  const int64_t hd = k.dim(2);
  require_kv_buffer("write_kv_rows", "keys", keys, hd);
  require_kv_buffer("write_kv_rows", "values", values, hd);
  require(keys.dim(0) == values.dim(0) && keys.dim(1) == values.dim(1), "write_kv_rows",
          [&] { return "keys " + describe(keys) + " and values " + describe(values) + " differ in heads or capacity"; });
  const int64_t n_kv = keys.dim(0), cap = keys.dim(1);
  require_row_scales("write_kv_rows", "keys", scales.k, keys, n_kv);
  require_row_scales("write_kv_rows", "values", scales.v, values, n_kv);
  auto check_rows = [&](const char* name, const Array& a) {
    require(a.ndim() == 3 && a.dtype() == DType::f32 && a.dim(1) == n_kv && a.dim(2) == hd && a.strides()[2] == 1 &&
                (n_kv == 1 || a.strides()[1] == hd),
            "write_kv_rows", [&] {
              return std::string(name) + " must be float32 [n, " + std::to_string(n_kv) + ", " + std::to_string(hd) +
                     "] with contiguous heads, got " + describe(a);
            });
  };
  check_rows("k", k);
  check_rows("v", v);
  const int64_t n = k.dim(0);
  require(v.dim(0) == n, "write_kv_rows", "k and v row counts differ");
  if (ring_rows > 0)
    require(ring_rows == cap && row0 >= 0 && n <= cap, "write_kv_rows", [&] {
      return "a ring of " + std::to_string(ring_rows) + " rows needs buffers of that many rows (got " +
             std::to_string(cap) + ") and at most that many rows at position >= 0 (got " + std::to_string(n) +
             " at " + std::to_string(row0) + ")";
    });
  else
    require(ring_rows == 0 && row0 >= 0 && row0 + n <= cap, "write_kv_rows", [&] {
      return "rows [" + std::to_string(row0) + ", " + std::to_string(row0 + n) + ") run past the capacity " +
             std::to_string(cap) + " (or ring_rows " + std::to_string(ring_rows) + " < 0)";
    });
  const bool bf16 = keys.dtype() == DType::bf16;
  if (positions.defined())
    require(positions.dtype() == DType::i32 && positions.numel() >= 1, "write_kv_rows",
            "positions must be int32 [n], got " + describe(positions));
  if (gpu) {
    require_cuda_kv_pair("write_kv_rows", keys, values);
    KVWriteArgs a;
    a.kbuf = keys.data<uint16_t>();
    a.vbuf = values.data<uint16_t>();
    a.head_stride = cap * hd;
    a.k = k.data<float>();
    a.v = v.data<float>();
    a.k_row_stride = n == 1 ? n_kv * hd : k.strides()[0];
    a.v_row_stride = n == 1 ? n_kv * hd : v.strides()[0];
    a.n = n;
    a.n_kv_heads = n_kv;
    a.head_dim = hd;
    a.pos_dev = positions.defined() ? positions.data<int32_t>() : nullptr;
    a.pos0 = row0;
    a.bf16 = bf16;
    a.ring_rows = ring_rows;
    cuda_ops::kv_write(a);
    return;
  }
  // [n, n_kv, hd] rows -> the buffer's [n_kv, row .. row + m, width] (a transposing copy, or
  // each head's row quantized where it lands), in at most two runs when a ring wraps.
  auto write_run = [&](const Array& buf, const Array& src, std::span<const float> fixed, int64_t src0, int64_t dst_row,
                       int64_t m) {
    const int64_t width = buf.dim(2);
    if (is_packed_rows(buf.dtype())) {
      uint8_t* base = static_cast<uint8_t*>(buf.raw());
      const int64_t rs = n == 1 ? n_kv * hd : src.strides()[0];
      const float* sp = src.data<float>() + src0 * rs;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t h = 0; h < n_kv; ++h)
          quantize_kv_row(buf.dtype(), sp + i * rs + h * hd, hd, base + (h * cap + dst_row + i) * width,
                          head_scale(fixed, h));
      return;
    }
    const Shape dst_shape{m, n_kv, hd}, dst_strides{hd, cap * hd, 1};
    const size_t off = size_t(dst_row * hd) * 2;
    cpu::kernels().copy_into(
        Array::strided(buf.buffer(), buf.byte_offset() + off, dst_shape, dst_strides, buf.dtype()),
        Array::strided(src.buffer(), src.byte_offset() + size_t(src0 * src.strides()[0]) * 4, {m, n_kv, hd},
                       src.strides(), DType::f32));
  };
  auto write_both = [&](int64_t src0, int64_t dst_row, int64_t m) {
    write_run(keys, k, scales.k, src0, dst_row, m);
    write_run(values, v, scales.v, src0, dst_row, m);
  };
  if (ring_rows == 0) {
    write_both(0, row0, n);
    return;
  }
  const int64_t first = row0 % ring_rows, m0 = std::min(n, ring_rows - first);
  write_both(0, first, m0);
  if (m0 < n) write_both(m0, 0, n - m0);
}

void write_kv_paged(const Array& keys, const Array& values, const Array& k, const Array& v, const Array& slots,
                    const KVRowScales& scales) {
  const char* op = "write_kv_paged";
  const bool gpu = on_cuda(op, {&keys, &values, &k, &v, &slots});
  require_pool(op, "keys", keys);
  require_pool(op, "values", values);
  require(values.dim(0) == keys.dim(0) && values.dim(1) == keys.dim(1) && values.dim(2) == keys.dim(2), op,
          [&] { return "keys and values differ: " + describe(keys) + " and " + describe(values); });
  require(k.ndim() == 3, op, [&] { return "k must be float32 [n, n_kv_heads, head_dim], got " + describe(k); });
  const int64_t n_blocks = keys.dim(0), n_kv = keys.dim(1), bs = keys.dim(2), hd = k.dim(2);
  require_pool_rows(op, "keys", keys, hd);
  require_pool_rows(op, "values", values, hd);
  require_row_scales(op, "keys", scales.k, keys, n_kv);
  require_row_scales(op, "values", scales.v, values, n_kv);
  auto check_rows = [&](const char* name, const Array& a) {
    require(strided_rows(a, n_kv, hd), op, [&] {
      return std::string(name) + " must be float32 [n, " + std::to_string(n_kv) + ", " + std::to_string(hd) +
             "] with contiguous heads, got " + describe(a);
    });
  };
  check_rows("k", k);
  check_rows("v", v);
  const int64_t n = k.dim(0);
  require(v.dim(0) == n, op, [&] { return "k and v row counts differ: " + describe(k) + " and " + describe(v); });
  require_i32(op, "slots", slots, 1, n, "[" + std::to_string(n) + "]");
  if (n == 0) return;
  PagedKVWriteArgs a;
  a.kpool = keys.data<uint16_t>();
  a.vpool = values.data<uint16_t>();
  a.n_blocks = n_blocks;
  a.n_kv_heads = n_kv;
  a.block_size = bs;
  a.head_dim = hd;
  a.k = k.data<float>();
  a.v = v.data<float>();
  a.k_row_stride = row_stride(k);
  a.v_row_stride = row_stride(v);
  a.slots = slots.data<int32_t>();
  a.n = n;
  a.bf16 = keys.dtype() == DType::bf16;
  if (gpu) {
    require_cuda_kv_pair(op, keys, values);
    // NOTE: slots stay on the device; the kernel skips a slot outside the pool like a negative one.
    cuda_ops::kv_write_paged(a);
    return;
  }
  const int64_t cap = n_blocks * bs;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = a.slots[i];
    require(slot < cap, op,
            "slots[" + std::to_string(i) + "] = " + std::to_string(slot) + " is past the pool's " + std::to_string(cap) +
                " rows");
  }
  // Row i: [n_kv, hd] of the source -> [n_kv, hd] at stride block_size * hd in its block,
  // through the element conversion that write_kv_rows uses.
  const Shape dst_shape{n_kv, hd}, dst_strides{bs * hd, 1}, src_shape{n_kv, hd}, src_strides{hd, 1};
  auto write_row = [&](const Array& pool, const Array& x, std::span<const float> fixed, int64_t stride, int64_t i,
                       int64_t slot) {
    const int64_t row0 = (slot / bs) * n_kv * bs + slot % bs;  // head 0's row in the pool
    if (is_packed_rows(pool.dtype())) {
      // Each head's row quantized where it lands.
      const int64_t width = pool.dim(3);
      uint8_t* base = static_cast<uint8_t*>(pool.raw());
      const float* src = x.data<float>() + i * stride;
      for (int64_t h = 0; h < n_kv; ++h)
        quantize_kv_row(pool.dtype(), src + h * hd, hd, base + (row0 + h * bs) * width, head_scale(fixed, h));
      return;
    }
    cpu::kernels().copy_into(
        Array::strided(pool.buffer(), pool.byte_offset() + size_t(row0 * hd) * 2, dst_shape, dst_strides, pool.dtype()),
        Array::strided(x.buffer(), x.byte_offset() + size_t(i * stride) * 4, src_shape, src_strides, DType::f32));
  };
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = a.slots[i];
    if (slot < 0) continue;
    write_row(keys, k, scales.k, a.k_row_stride, i, slot);
    write_row(values, v, scales.v, a.v_row_stride, i, slot);
  }
}

Array gather_kv_blocks(const Array& pool, const Array& block_ids, int64_t n_rows) {
  const char* op = "gather_kv_blocks";
  const bool gpu = on_cuda(op, {&pool, &block_ids});
  require_pool(op, "pool", pool);
  // hd: the row's width (elements, or bytes of a packed row).
  const int64_t n_blocks = pool.dim(0), n_kv = pool.dim(1), bs = pool.dim(2), hd = pool.dim(3);
  require(n_rows >= 0 && bs > 0, op, "n_rows " + std::to_string(n_rows) + " must be >= 0");
  const int64_t need = (n_rows + bs - 1) / bs;
  require_i32(op, "block_ids", block_ids, 1, -1, "[>= " + std::to_string(need) + "]");
  require(block_ids.dim(0) >= need, op,
          "block_ids " + describe(block_ids) + " holds fewer than the " + std::to_string(need) + " blocks of " +
              std::to_string(n_rows) + " rows");
  Array out = Array::empty({n_kv, n_rows, hd}, pool.dtype(), pool.device());
  if (n_rows == 0 || n_kv == 0 || hd == 0) return out;
  if (gpu) {
    require(pool.dtype() == DType::f16 || pool.dtype() == DType::bf16, op,
            std::string("a ") + dtype_name(pool.dtype()) + " pool is not supported on cuda yet");
    PagedGatherArgs a;
    a.pool = pool.data<uint16_t>();
    a.n_blocks = n_blocks;
    a.n_kv_heads = n_kv;
    a.block_size = bs;
    a.head_dim = hd;
    a.block_ids = block_ids.data<int32_t>();
    a.n_rows = n_rows;
    a.out = out.data<uint16_t>();
    cuda_ops::gather_kv_blocks(a);
    return out;
  }
  const int32_t* ids = block_ids.data<int32_t>();
  for (int64_t jb = 0; jb < need; ++jb) {
    const int64_t b = checked_block(op, "block_ids", ids, jb, n_blocks), m = std::min(bs, n_rows - jb * bs);
    const Shape shape{n_kv, m, hd};
    const size_t item = pool.itemsize();
    cpu::kernels().copy_into(Array::strided(out.buffer(), out.byte_offset() + size_t(jb * bs * hd) * item, shape,
                                            {n_rows * hd, hd, 1}, pool.dtype()),
                             Array::strided(pool.buffer(), pool.byte_offset() + size_t(b * n_kv * bs * hd) * item, shape,
                                            {bs * hd, hd, 1}, pool.dtype()));
  }
  return out;
}

namespace {

// act(gate) * up element-wise, for the activations of a gated MLP.
Array gated(const char* op, const Array& gate, const Array& up,
            void (*cuda_fn)(const float*, const float*, float*, int64_t),
            decltype(cpu::KernelTable::silu_mul) cpu::KernelTable::*cpu_fn) {
  const bool gpu = on_cuda(op, {&gate, &up});
  require_f32_contiguous(op, "gate", gate);
  require_f32_contiguous(op, "up", up);
  require(gate.shape() == up.shape(), op, "shapes differ: " + describe(gate) + " and " + describe(up));
  Array out = Array::empty(gate.shape(), DType::f32, gate.device());
  if (gpu)
    cuda_fn(gate.data<float>(), up.data<float>(), out.data<float>(), gate.numel());
  else
    (cpu::kernels().*cpu_fn)(gate, up, out);
  return out;
}

}  // namespace

Array silu_mul(const Array& gate, const Array& up) {
  return gated("silu_mul", gate, up, &cuda_ops::silu_mul, &cpu::KernelTable::silu_mul);
}

Array gelu_tanh_mul(const Array& gate, const Array& up) {
  return gated("gelu_tanh_mul", gate, up, &cuda_ops::gelu_tanh_mul, &cpu::KernelTable::gelu_tanh_mul);
}

void rope_(Array& x, const Array& positions, const Array& inv_freq, bool interleaved, float mscale) {
  const bool gpu = on_cuda("rope_", {&x, &positions, &inv_freq});
  require(x.ndim() == 3 && x.dim(2) % 2 == 0 && x.dtype() == DType::f32, "rope_",
          "x must be float32 [n, heads, even head_dim], got " + describe(x));
  require(x.strides()[2] == 1 && (x.dim(1) == 1 || x.strides()[1] == x.dim(2)) &&
              (x.dim(0) == 1 || x.strides()[0] >= x.dim(1) * x.dim(2)),
          "rope_", "x must have contiguous heads (rows may be strided), got " + describe(x));
  require(positions.dtype() == DType::i32 && positions.numel() == x.dim(0), "rope_",
          "positions must be int32 [" + std::to_string(x.dim(0)) + "], got " + describe(positions));
  require(inv_freq.dtype() == DType::f32 && inv_freq.numel() == x.dim(2) / 2, "rope_",
          "inv_freq must be float32 [head_dim / 2], got " + describe(inv_freq));
  if (gpu) {
    cuda_ops::rope_inplace(x.data<float>(), x.dim(0), x.dim(1), x.dim(2), x.dim(0) == 1 ? x.dim(1) * x.dim(2) : x.strides()[0],
                       positions.data<int32_t>(),
                       inv_freq.data<float>(), interleaved, mscale);
    return;
  }
  cpu::kernels().rope_(x, positions, inv_freq, interleaved, mscale);
}

Array attention(const Array& q, const Array& k, const Array& v, const AttentionParams& p) {
  if (const auto* paged = std::get_if<PagedKeys>(&p.keys)) return paged_attention(q, k, v, p, *paged);
  const auto* ring = std::get_if<RingKeys>(&p.keys);
  const int64_t R = ring ? ring->rows : 0;
  const int64_t key_pos0 = ring ? 0 : std::get<LinearKeys>(p.keys).key_pos0;
  const bool gpu = on_cuda("attention", {&q, &k, &v});
  require_f32_contiguous("attention", "q", q);
  require(q.ndim() == 3, "attention", "q must be [n, n_heads, head_dim], got " + describe(q));
  auto kv_type = [](DType dt) { return dt == DType::f16 || dt == DType::bf16 || is_packed_rows(dt); };
  require(k.ndim() == 3 && v.ndim() == 3 && kv_type(k.dtype()) && kv_type(v.dtype()), "attention",
          "k and v must be float16, bfloat16, q8_0 or fp8_e4m3 [n_kv_heads, L, row], got " + describe(k) + " and " +
              describe(v));
  const int64_t hd = q.dim(2);
  require(k.dim(0) == v.dim(0) && k.dim(1) == v.dim(1) && k.dim(2) == packed_row_width(k.dtype(), hd) &&
              v.dim(2) == packed_row_width(v.dtype(), hd) &&
              ((k.dtype() != DType::q8_0 && v.dtype() != DType::q8_0) || hd % 32 == 0),
          "attention", "k " + describe(k) + ", v " + describe(v) + " and q " + describe(q) + " disagree");
  require(k.strides()[2] == 1 && v.strides()[2] == 1, "attention", "k and v rows must be contiguous");
  require(k.dim(0) > 0 && q.dim(1) % k.dim(0) == 0, "attention", "n_heads must be a multiple of n_kv_heads");
  const int64_t n = q.dim(0);
  require(p.q_pos0 >= 0 && key_pos0 >= 0 && (!ring || R > 0), "attention",
          "q_pos0 " + std::to_string(p.q_pos0) + ", key_pos0 " + std::to_string(key_pos0) + " and ring rows " +
              std::to_string(R) + " must be >= 0 (a ring: > 0)");
  // The keys as the kernels index them: key j at position key_lo + j (in a ring, at row
  // (ring_base + j) % R).
  int64_t n_keys = k.dim(1), key_lo = key_pos0, ring_base = 0;
  if (ring) {
    require(k.dim(1) == R, "attention",
            "a ring of " + std::to_string(R) + " rows needs k and v of that many rows, got " + describe(k));
    require(p.window > 0 && p.window + n - 1 <= R, "attention",
            "a ring of " + std::to_string(R) + " rows serves " + std::to_string(n) +
                " queries only with a window of at most " + std::to_string(R - n + 1) + " (window " +
                std::to_string(p.window) + ")");
    n_keys = std::min(p.q_pos0 + n, R);
    key_lo = p.q_pos0 + n - n_keys;
    ring_base = key_lo % R;
  } else {
    require(p.q_pos0 >= key_pos0 && p.q_pos0 - key_pos0 + n <= k.dim(1), "attention",
            "query positions [" + std::to_string(p.q_pos0) + ", " + std::to_string(p.q_pos0 + n) + ") run past the " +
                std::to_string(k.dim(1)) + " cached keys from position " + std::to_string(key_pos0));
    require(key_pos0 == 0 || (p.window > 0 && p.q_pos0 - p.window + 1 >= key_pos0), "attention",
            "keys from position " + std::to_string(key_pos0) + " leave out keys that the query at " +
                std::to_string(p.q_pos0) + " sees (window " + std::to_string(p.window) + ")");
  }
  Array out = Array::empty({q.dim(0), q.dim(1) * q.dim(2)}, DType::f32, q.device());
  if (p.positions.defined())
    require(p.positions.device() == q.device() && p.positions.dtype() == DType::i32 &&
                p.positions.numel() == q.dim(0) && p.max_keys >= k.dim(1),
            "attention", "positions need an int32 [n] array on q's device and max_keys >= the cached keys, got " +
                             describe(p.positions) + " and max_keys " + std::to_string(p.max_keys));
  AttentionArgs a;
  a.q = q.data<float>();
  a.n = q.dim(0);
  a.n_heads = q.dim(1);
  a.head_dim = q.dim(2);
  a.k = k.data<uint16_t>();
  a.v = v.data<uint16_t>();
  a.bf16 = k.dtype() == DType::bf16 && v.dtype() == DType::bf16;
  a.k_elem = kv_elem(k.dtype());
  a.v_elem = kv_elem(v.dtype());
  a.n_kv_heads = k.dim(0);
  a.n_keys = n_keys;
  a.k_head_stride = k.strides()[0];
  a.k_row_stride = k.strides()[1];
  a.v_head_stride = v.strides()[0];
  a.v_row_stride = v.strides()[1];
  a.q_pos0 = p.q_pos0 - key_lo;
  a.ring_rows = R;
  a.ring_base = ring_base;
  a.key_pos0 = key_pos0;
  a.scale = p.scale;
  a.window = p.window;
  a.softcap = p.softcap;
  a.out = out.data<float>();
  a.batch_invariant = batch_invariant();
  if (gpu) {
    require_cuda_kv_pair("attention", k, v);
    if (p.positions.defined()) {
      a.q_pos_dev = p.positions.data<int32_t>();
      a.max_keys = p.max_keys;
    }
    cuda_ops::attention(a);
    return out;
  }
  cpu::kernels().attention(a, cpu_pool());
  return out;
}

Array attention_unmasked(const Array& q, const Array& k, const Array& v, float scale) {
  require(k.ndim() == 3 && k.dim(1) > 0, "attention_unmasked",
          "k must be [n_kv_heads, L, head_dim] with L >= 1, got " + describe(k));
  require_f32_contiguous("attention_unmasked", "q", q);
  require(q.ndim() == 3, "attention_unmasked", "q must be [n, n_heads, head_dim], got " + describe(q));
  // Each query row alone at the last key's position: attention()'s causal bound then covers
  // every key. NOTE: one call per row (the kernels' multi-row items assume the rows' positions
  // lie within the keys; a row of one item never does here).
  const int64_t n = q.dim(0), L = k.dim(1);
  Array out = Array::empty({n, q.dim(1) * q.dim(2)}, DType::f32, q.device());
  AttentionParams p;
  p.q_pos0 = L - 1;
  p.scale = scale;
  p.keys = LinearKeys{0};
  for (int64_t i = 0; i < n; ++i) copy_into(out.slice_rows(i, i + 1), attention(q.slice_rows(i, i + 1), k, v, p));
  return out;
}

void copy_into(const Array& dst, const Array& src) {
  require(dst.shape() == src.shape(), "copy_into", "shapes differ: " + describe(dst) + " and " + describe(src));
  const bool dst_gpu = !dst.device().is_cpu(), src_gpu = !src.device().is_cpu();
  if (dst_gpu != src_gpu) {
    // Across devices: both sides contiguous and of one dtype (to_device makes them so).
    require(dst.is_contiguous() && src.is_contiguous() && dst.dtype() == src.dtype(), "copy_into",
            "a copy between devices needs contiguous arrays of one dtype");
    // NOTE: an upload from pageable memory returns once the source is staged, so only a
    // download waits for the stream (the host reads the result next).
    if (dst_gpu)
      cuda_ops::copy_to_device(dst.raw(), src.raw(), src.nbytes());
    else
      cuda_ops::copy_to_host(dst.raw(), src.raw(), src.nbytes());
    return;
  }
  if (dst_gpu) {
    if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
      // Any dtype (packed uint32 words included): a plain device copy.
      cuda_ops::copy_on_device(dst.raw(), src.raw(), src.nbytes());
      return;
    }
    require(dst.ndim() <= 4, "copy_into", "more than 4 dimensions");
    int64_t shape[4], ds[4], ss[4];
    const int lead = 4 - dst.ndim();
    for (int i = 0; i < 4; ++i) {
      const bool pad = i < lead;
      shape[i] = pad ? 1 : dst.shape().d[i - lead];
      ds[i] = pad ? 0 : dst.strides().d[i - lead];
      ss[i] = pad ? 0 : src.strides().d[i - lead];
    }
    cuda_ops::copy_strided(dst.raw(), dst.dtype(), ds, src.raw(), src.dtype(), ss, shape);
    return;
  }
  cpu::kernels().copy_into(dst, src);
}

void fill_i32_(Array& a, int32_t value) {
  const bool gpu = on_cuda("fill_i32_", {&a});
  require(a.dtype() == DType::i32 && a.is_contiguous(), "fill_i32_", "a must be contiguous int32, got " + describe(a));
  if (gpu) {
    cuda_ops::fill_i32(a.data<int32_t>(), value, a.numel());
    return;
  }
  std::fill(a.data<int32_t>(), a.data<int32_t>() + a.numel(), value);
}

void sample_into(const Array& logits, const DeviceSampling& p, uint64_t counter, Array& out) {
  const bool gpu = on_cuda("sample_into", {&logits, &out});
  require(gpu, "sample_into", "needs arrays on a CUDA device (the CPU samples on the host)");
  require_f32_contiguous("sample_into", "logits", logits);
  require(out.dtype() == DType::i32 && out.numel() >= 1, "sample_into", "out must be int32 [1], got " + describe(out));
  if (gpu) {
    const int64_t vocab = logits.dim(-1);
    const float* row = logits.data<float>() + (logits.numel() - vocab);
    if (p.temperature <= 0.0f) {
      cuda_ops::argmax(row, vocab, out.data<int32_t>());
    } else {
      SampleArgs a;
      a.temperature = p.temperature;
      a.top_k = p.top_k;
      a.top_p = p.top_p;
      a.min_p = p.min_p;
      a.seed = p.seed;
      a.counter = counter;
      cuda_ops::sample(row, vocab, a, out.data<int32_t>());
    }
  }
}

void sample_rows(Array& logits, std::span<const SampleRowArgs> rows, std::span<const LogitAdjust> adjust, Array& out,
                 Array& nonfinite, const Array& allowed) {
  const bool gpu = allowed.defined() ? on_cuda("sample_rows", {&logits, &out, &nonfinite, &allowed})
                                     : on_cuda("sample_rows", {&logits, &out, &nonfinite});
  require(gpu, "sample_rows", "needs arrays on a CUDA device (the CPU samples on the host)");
  require(logits.defined() && logits.dtype() == DType::f32 && logits.is_contiguous() && logits.ndim() == 2 &&
              logits.dim(1) >= 1,
          "sample_rows", "logits must be contiguous float32 [n, vocab] with vocab >= 1, got " + describe(logits));
  const int64_t n = logits.dim(0), vocab = logits.dim(1);
  require(int64_t(rows.size()) == n, "sample_rows",
          "needs one parameter set per row: " + std::to_string(rows.size()) + " for " + std::to_string(n) + " rows");
  require(vocab <= INT32_MAX, "sample_rows", "logits has " + std::to_string(vocab) + " columns, more than int32 ids reach");
  for (const Array* a : {&out, &nonfinite})
    require(a->defined() && a->dtype() == DType::i32 && a->is_contiguous() && a->ndim() == 1 && a->dim(0) == n,
            "sample_rows", "out and nonfinite must be contiguous int32 [" + std::to_string(n) + "], got " + describe(*a));
  if (allowed.defined())
    require(allowed.dtype() == DType::u32 && allowed.is_contiguous() && allowed.ndim() == 2 && allowed.dim(0) == n &&
                allowed.dim(1) >= 1,
            "sample_rows", "allowed must be contiguous uint32 [" + std::to_string(n) + ", words >= 1], got " +
                               describe(allowed));
  for (const SampleRowArgs& r : rows)
    require(r.adjust_begin >= 0 && r.adjust_begin <= r.adjust_end && size_t(r.adjust_end) <= adjust.size(),
            "sample_rows", "a row's adjustments [" + std::to_string(r.adjust_begin) + ", " +
                               std::to_string(r.adjust_end) + ") lie outside the " + std::to_string(adjust.size()) +
                               " given");
  int cuts = 0;
  for (const SampleRowArgs& r : rows) {
    for (int32_t k = r.adjust_begin; k < r.adjust_end; ++k) {
      const int32_t id = adjust[size_t(k)].id;
      require(id >= 0 && id < vocab, "sample_rows",
              "an adjustment names token " + std::to_string(id) + ", outside [0, " + std::to_string(vocab) + ")");
      require(k == r.adjust_begin || adjust[size_t(k) - 1].id < id, "sample_rows",
              "a row's adjustments must name distinct ids in ascending order (token " + std::to_string(id) + ")");
    }
    if (r.temperature > 0.0f) {
      if (r.top_k > 0) cuts |= kSampleCutTopK;
      if (r.top_p < 1.0f) cuts |= kSampleCutTopP;
      if (r.typical_p < 1.0f) cuts |= kSampleCutTypical;
    }
  }
  if (n == 0) return;
  // The parameters travel as one upload: rows, then the adjustments.
  static_assert(sizeof(SampleRowArgs) % 8 == 0 && sizeof(LogitAdjust) % 4 == 0, "packed as words");
  const size_t row_bytes = rows.size_bytes(), bytes = row_bytes + adjust.size_bytes();
  Array host = Array::empty({int64_t(bytes / 4)}, DType::i32);
  std::memcpy(host.raw(), rows.data(), row_bytes);
  if (!adjust.empty()) std::memcpy(static_cast<char*>(host.raw()) + row_bytes, adjust.data(), adjust.size_bytes());
  const Array dev = to_device(host, logits.device());
  const auto* args = static_cast<const SampleRowArgs*>(dev.raw());
  const auto* adj = adjust.empty() ? nullptr
                                   : reinterpret_cast<const LogitAdjust*>(static_cast<const char*>(dev.raw()) + row_bytes);
  cuda_ops::sample_rows(logits.data<float>(), n, vocab, args, adj, allowed.defined() ? allowed.data<uint32_t>() : nullptr,
                        allowed.defined() ? allowed.dim(1) : 0, cuts, out.data<int32_t>(), nonfinite.data<int32_t>());
}

void argmax_rows(const Array& logits, Array& out, Array& nonfinite, const Array& allowed) {
  const bool gpu = allowed.defined() ? on_cuda("argmax_rows", {&logits, &out, &nonfinite, &allowed})
                                     : on_cuda("argmax_rows", {&logits, &out, &nonfinite});
  require(logits.defined() && logits.dtype() == DType::f32 && logits.is_contiguous() && logits.ndim() == 2 &&
              logits.dim(1) >= 1,
          "argmax_rows", "logits must be contiguous float32 [n, vocab] with vocab >= 1, got " + describe(logits));
  const int64_t n = logits.dim(0), vocab = logits.dim(1);
  require(vocab <= INT32_MAX, "argmax_rows", "logits has " + std::to_string(vocab) + " columns, more than int32 ids reach");
  auto check_out = [&](const char* name, const Array& a) {
    require(a.defined() && a.dtype() == DType::i32 && a.is_contiguous() && a.ndim() == 1 && a.dim(0) == n, "argmax_rows",
            std::string(name) + " must be contiguous int32 [" + std::to_string(n) + "], got " + describe(a));
  };
  check_out("out", out);
  check_out("nonfinite", nonfinite);
  if (allowed.defined())
    require(allowed.dtype() == DType::u32 && allowed.is_contiguous() && allowed.ndim() == 2 && allowed.dim(0) == n &&
                allowed.dim(1) >= 1,
            "argmax_rows", "allowed must be contiguous uint32 [" + std::to_string(n) + ", words >= 1], got " +
                               describe(allowed));
  if (n == 0) return;
  const int64_t words = allowed.defined() ? allowed.dim(1) : 0;
  const uint32_t* mp = allowed.defined() ? allowed.data<uint32_t>() : nullptr;
  if (gpu) {
    cuda_ops::argmax_rows(logits.data<float>(), n, vocab, mp, words, out.data<int32_t>(), nonfinite.data<int32_t>());
    return;
  }
  // As the device's argmax: NaN ranks as -inf, the lowest id wins a tie (a row without a
  // value above -inf gives its first candidate: 0 unmasked, -1 when the mask allows nothing).
  const float* lp = logits.data<float>();
  int32_t* op = out.data<int32_t>();
  int32_t* fp = nonfinite.data<int32_t>();
  const int64_t mask_ids = std::min(vocab, words * 32);
  cpu_pool().parallel_for(n, 1, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = lp + r * vocab;
      bool bad = false;
      for (int64_t i = 0; i < vocab; ++i) bad |= !std::isfinite(row[i]);
      int64_t best = -1;
      float best_v = -INFINITY;
      auto consider = [&](int64_t i) {
        const float v = row[i];
        if (best < 0 || v > best_v) best = i, best_v = std::isnan(v) ? -INFINITY : v;  // NaN ranks as -inf
      };
      if (!mp) {
        for (int64_t i = 0; i < vocab; ++i) consider(i);
      } else {
        const uint32_t* m = mp + r * words;
        for (int64_t w = 0; w * 32 < mask_ids; ++w)
          for (uint32_t bits = m[w]; bits; bits &= bits - 1) {
            const int64_t i = w * 32 + std::countr_zero(bits);
            if (i < mask_ids) consider(i);
          }
      }
      op[r] = int32_t(best);
      fp[r] = bad ? 1 : 0;
    }
  });
}

Array cast(const Array& src, DType dtype) {
  Array out = Array::empty(src.shape(), dtype, src.device());
  copy_into(out, src);
  return out;
}

Array to_device(const Array& src, Device device) {
  if (src.device() == device) return src;
  Array c = src.is_contiguous() ? src : cast(src, src.dtype());
  Array out = Array::empty(c.shape(), c.dtype(), device);
  copy_into(out, c);
  return out;
}

Array to_host(const Array& src) { return to_device(src, Device::cpu()); }

void synchronize(Device device) {
  if (!device.is_cpu()) cuda_ops::synchronize();
}

DeviceTraits device_traits(Device device) {
  DeviceTraits t;
  t.stack_shared_input_linears = !device.is_cpu();
  return t;
}

void release_cached_memory(Device device) {
  if (!device.is_cpu()) allocator_for(device).trim();
}

}  // namespace osprey::ops
