#pragma once
// Fetching a model from the Hugging Face Hub (or a server with its URL layout at
// o.endpoint) into the cache of hub_cache.h, in the layout huggingface_hub writes, so that
// Python tools find it there too (docs/design.md, Models by name):
//   GET {endpoint}/api/models/{org}/{name}/revision/{rev}   -> {"sha", "siblings": [{"rfilename"}]}
//   HEAD, then GET {endpoint}/{org}/{name}/resolve/{commit}/{file}, following redirects
// Each file lands in blobs/{etag} (X-Linked-Etag, else ETag, quotes stripped) by way of
// blobs/{etag}.incomplete, which a later attempt resumes with a Range request; then
// snapshots/{commit}/{file} -> ../../blobs/{etag} and refs/{rev} = commit.
#include <filesystem>
#include <string>
#include <vector>

#include "hub/hub_cache.h"

namespace osprey::hub {

// The files of a repository (the API's "siblings") a run reads: config.json,
// generation_config.json, tokenizer.json, tokenizer_config.json, special_tokens_map.json,
// chat_template.jinja when present, and model.safetensors or model.safetensors.index.json
// (whose shards come from the index once it is fetched). Throws InvalidInput naming `repo`
// when config.json, tokenizer.json or the safetensors weights are absent (a GGUF-only
// repository is named as such).
std::vector<std::string> files_to_fetch(const std::vector<std::string>& siblings, const std::string& repo);

// Fetches what a run needs of `id` at its revision and returns the snapshot folder. Files the
// snapshot already holds are not fetched again. Throws IoError: with o.offline (unless the
// cache already holds the whole model); 401/403: the model is gated or private (set HF_TOKEN);
// 404: no such model, revision or file; any other failure names the URL and the HTTP status
// or the transfer error. A failed transfer leaves blobs/{etag}.incomplete for the next try.
std::filesystem::path download_model(const HubId& id, const ResolveOptions& o);

}  // namespace osprey::hub
