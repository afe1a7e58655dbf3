#pragma once
// What the file formats know of each model family, one row a family, as llama.cpp keeps one
// table per architecture (llama-arch.cpp) that its converter, loader and vocabulary read. The
// GGUF reader (formats/gguf_model.cpp), the GGUF writer (formats/gguf_writer.cpp), the GGUF
// tokenizer (formats/gguf_tokenizer.cpp) and the family registry (model/registry.cpp: aliases)
// look a family up here; none of them names one. docs/design.md, "Formats".
#include <span>
#include <string>
#include <string_view>

#include "formats/safetensors.h"

namespace osprey {

// How llama.cpp's byte-level BPE pre-tokenizer of a `tokenizer.ggml.pre` name splits text: a
// regex split then the byte-level mapping, and the normalizer beside it.
struct GgufPreTokenizer {
  const char* name;    // tokenizer.ggml.pre
  const char* regex;   // nullptr: ByteLevel's own (GPT-2) regex
  bool nfc;            // an NFC normalizer
  bool digits;         // single digits split first (Cohere's Digits pre-tokenizer)
  bool ignore_merges;  // a whole pre-token in the vocabulary is taken as is (Llama 3)
};

// Which layers of a GGUF file slide over a window, and under which keys.
enum class GgufWindow {
  none,         // full attention everywhere
  every_layer,  // <arch>.attention.sliding_window, when present, over every layer (Mistral)
  pattern,      // <arch>.attention.sliding_window (required) over the layers that
                // <arch>.attention.sliding_window_pattern names (bools, or every n-th full)
};

// One family as the file formats see it. The hyperparameters every family shares
// (<arch>.embedding_length <-> hidden_size, block_count, attention.head_count, ...) are read
// and written alike for all; the fields below are each family's differences, as types.
struct FamilyFormats {
  const char* model_type;  // config.json's model_type
  // The registered family whose config reader parses this model_type (an alias of a
  // checkpoint type with the same layout); nullptr: the family of this very name.
  const char* reads_as = nullptr;
  // general.architecture in GGUF files; nullptr: not read from or written to GGUF.
  const char* gguf_arch = nullptr;
  // Why there is no gguf_arch, for the error that refuses one ("a mixture of experts").
  const char* no_gguf_because = nullptr;
  // How llama.cpp's converter laid the tensors out (Llama's q/k rows interleaved, Gemma's
  // norms stored as 1 + w); the writer does the same.
  TensorLayout gguf_layout = {};
  // GGUF's ffn_norm is the pre-feedforward norm and post_attention_norm a tensor of its own
  // (Gemma 3 norms each block's input and output); otherwise ffn_norm is Hugging Face's
  // post_attention_layernorm (formats/gguf_names.h).
  bool sandwich_norms = false;
  // llama.cpp's rope base when <arch>.rope.freq_base is absent.
  double gguf_rope_theta = 10000.0;
  // <arch>.attention.layer_norm_epsilon <-> layer_norm_eps (a LayerNorm family); otherwise
  // <arch>.attention.layer_norm_rms_epsilon <-> rms_norm_eps.
  bool layer_norm = false;
  GgufWindow window = GgufWindow::none;
  int window_pattern = 0;  // GgufWindow::pattern: every n-th layer full when the file lists none
  // Llama 3's rope scaling as rope_freqs.weight (one factor a frequency), as llama.cpp does.
  bool rope_freqs = false;
  // The sliding layers' own rope base, <arch>.rope.freq_base_swa (10000 when absent), read into
  // rope_parameters by layer type ({full_attention, sliding_attention}).
  bool local_rope_base = false;
  // <arch>.attention.scale <-> query_pre_attn_scalar (1 / scale^2), with llama.cpp's rule when
  // absent (hidden / heads for 62 layers, the head size otherwise).
  bool attention_scale = false;
  // <arch>.final_logit_softcapping and <arch>.attn_logit_softcapping.
  bool softcapping = false;
  // <arch>.logit_scale <-> logit_scale (Cohere; 1 when absent).
  bool logit_scale = false;
  // tokenizer.ggml.pre of the family's byte-level BPE tokenizer (a GgufPreTokenizer's name);
  // nullptr: none (its tokenizer.json is left out of a GGUF file unless SentencePiece's).
  const char* gguf_pre = nullptr;
};

// Every row, in table order.
std::span<const FamilyFormats> family_formats();

// The formats of a config.json model_type: its row, or for an alias that states no GGUF
// architecture of its own, the row of the family it reads as; nullptr when no row names it.
const FamilyFormats* family_formats(std::string_view model_type);

// The family an alias reads as (its row's reads_as); nullptr for a family or an unknown type.
const char* family_reads_as(std::string_view model_type);

// The row a GGUF file of `arch` reads as: the architecture's first row, or, when the file
// states a window over every layer (`has_window`) and that row has none, the architecture's
// first GgufWindow::every_layer row (llama with a window is Mistral); nullptr for an
// architecture no row writes.
const FamilyFormats* family_formats_of_gguf_arch(std::string_view arch, bool has_window);

// "llama, qwen2, ..." (each GGUF architecture once, in table order), for errors.
std::string gguf_archs_supported();

// "llama, mistral, ..." (the model_types written to GGUF, in table order), for errors.
std::string gguf_model_types_supported();

// The pre-tokenizer of a tokenizer.ggml.pre name (the families' and llama.cpp's "default" and
// "gpt2"); nullptr for another.
const GgufPreTokenizer* gguf_pre_tokenizer(std::string_view name);

// "llama-bpe, qwen2, ...", for errors.
std::string gguf_pre_tokenizers_supported();

}  // namespace osprey
