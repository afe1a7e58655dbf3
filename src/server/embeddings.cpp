#include "server/embeddings.h"

#include <cstring>

#include "core/error.h"
#include "server/api_error.h"
#include "server/base64.h"
#include "server/completion_request.h"
#include "tokenizer/tokenizer.h"

namespace osprey {
namespace {

using nlohmann::json;

const char* kInputForms = "a string, an array of strings, an array of token ids, or an array of arrays of token ids";

ApiError input_error(const std::string& what) { return bad_request("'input' " + what, "input"); }

std::vector<int32_t> token_list(const json& ids, int64_t vocab_size, size_t index) {
  const std::string where = index == SIZE_MAX ? "" : " (input " + std::to_string(index) + ")";
  if (ids.empty()) throw input_error("must not hold an empty array of token ids" + where);
  std::vector<int32_t> out;
  out.reserve(ids.size());
  for (const json& t : ids) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab_size)
      throw input_error("must hold token ids in [0, " + std::to_string(vocab_size) + ")" + where);
    out.push_back(int32_t(t.get<int64_t>()));
  }
  return out;
}

std::vector<int32_t> text_tokens(const json& s, const Tokenizer& tokenizer, size_t index) {
  const std::string where = index == SIZE_MAX ? "" : " (input " + std::to_string(index) + ")";
  const std::string& text = s.get_ref<const std::string&>();
  if (text.empty()) throw input_error("must not hold an empty string" + where);
  try {
    return tokenizer.encode(text, /*add_special=*/true, /*parse_special=*/true);
  } catch (const InvalidInput& e) {
    throw input_error(std::string(e.what()) + where);
  }
}

}  // namespace

EmbeddingRequest read_embedding_request(const json& body, const Tokenizer& tokenizer, int64_t vocab_size) {
  if (!body.is_object()) throw bad_request("the request body must be a JSON object");
  EmbeddingRequest r;
  if (auto model = string_field(body, "model")) r.model = *model;
  if (body.contains("user") && !body["user"].is_null() && !body["user"].is_string())
    throw bad_request("'user' must be a string", "user");
  if (auto format = string_field(body, "encoding_format")) {
    if (*format == "base64")
      r.base64 = true;
    else if (*format != "float")
      throw bad_request("'encoding_format' must be \"float\" or \"base64\", not \"" + *format + "\"", "encoding_format");
  }
  r.dimensions = int_field(body, "dimensions", 1, INT64_MAX);

  auto it = body.find("input");
  if (it == body.end() || it->is_null()) throw bad_request("'input' is required", "input");
  const json& input = *it;
  if (input.is_string()) {
    r.inputs.push_back(text_tokens(input, tokenizer, SIZE_MAX));
  } else if (input.is_array()) {
    if (input.empty()) throw input_error("must not be an empty array");
    if (input[0].is_number()) {
      r.inputs.push_back(token_list(input, vocab_size, SIZE_MAX));
    } else {
      if (input.size() > kMaxEmbeddingInputs)
        throw input_error("may hold at most " + std::to_string(kMaxEmbeddingInputs) + " inputs, got " +
                          std::to_string(input.size()));
      const bool strings = input[0].is_string();
      for (size_t i = 0; i < input.size(); ++i) {
        const json& x = input[i];
        if (strings && x.is_string())
          r.inputs.push_back(text_tokens(x, tokenizer, i));
        else if (!strings && x.is_array())
          r.inputs.push_back(token_list(x, vocab_size, i));
        else
          throw input_error("must be " + std::string(kInputForms) + " (input " + std::to_string(i) +
                            " does not match input 0)");
      }
    }
  } else {
    throw input_error("must be " + std::string(kInputForms));
  }
  return r;
}

std::string embedding_base64(const std::vector<float>& v) {
  std::string bytes(v.size() * 4, '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &v[i], 4);
    for (int b = 0; b < 4; ++b) bytes[i * 4 + size_t(b)] = char((u >> (8 * b)) & 0xff);  // little-endian
  }
  return base64_encode(bytes);
}

json embedding_reply(const std::vector<std::vector<float>>& embeddings, bool base64, const std::string& model,
                     int64_t n_tokens) {
  json data = json::array();
  for (size_t i = 0; i < embeddings.size(); ++i)
    data.push_back({{"object", "embedding"},
                    {"index", i},
                    {"embedding", base64 ? json(embedding_base64(embeddings[i])) : json(embeddings[i])}});
  return {{"object", "list"},
          {"data", std::move(data)},
          {"model", model},
          {"usage", {{"prompt_tokens", n_tokens}, {"total_tokens", n_tokens}}}};
}

}  // namespace osprey
