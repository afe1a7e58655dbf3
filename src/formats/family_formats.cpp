#include "formats/family_formats.h"

#include <span>
#include <vector>

namespace osprey {
namespace {

constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The pre-tokenizers of the Hugging Face tokenizers that llama.cpp names by tokenizer.ggml.pre.
constexpr GgufPreTokenizer kPreTokenizers[] = {
    // name        regex         nfc    digits ignore_merges
    {"llama-bpe", kLlama3Regex, false, false, true},
    {"qwen2", kQwen2Regex, true, false, false},
    {"command-r", nullptr, true, true, false},
    {"default", nullptr, false, false, false},
    {"gpt2", nullptr, false, false, false},
};

constexpr const char* kMoe = "a mixture of experts (GGUF's expert tensors are not read or written yet)";

// One line a family. An alias of a family with the same layout is one line naming the family
// it reads as, and takes that family's formats: {.model_type = "...", .reads_as = "llama"}.
// NOTE: llama.cpp's converter permutes Llama's q/k rows (its rope rotates interleaved pairs)
// and adds one to Gemma's norm weights (its RMSNorm scales by w); the others keep the Hugging
// Face layout. Mistral's checkpoints convert to the llama architecture.
// clang-format off
const FamilyFormats kFamilies[] = {
    {.model_type = "llama", .gguf_arch = "llama", .gguf_layout = {.qk_rows_interleaved = true}, .rope_freqs = true,
     .gguf_pre = "llama-bpe"},
    {.model_type = "mistral", .gguf_arch = "llama", .gguf_layout = {.qk_rows_interleaved = true},
     .window = GgufWindow::every_layer, .rope_freqs = true, .gguf_pre = "llama-bpe"},
    {.model_type = "qwen2", .gguf_arch = "qwen2", .gguf_rope_theta = 1e6, .gguf_pre = "qwen2"},
    {.model_type = "qwen3", .gguf_arch = "qwen3", .gguf_rope_theta = 1e6, .gguf_pre = "qwen2"},
    {.model_type = "gemma3_text", .gguf_arch = "gemma3", .gguf_layout = {.norm_unit_offset_folded = true},
     .sandwich_norms = true, .gguf_rope_theta = 1e6, .window = GgufWindow::pattern, .window_pattern = 6,
     .local_rope_base = true, .attention_scale = true, .softcapping = true},  // SentencePiece: no gguf_pre
    {.model_type = "gemma3", .no_gguf_because = "its language model's config is nested in text_config"},
    {.model_type = "cohere2", .gguf_arch = "cohere2", .layer_norm = true, .window = GgufWindow::pattern,
     .window_pattern = 4, .logit_scale = true, .gguf_pre = "command-r"},
    {.model_type = "qwen3_moe", .no_gguf_because = kMoe},
    {.model_type = "mixtral", .no_gguf_because = kMoe},
};
// clang-format on

// The row that names `model_type`, an alias's own included; nullptr when none does.
const FamilyFormats* own_row(std::string_view model_type) {
  for (const FamilyFormats& f : kFamilies)
    if (model_type == f.model_type) return &f;
  return nullptr;
}

std::string join_once(const std::vector<std::string>& names) {
  std::string s;
  std::vector<std::string> seen;
  for (const std::string& n : names) {
    bool dup = false;
    for (const std::string& x : seen) dup = dup || x == n;
    if (dup) continue;
    seen.push_back(n);
    s += (s.empty() ? "" : ", ") + n;
  }
  return s;
}

}  // namespace

std::span<const FamilyFormats> family_formats() { return kFamilies; }

const FamilyFormats* family_formats(std::string_view model_type) {
  const FamilyFormats* f = own_row(model_type);
  if (f && f->reads_as && !f->gguf_arch && !f->no_gguf_because) return own_row(f->reads_as);
  return f;
}

const char* family_reads_as(std::string_view model_type) {
  const FamilyFormats* f = own_row(model_type);
  return f ? f->reads_as : nullptr;
}

const FamilyFormats* family_formats_of_gguf_arch(std::string_view arch, bool has_window) {
  const FamilyFormats* first = nullptr;
  for (const FamilyFormats& f : family_formats()) {
    if (!f.gguf_arch || arch != f.gguf_arch) continue;
    if (!first) first = &f;
    if (!has_window || first->window != GgufWindow::none) return first;
    if (f.window == GgufWindow::every_layer) return &f;
  }
  return first;
}

std::string gguf_archs_supported() {
  std::vector<std::string> names;
  for (const FamilyFormats& f : family_formats())
    if (f.gguf_arch) names.push_back(f.gguf_arch);
  return join_once(names);
}

std::string gguf_model_types_supported() {
  std::vector<std::string> names;
  for (const FamilyFormats& f : kFamilies)
    if (family_formats(f.model_type)->gguf_arch) names.push_back(f.model_type);
  return join_once(names);
}

const GgufPreTokenizer* gguf_pre_tokenizer(std::string_view name) {
  for (const GgufPreTokenizer& p : kPreTokenizers)
    if (name == p.name) return &p;
  return nullptr;
}

std::string gguf_pre_tokenizers_supported() {
  std::vector<std::string> names;
  for (const GgufPreTokenizer& p : kPreTokenizers) names.push_back(p.name);
  return join_once(names);
}

}  // namespace osprey
