#pragma once
// One sequence's cache in a prompt-cache file: `osprey generate --prompt-cache FILE`, as
// llama-cli's flag (docs/design.md, "The persistent prompt cache"). Before a run the longest
// usable prefix of the prompt is restored from FILE into the caller's cache; after it the cache
// (prompt and reply) is written back to FILE atomically.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

#include "serve/prompt_file.h"

namespace osprey {

class Model;

struct SessionRestore {
  int64_t n_cached = 0;     // leading prompt tokens the cache now holds (at most the prompt's length - 1)
  uint64_t bytes_read = 0;  // the file's size, when it was read
  double seconds = 0;       // reading, checking and restoring it
  // Why nothing was restored from an existing file ("" when something was, or there was no file).
  std::string skipped;
};

// The fingerprint a session file of `model` (loaded from `model_path`) carries: dense files.
// Throws Unsupported for a tensor-parallel model. `options` (here and below): the cache's options
// as make_cache took them; its key and value types are part of the file's layout, so a file of
// other types is skipped, naming them.
CacheFingerprint session_fingerprint(const std::filesystem::path& model_path, const Model& model,
                                     const KVCacheParams& options = {});

// Restores into `cache` (which must be empty) the longest prefix of `prompt` that the file at
// `path` holds, keeping at least the last prompt token to compute. No file: nothing restored. A
// file that cannot be used (another model, truncated, corrupted, a directory) is skipped with
// a warning naming it and why; so is a match a sliding-window layer cannot rewind to.
SessionRestore restore_session(const std::filesystem::path& path, const CacheFingerprint& fingerprint,
                               const Model& model, SequenceCache& cache, std::span<const int32_t> prompt,
                               const KVCacheParams& options = {});

// Writes the cache's rows (its offset's worth of `tokens`, the sequence from position 0) to
// `path` atomically. Returns the file's size. Throws IoError naming the file (a full disk, ...).
uint64_t save_session(const std::filesystem::path& path, const CacheFingerprint& fingerprint, const Model& model,
                      const SequenceCache& cache, std::span<const int32_t> tokens, const KVCacheParams& options = {});

}  // namespace osprey
