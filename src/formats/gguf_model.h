#pragma once
// A GGUF file as a checkpoint of a registered family: its `general.architecture` and
// `<arch>.*` hyperparameters become the config.json that the family's own reader parses, and
// its tensors (blk.N.attn_q.weight, ...) are named as the Hugging Face checkpoint names them,
// so that every family runs from GGUF through the same DecoderSpec and decoder as from
// safetensors (docs/gguf.md lists the architectures and keys).
#include <filesystem>

#include "formats/config_reader.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"

namespace osprey {

// Whether `path` names a GGUF file (a regular file whose name ends in .gguf).
bool is_gguf_path(const std::filesystem::path& path);

struct GgufCheckpoint {
  ConfigReader config;  // the config.json equivalent (model_type, dimensions, rope, ...)
  SafeTensors tensors;  // under Hugging Face names, in the mapping (no copy)
};

// Throws Unsupported for an architecture or tensor type Osprey does not read (naming it and
// the supported ones), InvalidInput for a missing or malformed key or tensor.
GgufCheckpoint read_gguf_checkpoint(const GgufFile& gguf);

}  // namespace osprey
