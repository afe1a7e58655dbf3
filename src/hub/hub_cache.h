#pragma once
// Models named by folder, by a file in their folder, or by Hugging Face Hub id, found in the
// Hugging Face cache exactly as huggingface_hub lays it out (docs/design.md, Models by name):
//   <cache>/models--{org}--{name}/refs/{revision}          the commit hash the revision names
//   <cache>/models--{org}--{name}/snapshots/{commit}/{file} a symlink to ../../blobs/{etag}
//   <cache>/models--{org}--{name}/blobs/{etag}              the bytes
// Nothing here touches the network; resolve_model calls hub_download.h only when asked to.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/env.h"

namespace osprey::hub {

// A model on the Hub: "org/name", optionally ":revision" (a branch, a tag or a commit hash),
// or ":QUANT", a GGUF quantization (Q4_K_M, q8_0, BF16, ...: see is_gguf_quant_tag) that picks
// one .gguf file of the repository's main revision, as llama.cpp's -hf does.
struct HubId {
  std::string org;
  std::string name;
  std::string revision = "main";
  std::string quant;  // empty: a safetensors model
  std::string repo() const { return org + "/" + name; }
  // "org/name", with ":quant", or ":revision" when it is not main.
  std::string spec() const;
};

// Whether `tag` names a GGUF quantization rather than a revision: (UD-)F32, F16, BF16,
// Q<digit>..., IQ<digit>..., TQ<digit>..., MXFP4..., case-insensitive, letters, digits and '_'.
bool is_gguf_quant_tag(const std::string& tag);

// The one .gguf file among `files` (paths within a repository) whose name ends in id.quant
// after a '-', '.' or '_' (case-insensitive), multimodal projector files (mmproj*) aside.
// Throws InvalidInput naming the repository, the tag and the GGUF files it holds when none or
// several match, or when the match is one part of a split file (-00001-of-00003.gguf).
std::string pick_gguf_file(const std::vector<std::string>& files, const HubId& id);

// `spec` as a Hub id, or nullopt when it is not of the form org/name[:revision] (each part
// letters, digits, '.', '_' and '-', starting and ending with a letter, digit or '_', without
// "--" or "..", at most 96 characters together). Throws InvalidInput naming the revision when
// the id is well formed but the revision is not (empty, "..", a leading or trailing '/').
std::optional<HubId> parse_hub_id(const std::string& spec);

// Whether `revision` is a full commit hash (40 lowercase hex digits).
bool is_commit_hash(const std::string& revision);

// Where and how models by Hub id are found and fetched.
struct ResolveOptions {
  std::filesystem::path cache_dir;  // the Hub cache (see resolve_options)
  std::string endpoint = "https://huggingface.co";
  std::string token;     // sent as "Authorization: Bearer <token>" when not empty
  bool offline = false;  // HF_HUB_OFFLINE: downloads are an error
  bool download = false;  // resolve_model fetches a Hub model that is not (wholly) in the cache
  // Called as a file downloads: the file's name, bytes held so far (a resumed download starts
  // past 0), its size (0 when the server did not say). Called from the downloading thread.
  std::function<void(const std::string& file, uint64_t done, uint64_t total)> progress;
  long connect_timeout_s = 30;  // to open a connection
  long stall_timeout_s = 60;    // a transfer that moves no byte for this long fails
  int n_attempts = 4;           // tries per file; each one after the first resumes with a Range
};

// ResolveOptions from the environment, the cache folder chosen as huggingface_hub chooses it:
// HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
// $HOME/.cache/huggingface/hub; a leading "~/" is the home folder. Empty when none is set.
ResolveOptions resolve_options(const EnvOptions& env);

// <cache>/models--{org}--{name}
std::filesystem::path repo_cache_dir(const std::filesystem::path& cache_dir, const HubId& id);

// The snapshot folder of `id` at its revision, or nullopt when the cache lacks the revision's
// ref or its snapshot. A commit-hash revision names its snapshot directly. Throws InvalidInput
// when a ref file holds something other than a commit hash.
std::optional<std::filesystem::path> find_cached_snapshot(const std::filesystem::path& cache_dir, const HubId& id);

// The files a run needs that `snapshot` lacks: config.json, tokenizer.json, and
// model.safetensors or model.safetensors.index.json with every shard it names. Empty when the
// snapshot is whole.
std::vector<std::string> missing_model_files(const std::filesystem::path& snapshot);

// The model folder `spec` names (what -m takes):
// - a path that exists: a folder is itself, a .gguf file is itself (it holds the whole model:
//   weights, tokenizer and chat template), another file is its folder;
// - else a Hub id with a GGUF tag: the .gguf file of its snapshot the tag picks (downloaded,
//   with o.download, when the cache lacks it);
// - else a Hub id: its snapshot in the cache; when absent (or, with o.download, missing files)
//   and o.download is set, downloaded (hub_download.h); else IoError naming the id, the cache
//   and `osprey pull`;
// - else IoError: no such folder.
// An existing path wins over a Hub id of the same spelling.
std::string resolve_model(const std::string& spec, const ResolveOptions& o);

}  // namespace osprey::hub
