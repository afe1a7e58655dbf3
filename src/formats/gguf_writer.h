#pragma once
// Conversion of a Hugging Face safetensors checkpoint into one GGUF v3 file as llama.cpp's
// convert_hf_to_gguf.py lays it out: general.architecture and the <arch>.* hyperparameters,
// llama.cpp's tensor names (token_embd, blk.N.attn_q, ..., output_norm, output), Llama's q/k
// rows permuted to interleaved rotary pairs, Gemma's norms stored as 1 + w, Llama 3 rope
// scaling as rope_freqs.weight, special token ids and the chat template. Matrices are written
// in the chosen type, quantized as ggml's reference quantizers do; 1-D tensors stay F32
// (docs/gguf.md, "Writing GGUF"). `osprey convert --to gguf` is its front end.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "formats/gguf.h"

namespace osprey {

enum class GgufOutType { f16, bf16, q8_0, q4_0, q4_k };

// nullopt for a name that is not one of f16, bf16, q8_0, q4_0, q4_k.
std::optional<GgufOutType> parse_gguf_outtype(std::string_view name);

// ggml's reference quantizers (quantize_row_*_ref in ggml-quants.c), for n values (a whole
// number of blocks: 32 for Q8_0 and Q4_0, 256 for Q4_K) into out (n / block * block bytes).
void gguf_quantize_q8_0(const float* x, int64_t n, uint8_t* out);
void gguf_quantize_q4_0(const float* x, int64_t n, uint8_t* out);
void gguf_quantize_q4_k(const float* x, int64_t n, uint8_t* out);

struct GgufConvertSummary {
  size_t n_tensors = 0, n_quantized = 0, bytes = 0;
  bool tokenizer_left_out = false;  // a byte-level tokenizer.json of a family without a pre-tokenizer name
};

// Writes `dst` (a new file) from the checkpoint folder `src`. Throws Unsupported for a model
// family llama.cpp's layout is not written for, InvalidInput for an already quantized source
// or a malformed config, IoError when a file cannot be read or written.
GgufConvertSummary convert_to_gguf(const std::filesystem::path& src, const std::filesystem::path& dst,
                                   GgufOutType type, const std::function<void(size_t, size_t)>& progress = {});

}  // namespace osprey
