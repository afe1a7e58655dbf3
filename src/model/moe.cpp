#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "backend/ops.h"
#include "core/error.h"
#include "formats/config_reader.h"
#include "model/blocks.h"
#include "model/weight_loader.h"

namespace osprey {
namespace {

// A router logit as the ranking sees it: NaN below everything.
double moe_rank_value(float v) { return std::isnan(v) ? -std::numeric_limits<double>::infinity() : double(v); }

}  // namespace

MoeConfig read_moe_config(const ConfigReader& c, const std::string& width_key, MoeWeighting weighting) {
  MoeConfig m;
  m.weighting = weighting;
  const bool local = c.has("num_local_experts"), plain = c.has("num_experts");
  if (!local && !plain) c.fail("num_experts", "missing (the number of experts; also read as num_local_experts)");
  m.n_experts = c.get_int(plain ? "num_experts" : "num_local_experts");
  if (local && plain && c.get_int("num_local_experts") != m.n_experts)
    c.fail("num_local_experts", std::to_string(c.get_int("num_local_experts")) + " differs from num_experts " +
                                    std::to_string(m.n_experts) + " (both name the number of experts)");
  const char* experts_key = plain ? "num_experts" : "num_local_experts";
  if (m.n_experts < 1 || m.n_experts > INT32_MAX)
    c.fail(experts_key, "must be a positive integer below 2^31, got " + std::to_string(m.n_experts));
  m.top_k = c.get_int("num_experts_per_tok");
  if (m.top_k < 1 || m.top_k > m.n_experts)
    c.fail("num_experts_per_tok", "must be between 1 and the " + std::to_string(m.n_experts) + " experts (" +
                                      experts_key + "), got " + std::to_string(m.top_k));
  m.expert_width = c.get_int(width_key);
  if (m.expert_width < 1 || m.expert_width > INT32_MAX)
    c.fail(width_key, "must be a positive integer below 2^31, got " + std::to_string(m.expert_width));
  return m;
}

MoeRouting route_tokens(std::span<const float> logits, int64_t n_experts, int64_t top_k, MoeWeighting weighting) {
  if (n_experts < 1 || top_k < 1 || top_k > n_experts || int64_t(logits.size()) % n_experts != 0)
    throw InvalidInput("route_tokens: " + std::to_string(logits.size()) + " logits, " + std::to_string(n_experts) +
                       " experts and top_k " + std::to_string(top_k) + " do not make whole rows with 1 <= top_k <= experts");
  MoeRouting r;
  r.n_tokens = int64_t(logits.size()) / n_experts;
  r.top_k = top_k;
  r.experts.resize(size_t(r.n_tokens * top_k));
  r.weights.resize(size_t(r.n_tokens * top_k));
  std::vector<int32_t> order(static_cast<size_t>(n_experts));
  std::vector<double> p(static_cast<size_t>(n_experts));
  for (int64_t t = 0; t < r.n_tokens; ++t) {
    const float* l = logits.data() + t * n_experts;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t a, int32_t b) {
      const double va = moe_rank_value(l[a]), vb = moe_rank_value(l[b]);
      return va > vb || (va == vb && a < b);
    });
    // Softmax over all experts (the max subtracted), then the chosen ones' share.
    const double top = double(l[order[0]]);
    double all = 0, chosen = 0;
    for (int64_t e = 0; e < n_experts; ++e) all += p[size_t(e)] = std::exp(double(l[e]) - top);
    for (int64_t j = 0; j < top_k; ++j) chosen += p[size_t(order[size_t(j)])];
    const double denom = weighting == MoeWeighting::softmax_chosen ? chosen : all;
    for (int64_t j = 0; j < top_k; ++j) {
      r.experts[size_t(t * top_k + j)] = order[size_t(j)];
      r.weights[size_t(t * top_k + j)] = float(p[size_t(order[size_t(j)])] / denom);
    }
  }
  return r;
}

MoeBlock::MoeBlock(const FeedForwardContext& c, const MoeConfig& config, const MoeTensorNames& names)
    : config_(config) {
  WeightLoader& w = c.weights;
  const int64_t e_n = config.n_experts, width = config.expert_width, h = c.hidden;
  gate_up_.resize(size_t(e_n));
  down_.resize(size_t(e_n));
  if (w.contains(names.fused_gate_up)) {
    router_ = w.linear(names.fused_router, e_n, h, c.dtype);
    std::vector<Array> gu = w.matrices(names.fused_gate_up, e_n, 2 * width, h, c.dtype);
    std::vector<Array> dn = w.matrices(names.fused_down, e_n, h, width, c.dtype);
    for (size_t e = 0; e < size_t(e_n); ++e) {
      gate_up_[e].stacked = dense_weight(gu[e]);  // gate rows, then up rows: silu_gate's stacked form
      gate_up_[e].outs = {width, width};
      down_[e] = dense_weight(dn[e]);
    }
    return;
  }
  router_ = w.linear(names.router, e_n, h, c.dtype);
  for (int64_t e = 0; e < e_n; ++e) {
    const std::string p = names.experts + std::to_string(e) + ".";
    gate_up_[size_t(e)] = w.linear_group({{p + names.gate, width}, {p + names.up, width}}, h, c.dtype, false);
    down_[size_t(e)] = w.linear(p + names.down, h, width, c.dtype);
  }
}

Array MoeBlock::forward(const Array& h) const {
  const int64_t n = h.dim(0), hidden = h.dim(1), k = config_.top_k;
  const Array logits = ops::to_host(ops::linear(h, router_));  // [n, n_experts] f32
  const MoeRouting r =
      route_tokens({logits.data<float>(), size_t(logits.numel())}, config_.n_experts, k, config_.weighting);
  // Each expert's tokens, in token order, and the weight each gives it.
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(config_.n_experts));
  std::vector<std::vector<float>> weights(static_cast<size_t>(config_.n_experts));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const size_t e = size_t(r.experts[size_t(t * k + j)]);
      rows[e].push_back(int32_t(t));
      weights[e].push_back(r.weights[size_t(t * k + j)]);
    }
  Array out = Array::empty({n, hidden}, DType::f32, h.device());
  std::vector<bool> written(static_cast<size_t>(n), false);
  for (size_t e = 0; e < rows.size(); ++e) {
    const std::vector<int32_t>& tok = rows[e];
    if (tok.empty()) continue;
    // The expert's tokens: h itself when they are all of them (every decode step), else those
    // rows gathered (the embedding op over h as the table is a row gather).
    const bool all = int64_t(tok.size()) == n;
    const Array x = all ? h : ops::embedding(h, ops::to_device(host_i32(tok), h.device()));
    Array y = ops::linear(silu_gate(x, gate_up_[e]), down_[e]);  // [m, hidden]
    // NOTE: weighting and scattering back are two small ops per (token, expert) pair; in a
    // long prefill they add up (an op that scatters weighted rows would make them one).
    for (size_t i = 0; i < tok.size(); ++i) {
      Array yi = y.slice_rows(int64_t(i), int64_t(i) + 1);
      ops::scale_(yi, weights[e][i]);
      Array o = out.slice_rows(tok[i], tok[i] + 1);
      if (written[size_t(tok[i])]) {
        ops::add_(o, yi);
      } else {
        ops::copy_into(o, yi);
        written[size_t(tok[i])] = true;
      }
    }
  }
  return out;
}

}  // namespace osprey
