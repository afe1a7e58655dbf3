// The server's request parsing: a request body's sampling, stop, stream and logprobs fields
// (completions and chat) and its prompt (text, ids, or lists of either), tokenized with the
// demo model's tokenizer; the body read as an Anthropic Messages request and as an OpenAI
// Responses request, then as the chat request each becomes; and the body read as an
// embeddings request (input as text, ids or lists of either, encoding_format, dimensions) with
// the Qwen3-Embedding-layout fixture's tokenizer; each chat request's image parts read and
// decoded (server/image_parts.h). Bad fields must be ApiErrors naming them.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "server/anthropic_api.h"
#include "server/completion_request.h"
#include "server/responses_api.h"
#include "server/embeddings.h"
#include "server/image_parts.h"
#include "tokenizer/tokenizer.h"

using namespace osprey;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Tokenizer t = Tokenizer::load(fuzz::source_path("models/demo"));
  nlohmann::json body = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return 0;
  // A small image limit and pixel limit keep each run short.
  ImagePartOptions images;
  images.max_bytes = 1 << 16;
  images.limits.max_pixels = 1 << 16;
  fuzz::expect_clean([&] {
    nlohmann::ordered_json chat = nlohmann::ordered_json::parse(data, data + size, nullptr, false);
    if (chat.is_object()) (void)take_image_parts(chat, images);
  });
  fuzz::expect_clean([&] { (void)read_completion_fields(body, false); });
  fuzz::expect_clean([&] { (void)read_completion_fields(body, true); });
  const auto ordered = nlohmann::ordered_json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  for (AnthropicRoute route : {AnthropicRoute::messages, AnthropicRoute::count_tokens})
    fuzz::expect_clean([&] {
      nlohmann::ordered_json chat = read_anthropic_request(ordered, route);
      (void)read_completion_fields(nlohmann::json::parse(chat.dump()), true);
      ImagePartOptions converted = images;
      converted.converted = true;
      (void)take_image_parts(chat, converted);
      prepare_chat_messages(chat);
    });
  fuzz::expect_clean([&] {
    const ResponsesRequest r = read_responses_request(ordered);
    nlohmann::ordered_json chat = responses_chat_request(r, responses_conversation(r, nullptr));
    (void)read_completion_fields(nlohmann::json::parse(chat.dump()), true);
    ImagePartOptions converted = images;
    converted.converted = true;
    (void)take_image_parts(chat, converted);
    prepare_chat_messages(chat);
  });
  if (body.is_object() && body.contains("prompt"))
    fuzz::expect_clean([&] { (void)read_prompts(body["prompt"], t, 4096); });
  static const Tokenizer embedding = Tokenizer::load(fuzz::source_path("tests/fixtures/models/qwen3-embedding"));
  fuzz::expect_clean([&] { (void)read_embedding_request(body, embedding, embedding.vocab_size()); });
  return 0;
}
