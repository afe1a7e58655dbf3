#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "formats/config_reader.h"
#include "model/llama.h"
#include "model/rope.h"

namespace osprey {
namespace {

ConfigReader reader(const nlohmann::json& j) { return ConfigReader(j, "config.json"); }

nlohmann::json base() {
  return {{"model_type", "llama"}, {"vocab_size", 128256}, {"hidden_size", 4096}, {"intermediate_size", 14336},
          {"num_hidden_layers", 32}, {"num_attention_heads", 32}, {"num_key_value_heads", 8},
          {"rms_norm_eps", 1e-5}, {"max_position_embeddings", 131072}};
}

}  // namespace

TEST(Config, HubAndTransformers5RopeFormsAgree) {
  auto hub = base();
  hub["rope_theta"] = 500000.0;
  hub["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  auto v5 = base();
  v5["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0},
                           {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                           {"original_max_position_embeddings", 8192}};
  v5["layer_types"] = std::vector<std::string>(32, "full_attention");
  DecoderSpec a = parse_llama_config(reader(hub), 10000.0), b = parse_llama_config(reader(v5), 10000.0);
  EXPECT_EQ(a.head_dim, 128);
  EXPECT_EQ(a.n_kv_heads, 8);
  for (const RopeConfig* r : {&a.rope, &b.rope}) {
    EXPECT_EQ(r->type, "llama3");
    EXPECT_EQ(r->theta, 500000.0);
    EXPECT_EQ(r->factor, 8.0);
    EXPECT_EQ(r->original_max_position_embeddings, 8192);
  }
}

TEST(Config, Llama3RopeScalingFollowsItsThreeBands) {
  // Independent restatement of the llama3 rule on a few frequencies: wavelengths shorter
  // than original/high_freq_factor keep their frequency, longer than original/low_freq_factor
  // are divided by factor, and the band between is interpolated.
  RopeConfig r;
  r.type = "llama3";
  r.theta = 500000.0;
  r.factor = 8.0;
  r.low_freq_factor = 1.0;
  r.high_freq_factor = 4.0;
  r.original_max_position_embeddings = 8192;
  RopeConfig plain = r;
  plain.type = "default";
  auto scaled = rope_inv_freq(r, 128), base_freq = rope_inv_freq(plain, 128);
  ASSERT_EQ(scaled.size(), 64u);
  int n_kept = 0, n_divided = 0, n_mixed = 0;
  for (size_t i = 0; i < 64; ++i) {
    double f = base_freq[i], wavelen = 2 * M_PI / f;
    EXPECT_NEAR(base_freq[i], 1.0 / std::pow(500000.0, double(2 * i) / 128.0), 1e-6 * base_freq[i]);
    if (wavelen < 8192.0 / 4.0) {
      EXPECT_EQ(scaled[i], base_freq[i]);
      ++n_kept;
    } else if (wavelen > 8192.0) {
      EXPECT_NEAR(scaled[i], f / 8.0, 1e-7 * f);
      ++n_divided;
    } else {
      double s = (8192.0 / wavelen - 1.0) / 3.0;
      EXPECT_NEAR(scaled[i], (1 - s) * f / 8.0 + s * f, 1e-6 * f);
      ++n_mixed;
    }
  }
  EXPECT_GT(n_kept, 0);
  EXPECT_GT(n_divided, 0);
  EXPECT_GT(n_mixed, 0);
}

TEST(Config, ExplicitHeadDimWins) {
  auto j = base();
  j["head_dim"] = 64;
  EXPECT_EQ(parse_llama_config(reader(j), 1e4).head_dim, 64);
}

TEST(Config, BadFieldsAreNamed) {
  auto j = base();
  j["num_key_value_heads"] = 5;
  try {
    parse_llama_config(reader(j), 1e4);
    FAIL();
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("num_key_value_heads"), std::string::npos);
  }
  j = base();
  j.erase("hidden_size");
  EXPECT_THROW(parse_llama_config(reader(j), 1e4), InvalidInput);
  j = base();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  try {
    parse_llama_config(reader(j), 1e4);
    FAIL();
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("yarn"), std::string::npos);
  }
}

}  // namespace osprey

namespace osprey {

// The shared dimension fields: a family's defaults fill what the config leaves out, and every
// bad field is named with one message, whichever family reads it.
TEST(DecoderDims, DefaultsFillOmittedKeysAndBadFieldsAreNamed) {
  DecoderDefaults gemma{.vocab_size = 262208, .hidden_size = 2304, .intermediate_size = 9216, .n_layers = 26,
                        .n_heads = 8, .n_kv_heads = 4, .head_dim = 256};
  const DecoderDims g = parse_decoder_dims(ConfigReader(nlohmann::json::object(), "config.json"), gemma);
  EXPECT_EQ(g.vocab_size, 262208);
  EXPECT_EQ(g.n_kv_heads, 4);
  EXPECT_EQ(g.head_dim, 256);  // the default, not 2304 / 8
  EXPECT_EQ(g.max_position_embeddings, 2048);

  const DecoderDims l = parse_decoder_dims(ConfigReader(base(), "config.json"), DecoderDefaults{});
  EXPECT_EQ(l.head_dim, 4096 / 32);
  EXPECT_EQ(l.n_layers, 32);

  auto error = [](const nlohmann::json& j, const DecoderDefaults& d) {
    try {
      parse_decoder_dims(ConfigReader(j, "config.json"), d);
    } catch (const InvalidInput& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto with = [](const char* key, const nlohmann::json& v) {
    nlohmann::json j = base();
    j[key] = v;
    return j;
  };
  nlohmann::json no_vocab = base();
  no_vocab.erase("vocab_size");
  EXPECT_NE(error(no_vocab, DecoderDefaults{}).find("vocab_size"), std::string::npos);
  EXPECT_EQ(error(no_vocab, gemma), "no error");
  EXPECT_NE(error(with("num_key_value_heads", 5), {}).find("\"num_key_value_heads\": must divide num_attention_heads (32)"),
            std::string::npos);
  EXPECT_NE(error(with("hidden_size", -4), {}).find("\"hidden_size\": must be positive"), std::string::npos);
  EXPECT_NE(error(with("num_hidden_layers", int64_t(1) << 31), {}).find("must be below 2^31"), std::string::npos);
  EXPECT_NE(error(with("head_dim", 15), {}).find("\"head_dim\": must be even"), std::string::npos);
  EXPECT_NE(error(with("hidden_size", 4097), {}).find("\"hidden_size\": is not a multiple of num_attention_heads"),
            std::string::npos);
  EXPECT_EQ(error(with("hidden_size", 4097), gemma), "no error");  // head_dim comes from the default
}

}  // namespace osprey
