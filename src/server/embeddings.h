#pragma once
// POST /v1/embeddings (docs/server.md, "Embeddings"): the request's fields read and checked,
// and the reply's shapes. Every check throws ApiError (400) naming the field at fault.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace osprey {

class Tokenizer;

// Inputs one request may carry (OpenAI's limit).
constexpr size_t kMaxEmbeddingInputs = 2048;

struct EmbeddingRequest {
  std::string model;                          // as sent ("" when absent)
  std::vector<std::vector<int32_t>> inputs;   // token ids, one list per input, none empty
  bool base64 = false;                        // encoding_format "base64" (else "float")
  std::optional<int64_t> dimensions;          // Matryoshka truncation; checked against the model by the server
};

// Reads `input` (a string, a list of strings, a list of token ids, or a list of lists of token
// ids), `model`, `encoding_format`, `dimensions` and `user` (accepted, unused). A string is
// tokenized as sentence-transformers does: the tokenizer's post-processor adds its special
// tokens (Qwen3-Embedding's appends <|endoftext|>) and special tokens in the text are parsed;
// token ids are taken as sent. Token ids must lie in [0, vocab_size).
EmbeddingRequest read_embedding_request(const nlohmann::json& body, const Tokenizer& tokenizer, int64_t vocab_size);

// The little-endian bytes of `v` as float32, in base64 (what OpenAI's SDKs decode).
std::string embedding_base64(const std::vector<float>& v);

// The reply: {object "list", data [{object "embedding", index, embedding}], model, usage
// {prompt_tokens, total_tokens}}; each embedding an array of numbers, or base64 when `base64`.
nlohmann::json embedding_reply(const std::vector<std::vector<float>>& embeddings, bool base64, const std::string& model,
                               int64_t n_tokens);

}  // namespace osprey
