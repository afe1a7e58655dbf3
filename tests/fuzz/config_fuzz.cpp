// config.json reading: the typed reads every family makes (the Llama fields, rope scaling,
// quantization, token ids) on arbitrary JSON. Errors must name a field; nothing else may
// escape.
#include <nlohmann/json.hpp>

#include "formats/config_reader.h"
#include "fuzz_util.h"
#include "model/llama.h"
#include "model/weight_loader.h"

using namespace osprey;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return 0;
  const ConfigReader c(j, "config.json");
  fuzz::expect_clean([&] { (void)parse_llama_config(c, 10000.0); });
  fuzz::expect_clean([&] { (void)parse_quant_config(c); });
  fuzz::expect_clean([&] { (void)c.get_int_list("eos_token_id"); });
  fuzz::expect_clean([&] { (void)c.get_token_id("bos_token_id"); });
  fuzz::expect_clean([&] { (void)c.get_choice("hidden_act", "silu", {"silu"}); });
  fuzz::expect_clean([&] { (void)c.get_string_list("architectures"); });
  return 0;
}
