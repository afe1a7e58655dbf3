#include "model/blocks.h"

#include "backend/ops.h"
#include "core/error.h"

namespace osprey {
namespace {

// Columns [c0, c0 + heads * head_dim) of x [n, row] as [n, heads, head_dim] (a view).
Array head_view(const Array& x, int64_t c0, int64_t heads, int64_t head_dim) {
  return Array::strided(x.buffer(), x.byte_offset() + size_t(c0) * x.itemsize(), {x.dim(0), heads, head_dim},
                        {x.dim(1), head_dim, 1}, x.dtype());
}

void require_parts(const LinearGroup& g, size_t n, const char* what) {
  if (g.outs.size() != n) throw InvalidInput(std::string(what) + " needs " + std::to_string(n) + " linear layers");
}

}  // namespace

AttentionInputs attention_inputs(const Array& h, const LinearGroup& qkv, const AttentionShape& s,
                                 const Array& positions, const QKTransform& t) {
  require_parts(qkv, 3, "attention_inputs");
  if (t.q_norm.defined() != t.k_norm.defined())
    throw InvalidInput("attention_inputs: q and k norms must be given together");
  const int64_t n = h.dim(0), nh = s.n_heads, nkv = s.n_kv_heads, hd = s.head_dim;
  AttentionInputs a;
  if (qkv.is_stacked()) {
    Array x = ops::linear(h, qkv.stacked, qkv.stacked_bias);  // [n, (nh + 2 nkv) hd]
    a.q = head_view(x, 0, nh, hd);
    a.k = head_view(x, nh * hd, nkv, hd);
    a.v = head_view(x, (nh + nkv) * hd, nkv, hd);
    if (t.q_norm.defined()) {
      ops::head_rms_norm_(a.q, t.q_norm, t.norm_eps, t.norm_unit_offset);
      ops::head_rms_norm_(a.k, t.k_norm, t.norm_eps, t.norm_unit_offset);
    }
    if (t.inv_freq.defined()) {
      Array qk = head_view(x, 0, nh + nkv, hd);  // q and k heads are adjacent: one launch
      ops::rope_(qk, positions, t.inv_freq, t.interleaved);
    }
    if (!a.q.is_contiguous()) a.q = ops::cast(a.q, DType::f32);
    return a;
  }
  a.q = ops::linear(h, qkv.parts[0], qkv.biases[0]).reshape({n, nh, hd});
  a.k = ops::linear(h, qkv.parts[1], qkv.biases[1]).reshape({n, nkv, hd});
  a.v = ops::linear(h, qkv.parts[2], qkv.biases[2]).reshape({n, nkv, hd});
  if (t.q_norm.defined()) {
    ops::head_rms_norm_(a.q, t.q_norm, t.norm_eps, t.norm_unit_offset);
    ops::head_rms_norm_(a.k, t.k_norm, t.norm_eps, t.norm_unit_offset);
  }
  if (t.inv_freq.defined()) {
    ops::rope_(a.q, positions, t.inv_freq, t.interleaved);
    ops::rope_(a.k, positions, t.inv_freq, t.interleaved);
  }
  return a;
}

DType kv_rows_dtype(DType weight_dtype) { return weight_dtype == DType::bf16 ? DType::bf16 : DType::f16; }

Array silu_gate(const Array& h, const LinearGroup& gate_up) {
  require_parts(gate_up, 2, "silu_gate");
  if (gate_up.is_stacked()) return ops::silu_mul_split(ops::linear(h, gate_up.stacked, gate_up.stacked_bias));
  return ops::silu_mul(ops::linear(h, gate_up.parts[0], gate_up.biases[0]),
                       ops::linear(h, gate_up.parts[1], gate_up.biases[1]));
}

Array gelu_gate(const Array& h, const LinearGroup& gate_up) {
  require_parts(gate_up, 2, "gelu_gate");
  if (gate_up.is_stacked()) return ops::gelu_tanh_mul_split(ops::linear(h, gate_up.stacked, gate_up.stacked_bias));
  return ops::gelu_tanh_mul(ops::linear(h, gate_up.parts[0], gate_up.biases[0]),
                            ops::linear(h, gate_up.parts[1], gate_up.biases[1]));
}

KVCacheParams layer_kv_params(KVCacheParams params, int64_t n_kv_heads, int64_t head_dim, DType rows,
                              int64_t window) {
  params.n_kv_heads = n_kv_heads;
  params.head_dim = head_dim;
  params.dtype = rows;
  params.window = window;
  return params;
}

HeadShard shard_heads(int64_t n_heads, int64_t n_kv_heads, const ShardSpec& shard) {
  const int64_t n = shard.size;
  auto fail = [&](const std::string& why) {
    throw InvalidInput("tensor parallelism over " + std::to_string(n) + " ranks: " + why);
  };
  if (n_heads % n != 0)
    fail(std::to_string(n) + " does not divide the " + std::to_string(n_heads) +
         " attention heads (num_attention_heads); each rank computes whole heads");
  if (n_kv_heads % n != 0 && n % n_kv_heads != 0)
    fail("the " + std::to_string(n_kv_heads) + " key/value heads (num_key_value_heads) neither divide into " +
         std::to_string(n) + " ranks nor replicate evenly across them");
  HeadShard hs;
  hs.n_heads = n_heads / n;
  hs.q_head0 = shard.rank * hs.n_heads;
  if (n_kv_heads >= n) {
    hs.n_kv_heads = n_kv_heads / n;
    hs.kv_head0 = shard.rank * hs.n_kv_heads;
  } else {
    // The rank's query heads all read one K/V head (n_heads / n_kv_heads queries per K/V head,
    // a multiple of the rank's n_heads / n), which the rank holds a copy of.
    hs.n_kv_heads = 1;
    hs.kv_head0 = hs.q_head0 / (n_heads / n_kv_heads);
  }
  return hs;
}

}  // namespace osprey
