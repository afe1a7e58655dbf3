#pragma once
// Sentence embeddings from a decoder's hidden states, as a sentence-transformers checkpoint
// declares them: modules.json lists a Transformer module, then a Pooling module (its folder's
// config.json picks the mode), then optionally Normalize. Osprey reads that declaration and
// pools the final-normed hidden states of Model::forward_hidden the way those modules define
// it (docs/server.md, "Embeddings").
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace osprey {

class Model;

enum class PoolingMode {
  mean,        // pooling_mode_mean_tokens: the mean over every token's hidden state
  cls,         // pooling_mode_cls_token: the first token's
  last_token,  // pooling_mode_lasttoken: the last token's
};

const char* pooling_mode_name(PoolingMode mode);  // "mean", "cls", "lasttoken"

struct PoolingConfig {
  PoolingMode mode = PoolingMode::mean;
  bool normalize = false;     // a Normalize module follows Pooling: the result has unit L2 norm
  int64_t dimension = 0;      // the Pooling config's word_embedding_dimension; 0 when absent
  std::string source;         // the Pooling module's config.json, for messages
};

// The pooling that `dir`'s modules.json declares; nullopt when the folder has no modules.json
// (a model that declares no pooling). Throws InvalidInput for a malformed declaration and
// Unsupported for modules or modes Osprey does not compute (Dense, max or weighted-mean
// pooling, several modes at once), naming the file and the module or field.
std::optional<PoolingConfig> read_pooling_config(const std::filesystem::path& dir);

// The embedding of one input: Model::forward_hidden over `tokens` (chunks of at most `chunk`
// tokens through one fresh dense cache), pooled per `pooling`, L2-normalized when it says
// so. [hidden] floats. Runs on the thread that owns the model. Throws InvalidInput for no
// tokens, and what the forward throws.
std::vector<float> embed_tokens(Model& model, const std::vector<int32_t>& tokens, const PoolingConfig& pooling,
                                int64_t chunk = 512);

// v / max(||v||_2, 1e-12) in place (torch.nn.functional.normalize, as Normalize applies it).
void l2_normalize(std::vector<float>& v);

// Matryoshka truncation: the first `dimensions` values, normalized again when `normalize`
// (sentence-transformers' truncate_dim followed by normalization). InvalidInput unless
// 1 <= dimensions <= v.size().
void truncate_embedding(std::vector<float>& v, int64_t dimensions, bool normalize);

}  // namespace osprey
