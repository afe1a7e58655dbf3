#pragma once
// The dimensions every decoder's config.json states, read and checked in one place for all
// families, with one set of messages (each names config.json and the field).
#include <cstdint>

#include "formats/config_reader.h"

namespace osprey {

struct DecoderDims {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t n_layers = 0;    // num_hidden_layers
  int64_t n_heads = 0;     // num_attention_heads
  int64_t n_kv_heads = 0;  // num_key_value_heads
  int64_t head_dim = 0;    // head_dim, else hidden_size / num_attention_heads
  int64_t max_position_embeddings = 0;
};

// A family's defaults for the keys its configs may omit (its transformers config class's
// defaults). kRequired: the key must be present.
struct DecoderDefaults {
  static constexpr int64_t kRequired = -1;
  int64_t vocab_size = kRequired;
  int64_t hidden_size = kRequired;
  int64_t intermediate_size = kRequired;
  int64_t n_layers = kRequired;
  int64_t n_heads = kRequired;
  int64_t n_kv_heads = 0;  // 0: num_attention_heads
  int64_t head_dim = 0;    // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
};

// Reads the fields and checks them: each positive and below 2^31, num_key_value_heads dividing
// num_attention_heads, head_dim even (rotary embeddings rotate pairs) and, when derived,
// hidden_size a multiple of num_attention_heads. Throws InvalidInput naming the field.
DecoderDims parse_decoder_dims(const ConfigReader& c, const DecoderDefaults& defaults);

}  // namespace osprey
