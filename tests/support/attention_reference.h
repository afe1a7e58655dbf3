#pragma once
// A naive double-precision causal GQA attention over an f16 or bf16 cache, shared by the CPU
// and CUDA attention tests as their independent reference.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace osprey::testing {

struct AttnCase {
  int64_t n = 1, n_heads = 8, n_kv_heads = 2, head_dim = 64;
  int64_t n_keys = 1;
  int64_t q_pos0 = 0;
  float scale = 0.0f;  // 0: 1 / sqrt(head_dim)
  int window = 0;
  float softcap = 0.0f;
  bool row_major_heads = false;  // cache [cap, n_kv_heads, head_dim] instead of [n_kv_heads, cap, head_dim]
  int64_t head_pad = 0;          // extra elements between heads (4: rows not 16-byte aligned)
  bool bf16 = false;             // the cache holds bf16 (else f16)
  float q_range = 1.0f;          // q uniform in [-q_range, q_range)
  float kv_range = 1.0f;         // k and v uniform in [-kv_range, kv_range) before rounding
};

struct AttnData {
  std::vector<float> q;        // [n, n_heads, head_dim]
  std::vector<uint16_t> k, v;  // f16 or bf16 bits (AttnCase::bf16), strided as below
  int64_t head_stride = 0, row_stride = 0;
};

// Random q, and keys and values for rows [0, n_keys); every other element of the cache
// buffers is NaN, so a kernel that reads past the live rows fails.
AttnData make_attn_data(const AttnCase& s, std::mt19937& rng);

// [n, n_heads * head_dim] in double.
std::vector<double> attention_reference(const AttnCase& s, const AttnData& d, double scale);

// The scale a case asks for (AttnCase::scale, or 1 / sqrt(head_dim)).
inline float attention_scale(const AttnCase& s) {
  return s.scale > 0.0f ? s.scale : 1.0f / std::sqrt(float(s.head_dim));
}

// The shape, layout and masking arguments of a case, in the fields cpu::AttentionArgs and
// cuda::AttentionArgs share; the caller sets the pointers (q, k, v, out), host positions.
template <class Args>
void set_attention_args(Args& a, const AttnCase& s, const AttnData& d) {
  a.n = s.n;
  a.n_heads = s.n_heads;
  a.head_dim = s.head_dim;
  a.bf16 = s.bf16;
  a.n_kv_heads = s.n_kv_heads;
  a.n_keys = s.n_keys;
  a.k_head_stride = a.v_head_stride = d.head_stride;
  a.k_row_stride = a.v_row_stride = d.row_stride;
  a.q_pos0 = s.q_pos0;
  a.scale = attention_scale(s);
  a.window = s.window;
  a.softcap = s.softcap;
}

}  // namespace osprey::testing
