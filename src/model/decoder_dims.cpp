#include "model/decoder_dims.h"

#include <string>

namespace osprey {

DecoderDims parse_decoder_dims(const ConfigReader& c, const DecoderDefaults& d) {
  auto read = [&](const char* key, int64_t fallback) {
    const int64_t v = fallback == DecoderDefaults::kRequired ? c.get_int(key) : c.get_int(key, fallback);
    if (v <= 0) c.fail(key, "must be positive, got " + std::to_string(v));
    if (v > INT32_MAX) c.fail(key, "must be below 2^31, got " + std::to_string(v));
    return v;
  };
  DecoderDims dims;
  dims.vocab_size = read("vocab_size", d.vocab_size);
  dims.hidden_size = read("hidden_size", d.hidden_size);
  dims.intermediate_size = read("intermediate_size", d.intermediate_size);
  dims.n_layers = read("num_hidden_layers", d.n_layers);
  dims.n_heads = read("num_attention_heads", d.n_heads);
  dims.n_kv_heads = read("num_key_value_heads", d.n_kv_heads > 0 ? d.n_kv_heads : dims.n_heads);
  dims.max_position_embeddings = read("max_position_embeddings", d.max_position_embeddings);
  if (dims.n_heads % dims.n_kv_heads != 0)
    c.fail("num_key_value_heads", "must divide num_attention_heads (" + std::to_string(dims.n_heads) + ")");
  if (c.has("head_dim") || d.head_dim > 0) {
    dims.head_dim = read("head_dim", d.head_dim > 0 ? d.head_dim : DecoderDefaults::kRequired);
  } else {
    if (dims.hidden_size % dims.n_heads != 0) c.fail("hidden_size", "is not a multiple of num_attention_heads");
    dims.head_dim = dims.hidden_size / dims.n_heads;
  }
  if (dims.head_dim % 2 != 0) c.fail("head_dim", "must be even for rotary embeddings, got " + std::to_string(dims.head_dim));
  return dims;
}

}  // namespace osprey
