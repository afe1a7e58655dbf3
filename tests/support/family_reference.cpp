#include "support/family_reference.h"

#include <cmath>
#include <stdexcept>

#include "core/array.h"
#include "core/half.h"
#include "formats/safetensors.h"
#include "support/test_util.h"

namespace osprey::testing {
namespace {

using Vec = std::vector<double>;

const RefTensor& get(const RefWeights& w, const std::string& name) {
  auto it = w.find(name);
  if (it == w.end()) throw std::runtime_error("reference: no weight " + name);
  return it->second;
}

// W [out, in] times x [in].
Vec matvec(const RefTensor& W, const Vec& x) {
  const int64_t out = W.shape[0], in = W.shape[1];
  if (int64_t(x.size()) != in) throw std::runtime_error("reference: matvec shape");
  Vec y(size_t(out), 0.0);
  for (int64_t r = 0; r < out; ++r) {
    double s = 0;
    for (int64_t c = 0; c < in; ++c) s += W.v[size_t(r * in + c)] * x[size_t(c)];
    y[size_t(r)] = s;
  }
  return y;
}

// x / rms(x) * (offset + w) over x[off, off + d).
void rms_norm(Vec& x, size_t off, size_t d, const Vec& w, double eps, double offset) {
  double ss = 0;
  for (size_t j = 0; j < d; ++j) ss += x[off + j] * x[off + j];
  const double inv = 1.0 / std::sqrt(ss / double(d) + eps);
  for (size_t j = 0; j < d; ++j) x[off + j] = x[off + j] * inv * (offset + w[j]);
}

Vec layer_norm(const Vec& x, const Vec& w, double eps) {
  double mean = 0, var = 0;
  for (double v : x) mean += v;
  mean /= double(x.size());
  for (double v : x) var += (v - mean) * (v - mean);
  var /= double(x.size());
  const double inv = 1.0 / std::sqrt(var + eps);
  Vec y(x.size());
  for (size_t j = 0; j < x.size(); ++j) y[j] = (x[j] - mean) * inv * w[j];
  return y;
}

// Rotates each head of x [heads * hd] at position `pos` with inverse frequencies `inv`
// [hd / 2]: pairs (i, i + hd/2), or (2i, 2i + 1) when interleaved.
void rotate(Vec& x, int64_t heads, int64_t hd, int64_t pos, const Vec& inv, bool interleaved) {
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double a = double(pos) * inv[size_t(i)], c = std::cos(a), s = std::sin(a);
      const size_t p = size_t(h * hd + (interleaved ? 2 * i : i));
      const size_t q = size_t(h * hd + (interleaved ? 2 * i + 1 : i + hd / 2));
      const double x0 = x[p], x1 = x[q];
      x[p] = x0 * c - x1 * s;
      x[q] = x1 * c + x0 * s;
    }
}

Vec inv_freq(double theta, int64_t hd, double factor) {
  Vec inv(size_t(hd / 2));
  for (int64_t i = 0; i < hd / 2; ++i) inv[size_t(i)] = 1.0 / std::pow(theta, double(2 * i) / double(hd)) / factor;
  return inv;
}

// Causal attention of query t over keys [lo, t] (GQA), each score times `scale`.
// `groups` (may be null): keys of the query's image group (>= 0) are visible too.
Vec attend(const std::vector<Vec>& q, const std::vector<Vec>& k, const std::vector<Vec>& v, int64_t t, int64_t nh,
           int64_t nkv, int64_t hd, int64_t window, double scale, const std::vector<int>* groups = nullptr) {
  const int64_t lo = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
  std::vector<int64_t> keys;
  for (int64_t j = 0; j < int64_t(k.size()); ++j) {
    const bool causal = j >= lo && j <= t;
    const bool same_image = groups && (*groups)[size_t(t)] >= 0 && (*groups)[size_t(j)] == (*groups)[size_t(t)];
    if (causal || same_image) keys.push_back(j);
  }
  Vec out(size_t(nh * hd), 0.0);
  for (int64_t h = 0; h < nh; ++h) {
    const int64_t g = h / (nh / nkv);
    std::vector<double> s;
    double mx = -INFINITY;
    for (int64_t j : keys) {
      double d = 0;
      for (int64_t e = 0; e < hd; ++e) d += q[size_t(t)][size_t(h * hd + e)] * k[size_t(j)][size_t(g * hd + e)];
      s.push_back(d * scale);
      mx = std::max(mx, s.back());
    }
    double z = 0;
    for (double& x : s) z += (x = std::exp(x - mx));
    for (size_t i = 0; i < keys.size(); ++i)
      for (int64_t e = 0; e < hd; ++e)
        out[size_t(h * hd + e)] += s[i] / z * v[size_t(keys[i])][size_t(g * hd + e)];
  }
  return out;
}

std::vector<bool> sliding_layers(const nlohmann::json& c) {
  std::vector<bool> s;
  for (const auto& t : c.at("layer_types")) s.push_back(t.get<std::string>() == "sliding_attention");
  return s;
}

void round_rows(std::vector<Vec>& rows, DType dt) {
  for (Vec& r : rows)
    for (double& x : r) {
      if (dt == DType::f16) x = f16_to_f32(f32_to_f16(float(x)));
      if (dt == DType::bf16) x = bf16_to_f32(f32_to_bf16(float(x)));
    }
}

double gelu_tanh(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

// The embedding rows of `tokens` times `scale`: [T][H].
std::vector<Vec> embed(const RefTensor& E, const std::vector<int32_t>& tokens, int64_t H, double scale = 1.0) {
  std::vector<Vec> x(tokens.size(), Vec(static_cast<size_t>(H)));
  for (size_t t = 0; t < tokens.size(); ++t)
    for (int64_t j = 0; j < H; ++j) x[t][size_t(j)] = E.v[size_t(tokens[t] * H + j)] * scale;
  return x;
}

// Layer p's query, key and value rows of one position's normed input h.
void project_qkv(const RefWeights& w, const std::string& p, const Vec& h, Vec& q, Vec& k, Vec& v) {
  q = matvec(get(w, p + "self_attn.q_proj.weight"), h);
  k = matvec(get(w, p + "self_attn.k_proj.weight"), h);
  v = matvec(get(w, p + "self_attn.v_proj.weight"), h);
}

// The keys and values as the cache stores them.
void round_kv(std::vector<Vec>& k, std::vector<Vec>& v, DType dt) {
  round_rows(k, dt);
  round_rows(v, dt);
}

// Layer p's output projection of the attention rows a.
Vec o_proj(const RefWeights& w, const std::string& p, const Vec& a) { return matvec(get(w, p + "self_attn.o_proj.weight"), a); }

// Layer p's SwiGLU MLP: down_proj(silu(gate_proj h) * up_proj h).
Vec swiglu(const RefWeights& w, const std::string& p, const Vec& h) {
  Vec g = matvec(get(w, p + "mlp.gate_proj.weight"), h);
  const Vec u = matvec(get(w, p + "mlp.up_proj.weight"), h);
  for (size_t j = 0; j < g.size(); ++j) g[j] = g[j] / (1.0 + std::exp(-g[j])) * u[j];
  return matvec(get(w, p + "mlp.down_proj.weight"), g);
}

}  // namespace

void add_random(RefWeights& w, std::mt19937& rng, const std::string& name, std::vector<int64_t> shape, double std,
                double offset) {
  std::normal_distribution<double> dist(0.0, 1.0);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  RefTensor t{shape, Vec(size_t(n))};
  for (double& x : t.v) x = double(bf16_to_f32(f32_to_bf16(float(offset + std * dist(rng)))));
  w[name] = std::move(t);
}

void write_checkpoint(const std::filesystem::path& dir, const nlohmann::json& config, const RefWeights& w) {
  std::filesystem::create_directories(dir);
  write_file(dir / "config.json", config.dump(2));
  std::vector<std::pair<std::string, Array>> tensors;
  for (const auto& [name, t] : w) {
    Shape s;
    s.n = int(t.shape.size());
    for (size_t i = 0; i < t.shape.size(); ++i) s.d[i] = t.shape[i];
    Array a = Array::empty(s, DType::bf16);
    for (size_t i = 0; i < t.v.size(); ++i) a.data<uint16_t>()[i] = f32_to_bf16(float(t.v[i]));
    tensors.emplace_back(name, a);
  }
  write_safetensors(dir / "model.safetensors", tensors);
}

RefWeights gemma3_weights(const nlohmann::json& c, uint32_t seed, const Gemma3Scales& sc, const std::string& P) {
  std::mt19937 rng(seed);
  const int64_t V = c["vocab_size"], H = c["hidden_size"], F = c["intermediate_size"];
  const int64_t nh = c["num_attention_heads"], nkv = c["num_key_value_heads"], hd = c["head_dim"];
  RefWeights w;
  add_random(w, rng, P + "embed_tokens.weight", {V, H}, sc.embed_std);
  for (int64_t l = 0; l < int64_t(c["num_hidden_layers"]); ++l) {
    const std::string p = P + "layers." + std::to_string(l) + ".";
    // Norm weights w with (1 + w) the scale: random around 0.
    add_random(w, rng, p + "input_layernorm.weight", {H}, 0.2);
    add_random(w, rng, p + "post_attention_layernorm.weight", {H}, 0.2 * sc.post_norm, sc.post_norm - 1.0);
    add_random(w, rng, p + "pre_feedforward_layernorm.weight", {H}, 0.2 * sc.pre_ffn_norm, sc.pre_ffn_norm - 1.0);
    add_random(w, rng, p + "post_feedforward_layernorm.weight", {H}, 0.2 * sc.post_norm, sc.post_norm - 1.0);
    add_random(w, rng, p + "self_attn.q_norm.weight", {hd}, 0.3);
    add_random(w, rng, p + "self_attn.k_norm.weight", {hd}, 0.3);
    add_random(w, rng, p + "self_attn.q_proj.weight", {nh * hd, H}, 0.2);
    add_random(w, rng, p + "self_attn.k_proj.weight", {nkv * hd, H}, 0.2);
    add_random(w, rng, p + "self_attn.v_proj.weight", {nkv * hd, H}, 0.2);
    add_random(w, rng, p + "self_attn.o_proj.weight", {H, nh * hd}, 0.2);
    add_random(w, rng, p + "mlp.gate_proj.weight", {F, H}, 0.2);
    add_random(w, rng, p + "mlp.up_proj.weight", {F, H}, 0.2);
    add_random(w, rng, p + "mlp.down_proj.weight", {H, F}, 0.2);
  }
  add_random(w, rng, P + "norm.weight", {H}, 0.2);
  if (!c.value("tie_word_embeddings", true)) add_random(w, rng, "lm_head.weight", {V, H}, 0.2);
  return w;
}

std::vector<std::vector<double>> gemma3_reference(const nlohmann::json& c, const RefWeights& w,
                                                  const std::vector<int32_t>& tokens, const std::string& P,
                                                  RefStats* stats, DType kv_rows, const RefImages* images) {
  RefStats local;
  RefStats& st = stats ? *stats : local;
  auto track = [](double& m, const Vec& v) {
    for (double e : v) m = std::max(m, std::fabs(e));
  };
  const int64_t V = c["vocab_size"], H = c["hidden_size"];
  const int64_t nh = c["num_attention_heads"], nkv = c["num_key_value_heads"], hd = c["head_dim"];
  const int64_t L = c["num_hidden_layers"], window = c["sliding_window"];
  const double eps = c["rms_norm_eps"], scale = 1.0 / std::sqrt(double(c["query_pre_attn_scalar"]));
  const double factor = c.contains("rope_scaling") && !c["rope_scaling"].is_null() ? double(c["rope_scaling"]["factor"]) : 1.0;
  const Vec inv_full = inv_freq(c["rope_theta"], hd, factor), inv_local = inv_freq(c["rope_local_base_freq"], hd, 1.0);
  const double cap = c.contains("final_logit_softcapping") && !c["final_logit_softcapping"].is_null()
                         ? double(c["final_logit_softcapping"])
                         : 0.0;
  const std::vector<bool> sliding = sliding_layers(c);
  // The embedding scale as the weights' dtype (bf16) holds sqrt(hidden).
  const double embed_scale = bf16_to_f32(f32_to_bf16(float(std::sqrt(double(H)))));
  const int64_t T = int64_t(tokens.size());
  const RefTensor& E = get(w, P + "embed_tokens.weight");
  std::vector<Vec> x = embed(E, tokens, H, embed_scale);
  if (images)
    for (const auto& [row, vec] : images->rows) x[size_t(row)] = vec;
  const std::vector<int>* groups = images && !images->groups.empty() ? &images->groups : nullptr;
  for (const Vec& xt : x) track(st.max_abs_residual, xt);
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = P + "layers." + std::to_string(l) + ".";
    const bool sl = sliding[size_t(l)];
    std::vector<Vec> q(static_cast<size_t>(T)), k(static_cast<size_t>(T)), v(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      Vec h = x[size_t(t)];
      rms_norm(h, 0, size_t(H), get(w, p + "input_layernorm.weight").v, eps, 1.0);
      project_qkv(w, p, h, q[size_t(t)], k[size_t(t)], v[size_t(t)]);
      for (int64_t hh = 0; hh < nh; ++hh) rms_norm(q[size_t(t)], size_t(hh * hd), size_t(hd), get(w, p + "self_attn.q_norm.weight").v, eps, 1.0);
      for (int64_t hh = 0; hh < nkv; ++hh) rms_norm(k[size_t(t)], size_t(hh * hd), size_t(hd), get(w, p + "self_attn.k_norm.weight").v, eps, 1.0);
      rotate(q[size_t(t)], nh, hd, t, sl ? inv_local : inv_full, false);
      rotate(k[size_t(t)], nkv, hd, t, sl ? inv_local : inv_full, false);
    }
    round_kv(k, v, kv_rows);
    for (int64_t t = 0; t < T; ++t) {
      Vec o = o_proj(w, p, attend(q, k, v, t, nh, nkv, hd, sl ? window : 0, scale, groups));
      rms_norm(o, 0, size_t(H), get(w, p + "post_attention_layernorm.weight").v, eps, 1.0);
      Vec& xt = x[size_t(t)];
      for (int64_t j = 0; j < H; ++j) xt[size_t(j)] += o[size_t(j)];
      Vec h = xt;
      rms_norm(h, 0, size_t(H), get(w, p + "pre_feedforward_layernorm.weight").v, eps, 1.0);
      Vec g = matvec(get(w, p + "mlp.gate_proj.weight"), h), u = matvec(get(w, p + "mlp.up_proj.weight"), h);
      for (size_t j = 0; j < g.size(); ++j) g[j] = gelu_tanh(g[j]) * u[j];
      track(st.max_abs_down_proj_input, g);
      Vec d = matvec(get(w, p + "mlp.down_proj.weight"), g);
      rms_norm(d, 0, size_t(H), get(w, p + "post_feedforward_layernorm.weight").v, eps, 1.0);
      for (int64_t j = 0; j < H; ++j) xt[size_t(j)] += d[size_t(j)];
      track(st.max_abs_residual, xt);
    }
  }
  const RefTensor& head = c.value("tie_word_embeddings", true) ? E : get(w, "lm_head.weight");
  std::vector<Vec> logits;
  for (int64_t t = 0; t < T; ++t) {
    Vec h = x[size_t(t)];
    rms_norm(h, 0, size_t(H), get(w, P + "norm.weight").v, eps, 1.0);
    Vec z = matvec(head, h);
    if (cap > 0)
      for (double& e : z) e = cap * std::tanh(e / cap);
    if (int64_t(z.size()) != V) throw std::runtime_error("reference: vocab");
    logits.push_back(std::move(z));
  }
  return logits;
}

RefWeights cohere2_weights(const nlohmann::json& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t V = c["vocab_size"], H = c["hidden_size"], F = c["intermediate_size"];
  const int64_t nh = c["num_attention_heads"], nkv = c["num_key_value_heads"], hd = H / nh;
  RefWeights w;
  add_random(w, rng, "model.embed_tokens.weight", {V, H}, 1.0);
  for (int64_t l = 0; l < int64_t(c["num_hidden_layers"]); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add_random(w, rng, p + "input_layernorm.weight", {H}, 0.2, 1.0);
    add_random(w, rng, p + "self_attn.q_proj.weight", {nh * hd, H}, 0.25);
    add_random(w, rng, p + "self_attn.k_proj.weight", {nkv * hd, H}, 0.25);
    add_random(w, rng, p + "self_attn.v_proj.weight", {nkv * hd, H}, 0.2);
    add_random(w, rng, p + "self_attn.o_proj.weight", {H, nh * hd}, 0.2);
    add_random(w, rng, p + "mlp.gate_proj.weight", {F, H}, 0.2);
    add_random(w, rng, p + "mlp.up_proj.weight", {F, H}, 0.2);
    add_random(w, rng, p + "mlp.down_proj.weight", {H, F}, 0.2);
  }
  add_random(w, rng, "model.norm.weight", {H}, 0.2, 1.0);
  return w;
}

std::vector<std::vector<double>> cohere2_reference(const nlohmann::json& c, const RefWeights& w,
                                                   const std::vector<int32_t>& tokens, DType kv_rows) {
  const int64_t H = c["hidden_size"], nh = c["num_attention_heads"], nkv = c["num_key_value_heads"], hd = H / nh;
  const int64_t L = c["num_hidden_layers"], window = c["sliding_window"];
  const double eps = c["layer_norm_eps"], logit_scale = c["logit_scale"];
  const Vec inv = inv_freq(c["rope_theta"], hd, 1.0);
  const std::vector<bool> sliding = sliding_layers(c);
  const int64_t T = int64_t(tokens.size());
  const RefTensor& E = get(w, "model.embed_tokens.weight");
  std::vector<Vec> x = embed(E, tokens, H);
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const bool sl = sliding[size_t(l)];
    std::vector<Vec> h(static_cast<size_t>(T)), q(static_cast<size_t>(T)), k(static_cast<size_t>(T)), v(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      h[size_t(t)] = layer_norm(x[size_t(t)], get(w, p + "input_layernorm.weight").v, eps);
      project_qkv(w, p, h[size_t(t)], q[size_t(t)], k[size_t(t)], v[size_t(t)]);
      if (sl) {  // full-attention layers have no position encoding
        rotate(q[size_t(t)], nh, hd, t, inv, true);
        rotate(k[size_t(t)], nkv, hd, t, inv, true);
      }
    }
    round_kv(k, v, kv_rows);
    for (int64_t t = 0; t < T; ++t) {
      const Vec o = o_proj(w, p, attend(q, k, v, t, nh, nkv, hd, sl ? window : 0, 1.0 / std::sqrt(double(hd))));
      const Vec m = swiglu(w, p, h[size_t(t)]);  // in parallel with attention
      for (int64_t j = 0; j < H; ++j) x[size_t(t)][size_t(j)] += o[size_t(j)] + m[size_t(j)];
    }
  }
  std::vector<Vec> logits;
  for (int64_t t = 0; t < T; ++t) {
    Vec z = matvec(E, layer_norm(x[size_t(t)], get(w, "model.norm.weight").v, eps));
    for (double& e : z) e *= logit_scale;
    logits.push_back(std::move(z));
  }
  return logits;
}

RefWeights mistral_weights(const nlohmann::json& c, uint32_t seed) {
  const int64_t H = c["hidden_size"], F = c["intermediate_size"], V = c["vocab_size"], L = c["num_hidden_layers"];
  const int64_t nh = c["num_attention_heads"], nkv = c["num_key_value_heads"], hd = c["head_dim"];
  std::mt19937 rng(seed);
  RefWeights w;
  add_random(w, rng, "model.embed_tokens.weight", {V, H}, 1.0);
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add_random(w, rng, p + "input_layernorm.weight", {H}, 0.2, 1.0);
    add_random(w, rng, p + "self_attn.q_proj.weight", {nh * hd, H}, 0.25);
    add_random(w, rng, p + "self_attn.k_proj.weight", {nkv * hd, H}, 0.25);
    add_random(w, rng, p + "self_attn.v_proj.weight", {nkv * hd, H}, 0.2);
    add_random(w, rng, p + "self_attn.o_proj.weight", {H, nh * hd}, 0.2);
    add_random(w, rng, p + "post_attention_layernorm.weight", {H}, 0.2, 1.0);
    add_random(w, rng, p + "mlp.gate_proj.weight", {F, H}, 0.2);
    add_random(w, rng, p + "mlp.up_proj.weight", {F, H}, 0.2);
    add_random(w, rng, p + "mlp.down_proj.weight", {H, F}, 0.2);
  }
  add_random(w, rng, "model.norm.weight", {H}, 0.2, 1.0);
  add_random(w, rng, "lm_head.weight", {V, H}, 0.2);
  return w;
}

std::vector<std::vector<double>> mistral_reference(const nlohmann::json& c, const RefWeights& w,
                                                   const std::vector<int32_t>& tokens, DType kv_rows) {
  const int64_t H = c["hidden_size"], nh = c["num_attention_heads"], nkv = c["num_key_value_heads"];
  const int64_t hd = c["head_dim"], L = c["num_hidden_layers"];
  const int64_t window = c.contains("sliding_window") && !c["sliding_window"].is_null() ? c["sliding_window"].get<int64_t>() : 0;
  const double eps = c["rms_norm_eps"];
  const Vec inv = inv_freq(c["rope_theta"], hd, 1.0);
  const int64_t T = int64_t(tokens.size());
  std::vector<Vec> x = embed(get(w, "model.embed_tokens.weight"), tokens, H);
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<Vec> q(static_cast<size_t>(T)), k(static_cast<size_t>(T)), v(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      Vec h = x[size_t(t)];
      rms_norm(h, 0, size_t(H), get(w, p + "input_layernorm.weight").v, eps, 0.0);
      project_qkv(w, p, h, q[size_t(t)], k[size_t(t)], v[size_t(t)]);
      rotate(q[size_t(t)], nh, hd, t, inv, false);
      rotate(k[size_t(t)], nkv, hd, t, inv, false);
    }
    round_kv(k, v, kv_rows);
    for (int64_t t = 0; t < T; ++t) {
      const Vec o = o_proj(w, p, attend(q, k, v, t, nh, nkv, hd, window, 1.0 / std::sqrt(double(hd))));
      for (int64_t j = 0; j < H; ++j) x[size_t(t)][size_t(j)] += o[size_t(j)];
      Vec h = x[size_t(t)];
      rms_norm(h, 0, size_t(H), get(w, p + "post_attention_layernorm.weight").v, eps, 0.0);
      const Vec m = swiglu(w, p, h);
      for (int64_t j = 0; j < H; ++j) x[size_t(t)][size_t(j)] += m[size_t(j)];
    }
  }
  std::vector<Vec> logits;
  for (int64_t t = 0; t < T; ++t) {
    Vec h = x[size_t(t)];
    rms_norm(h, 0, size_t(H), get(w, "model.norm.weight").v, eps, 0.0);
    logits.push_back(matvec(get(w, "lm_head.weight"), h));
  }
  return logits;
}

}  // namespace osprey::testing
