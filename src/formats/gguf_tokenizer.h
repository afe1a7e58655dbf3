#pragma once
// The tokenizer and chat template a GGUF file carries in its metadata (tokenizer.ggml.*,
// tokenizer.chat_template), as the tokenizer.json and tokenizer_config.json texts that
// Hugging Face's tokenizer of the same model holds, for Tokenizer::from_json.
#include <string>

#include "formats/gguf.h"

namespace osprey {

struct GgufTokenizerJson {
  std::string tokenizer_json;  // model, added tokens, normalizer, pre-tokenizer, post-processor, decoder
  std::string config_json;     // bos_token, eos_token, add_bos_token, chat_template
};

// tokenizer.ggml.model "gpt2" (byte-level BPE) with the pre-tokenizer tokenizer.ggml.pre names
// (llama-bpe, qwen2, command-r, default), or "llama" (SentencePiece BPE: tokens, scores, token
// types, <0xXX> byte pieces, the U+2581 space, tokenizer.ggml.add_space_prefix; BOS added by
// default, as llama.cpp does): a BPE with byte fallback whose merges follow the scores. Throws Unsupported naming another model or
// pre-tokenizer, InvalidInput for missing or inconsistent keys (naming them).
GgufTokenizerJson gguf_tokenizer_json(const GgufFile& gguf);

}  // namespace osprey
