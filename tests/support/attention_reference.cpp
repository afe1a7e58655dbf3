#include "support/attention_reference.h"

#include <algorithm>
#include <cmath>

#include "core/half.h"

namespace osprey::testing {

AttnData make_attn_data(const AttnCase& s, std::mt19937& rng) {
  const uint16_t nan_bits = s.bf16 ? 0x7fc0 : 0x7e00;
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto to_bits = [&](float x) { return s.bf16 ? f32_to_bf16(x * s.kv_range) : f32_to_f16(x * s.kv_range); };
  AttnData d;
  d.q.resize(size_t(s.n * s.n_heads * s.head_dim));
  for (auto& x : d.q) x = dist(rng) * s.q_range;
  const int64_t capacity = s.n_keys + 29;
  if (s.row_major_heads) {
    d.row_stride = s.n_kv_heads * s.head_dim;
    d.head_stride = s.head_dim;
  } else {
    d.head_stride = capacity * s.head_dim + s.head_pad;
    d.row_stride = s.head_dim;
  }
  const size_t size = size_t(capacity * s.n_kv_heads * s.head_dim + s.n_kv_heads * s.head_pad);
  d.k.assign(size, nan_bits);
  d.v.assign(size, nan_bits);
  for (int64_t h = 0; h < s.n_kv_heads; ++h)
    for (int64_t j = 0; j < s.n_keys; ++j)
      for (int64_t e = 0; e < s.head_dim; ++e) {
        const size_t at = size_t(h * d.head_stride + j * d.row_stride + e);
        d.k[at] = to_bits(dist(rng));
        d.v[at] = to_bits(dist(rng));
      }
  return d;
}

std::vector<double> attention_reference(const AttnCase& s, const AttnData& d, double scale) {
  const int64_t D = s.head_dim, group = s.n_heads / s.n_kv_heads;
  auto value = [&](uint16_t bits) { return double(s.bf16 ? bf16_to_f32(bits) : f16_to_f32(bits)); };
  std::vector<double> out(size_t(s.n * s.n_heads * D), 0.0);
  for (int64_t i = 0; i < s.n; ++i) {
    const int64_t p = s.q_pos0 + i;
    const int64_t hi = std::min(p + 1, s.n_keys);
    const int64_t lo = s.window > 0 ? std::max<int64_t>(0, p - s.window + 1) : 0;
    for (int64_t h = 0; h < s.n_heads; ++h) {
      const int64_t hk = h / group;
      std::vector<double> logits;
      for (int64_t j = lo; j < hi; ++j) {
        double dot = 0.0;
        for (int64_t e = 0; e < D; ++e)
          dot += double(d.q[size_t((i * s.n_heads + h) * D + e)]) *
                 value(d.k[size_t(hk * d.head_stride + j * d.row_stride + e)]);
        double logit = dot * scale;
        if (s.softcap > 0.0f) logit = s.softcap * std::tanh(logit / s.softcap);
        logits.push_back(logit);
      }
      if (logits.empty()) continue;
      const double m = *std::max_element(logits.begin(), logits.end());
      double sum = 0.0;
      for (auto& x : logits) sum += (x = std::exp(x - m));
      for (int64_t j = lo; j < hi; ++j)
        for (int64_t e = 0; e < D; ++e)
          out[size_t((i * s.n_heads + h) * D + e)] +=
              logits[size_t(j - lo)] / sum * value(d.v[size_t(hk * d.head_stride + j * d.row_stride + e)]);
    }
  }
  return out;
}

}  // namespace osprey::testing
