#include "model/pooling.h"

#include <algorithm>
#include <cmath>

#include "backend/ops.h"
#include "core/error.h"
#include "core/file_read.h"
#include "formats/config_reader.h"
#include "model/model.h"

namespace osprey {
namespace {

constexpr const char* kTransformer = "sentence_transformers.models.Transformer";
constexpr const char* kPooling = "sentence_transformers.models.Pooling";
constexpr const char* kNormalize = "sentence_transformers.models.Normalize";

// The Pooling module's mode from its config.json: exactly one supported flag true.
PoolingConfig read_pooling_module(const std::filesystem::path& file) {
  const ConfigReader c = ConfigReader::load(file);
  PoolingConfig p;
  p.source = file.string();
  struct Flag {
    const char* field;
    std::optional<PoolingMode> mode;  // nullopt: not computed here
  };
  static const Flag flags[] = {
      {"pooling_mode_mean_tokens", PoolingMode::mean},
      {"pooling_mode_cls_token", PoolingMode::cls},
      {"pooling_mode_lasttoken", PoolingMode::last_token},
      {"pooling_mode_max_tokens", std::nullopt},
      {"pooling_mode_mean_sqrt_len_tokens", std::nullopt},
      {"pooling_mode_weightedmean_tokens", std::nullopt},
  };
  std::vector<std::string> on;
  for (const Flag& f : flags) {
    if (!c.get_bool(f.field, false)) continue;
    if (!f.mode) throw Unsupported(c.where() + ": " + f.field + " is not supported (supported: "
                                   "pooling_mode_mean_tokens, pooling_mode_cls_token, pooling_mode_lasttoken)");
    on.push_back(f.field);
    p.mode = *f.mode;
  }
  if (on.empty())
    throw InvalidInput(c.where() + ": no pooling mode is true (one of pooling_mode_mean_tokens, "
                       "pooling_mode_cls_token, pooling_mode_lasttoken)");
  if (on.size() > 1)
    throw Unsupported(c.where() + ": " + on[0] + " and " + on[1] +
                      " are both true; concatenated poolings are not supported");
  p.dimension = c.get_int("word_embedding_dimension", 0);
  return p;
}

}  // namespace

const char* pooling_mode_name(PoolingMode mode) {
  switch (mode) {
    case PoolingMode::mean: return "mean";
    case PoolingMode::cls: return "cls";
    case PoolingMode::last_token: return "lasttoken";
  }
  return "?";
}

std::optional<PoolingConfig> read_pooling_config(const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / "modules.json";
  if (!regular_file_exists(file)) return std::nullopt;
  const std::string where = file.string();
  nlohmann::json modules;
  try {
    modules = nlohmann::json::parse(read_regular_file(file));
  } catch (const nlohmann::json::exception& e) {
    throw InvalidInput(where + ": malformed JSON: " + e.what());
  }
  if (!modules.is_array() || modules.empty()) throw InvalidInput(where + ": must be a non-empty list of modules");
  auto field = [&](size_t i, const char* key) {
    const nlohmann::json& m = modules[i];
    if (!m.is_object() || !m.contains(key) || !m[key].is_string())
      throw InvalidInput(where + ": module " + std::to_string(i) + " has no string \"" + key + "\"");
    return m[key].get<std::string>();
  };
  // [Transformer, Pooling] or [Transformer, Pooling, Normalize].
  if (field(0, "type") != kTransformer)
    throw Unsupported(where + ": module 0 is " + field(0, "type") + "; the first module must be " + kTransformer);
  if (!field(0, "path").empty())
    throw Unsupported(where + ": the Transformer module lives in \"" + field(0, "path") +
                      "/\"; only checkpoints whose model is the folder itself are read");
  if (modules.size() < 2 || field(1, "type") != kPooling)
    throw Unsupported(where + ": module 1 must be " + kPooling +
                      (modules.size() < 2 ? std::string(" (there is none)") : ", not " + field(1, "type")));
  PoolingConfig p = read_pooling_module(dir / field(1, "path") / "config.json");
  for (size_t i = 2; i < modules.size(); ++i) {
    const std::string type = field(i, "type");
    if (type == kNormalize && i == 2) {
      p.normalize = true;
      continue;
    }
    throw Unsupported(where + ": module " + std::to_string(i) + " (" + type +
                      ") is not supported; after Pooling only " + kNormalize + " is");
  }
  return p;
}

void l2_normalize(std::vector<float>& v) {
  double ss = 0;
  for (float x : v) ss += double(x) * double(x);
  const double scale = 1.0 / std::max(std::sqrt(ss), 1e-12);
  for (float& x : v) x = float(double(x) * scale);
}

void truncate_embedding(std::vector<float>& v, int64_t dimensions, bool normalize) {
  if (dimensions < 1 || dimensions > int64_t(v.size()))
    throw InvalidInput("dimensions must be in [1, " + std::to_string(v.size()) + "], got " + std::to_string(dimensions));
  v.resize(size_t(dimensions));
  if (normalize) l2_normalize(v);
}

std::vector<float> embed_tokens(Model& model, const std::vector<int32_t>& tokens, const PoolingConfig& pooling,
                                int64_t chunk) {
  const int64_t n = int64_t(tokens.size()), hidden = model.info().hidden_size;
  if (n == 0) throw InvalidInput("embed_tokens: no tokens");
  if (chunk < 1) chunk = n;
  KVCacheParams cp;
  cp.step = n;  // one allocation holds the whole input
  SequenceCache cache = model.make_cache(cp);
  std::vector<double> sum(size_t(hidden), 0.0);
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t end = std::min(n, begin + chunk);
    Array ids = Array::empty({end - begin}, DType::i32);
    std::copy(tokens.begin() + begin, tokens.begin() + end, ids.data<int32_t>());
    const Array h = model.forward_hidden(ids, cache);  // [end - begin, hidden] f32 on the model's device
    // The rows the pooling reads from this chunk, on the host.
    int64_t r0 = 0, r1 = end - begin;
    if (pooling.mode == PoolingMode::cls) {
      if (begin > 0) continue;
      r1 = 1;
    } else if (pooling.mode == PoolingMode::last_token) {
      if (end < n) continue;
      r0 = r1 - 1;
    }
    const Array rows = ops::to_device(h.slice_rows(r0, r1), Device::cpu());
    const float* p = rows.data<float>();
    for (int64_t r = 0; r < r1 - r0; ++r)
      for (int64_t j = 0; j < hidden; ++j) sum[size_t(j)] += double(p[r * hidden + j]);
  }
  // mean: the sum over all n tokens (every one is attended: no padding) over n.
  const double scale = pooling.mode == PoolingMode::mean ? 1.0 / double(n) : 1.0;
  std::vector<float> out(static_cast<size_t>(hidden));
  for (int64_t j = 0; j < hidden; ++j) out[size_t(j)] = float(sum[size_t(j)] * scale);
  if (pooling.normalize) l2_normalize(out);
  return out;
}

}  // namespace osprey
