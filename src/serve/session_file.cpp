#include "serve/session_file.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/log.h"
#include "model/model.h"

namespace osprey {

CacheFingerprint session_fingerprint(const std::filesystem::path& model_path, const Model& model,
                                     const KVCacheParams& options) {
  CacheFingerprint fp = model_fingerprint(model_path, model.info().device);
  fp.kv = kv_layout_fingerprint(PromptFileKind::dense, model_kv_layers(model, options), 0);
  return fp;
}

SessionRestore restore_session(const std::filesystem::path& path, const CacheFingerprint& fingerprint,
                               const Model& model, SequenceCache& cache, std::span<const int32_t> prompt,
                               const KVCacheParams& options) {
  SessionRestore r;
  if (cache.offset() != 0)
    throw InvalidInput("restore_session: the cache already holds " + std::to_string(cache.offset()) + " rows");
  std::error_code ec;
  if (!std::filesystem::exists(path, ec) && !std::filesystem::is_symlink(path, ec)) return r;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<KVCacheParams> layers = model_kv_layers(model, options);
  PromptFileData data;
  try {
    data = read_prompt_file(path, fingerprint, layers);
    if (data.kind != PromptFileKind::dense)
      throw InvalidInput(path.string() + ": holds paged blocks, not a sequence's cache");
  } catch (const Error& e) {
    r.skipped = e.what();
    log_warn(std::string("prompt cache: not using ") + e.what());
    return r;
  }
  r.bytes_read = std::filesystem::file_size(path, ec);
  const size_t common = size_t(
      std::mismatch(data.tokens.begin(), data.tokens.end(), prompt.begin(), prompt.end()).first - data.tokens.begin());
  // The last prompt token is computed again: its logits choose the first token.
  const int64_t use = int64_t(std::min(common, prompt.empty() ? size_t(0) : prompt.size() - 1));
  if (use == 0) {
    r.skipped = path.string() + ": shares no prefix with the prompt";
    return r;
  }
  cache.restore(dense_file_states(data, layers, model.info().device));
  const int64_t drop = int64_t(data.tokens.size()) - use;
  if (!cache.can_trim(drop)) {
    cache.trim(cache.offset());
    r.skipped = path.string() + ": a sliding-window layer no longer holds the rows before the common prefix's end";
    log_warn("prompt cache: not using " + r.skipped + " (the prompt is computed from the start)");
    return r;
  }
  cache.trim(drop);
  r.n_cached = use;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

uint64_t save_session(const std::filesystem::path& path, const CacheFingerprint& fingerprint, const Model& model,
                      const SequenceCache& cache, std::span<const int32_t> tokens, const KVCacheParams& options) {
  const int64_t n = cache.offset();
  if (n < 1 || n > int64_t(tokens.size()))
    throw InvalidInput("save_session: a cache of " + std::to_string(n) + " rows for " + std::to_string(tokens.size()) +
                       " tokens");
  const std::vector<KVCacheParams> layers = model_kv_layers(model, options);
  const PromptFileData data =
      dense_file_data(std::vector<int32_t>(tokens.begin(), tokens.begin() + n), cache.snapshot(), "", layers);
  return write_prompt_file(path, data, fingerprint, layers, 0);
}

}  // namespace osprey
