#pragma once
// The names llama.cpp gives a decoder's tensors in GGUF files, and the Hugging Face names the
// families read (formats/gguf_model.cpp reads them one way, formats/gguf_writer.cpp writes them the
// other). `sandwich`: the family norms each block's input and output (its row's
// FamilyFormats::sandwich_norms, formats/family_formats.h: Gemma 3), so GGUF's ffn_norm is the
// pre-feedforward norm and post_attention_norm a tensor of its own; otherwise ffn_norm is
// Hugging Face's post_attention_layernorm.
#include <string>

namespace osprey {

// The Hugging Face name of a GGUF tensor ("blk.3.attn_q.weight" ->
// "model.layers.3.self_attn.q_proj.weight"); the GGUF name itself when it has none.
std::string hf_tensor_name(const std::string& gguf_name, bool sandwich);

// The GGUF name of a Hugging Face tensor; empty for one llama.cpp does not store.
std::string gguf_tensor_name(const std::string& hf_name, bool sandwich);

}  // namespace osprey
