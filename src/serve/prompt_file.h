#pragma once
// Prompt-cache files: the K/V rows of a token prefix on disk, for a prompt cache that
// survives a restart (docs/design.md, "The persistent prompt cache").
//
// A file is, little-endian:
//   [8]  magic "OSPKVC\r\n"
//   [4]  u32 format version (kPromptFileVersion)
//   [4]  u32 H, the header's length
//   [H]  the header, JSON: kind, the model's fingerprint, salt, token count, first stored row,
//        payload size and the payload's crc32
//   [4]  u32 crc32 of every byte before it
//   [P]  the payload: the tokens (i32 [n_tokens]), then per layer its keys and its values, each
//        [n_kv_heads, rows, head_dim] in the layer's row type (f16 or bf16)
// and nothing after it. It is written to a temporary file beside its path, fsync'ed and renamed
// into place, so a reader finds either the old file or the whole new one.
//
// A reader checks all of it before anything is used: magic, version, both checksums, the exact
// size, and the fingerprint (the weights, the tokenizer, the device kind, the KV layout and,
// for paged files, the block size). What fails is an InvalidInput naming the file and why.
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/array.h"
#include "kv/kv_cache.h"

namespace osprey {

constexpr uint32_t kPromptFileVersion = 1;

// What a file holds: one dense sequence cache's snapshot (the dense layout's prompt-cache entry,
// `generate --prompt-cache`), or a run of full blocks of the paged pool's prefix cache.
enum class PromptFileKind { dense, paged };
const char* prompt_file_kind_name(PromptFileKind kind);

// Which model and cache layout wrote a file. Each field is a canonical string; a file is used
// only where all four equal the reader's.
struct CacheFingerprint {
  // JSON: per weight file (safetensors or GGUF, by name) its size, the crc32 of its header and
  // of 16 samples of 64 KiB spread over it; config.json's crc32.
  std::string weights;
  std::string tokenizer;  // crc32 of tokenizer.json ("none" without one; a GGUF file's is in its header)
  std::string device;     // "cpu" or "cuda": rows computed on one are not the other's bits
  // JSON: the kind, the paged block size (0 for dense files) and every layer's K/V heads, head
  // size, row type and window (dense files: a windowed layer stores its ring).
  std::string kv;

  // "" when equal; else what differs, in words ("the weights differ").
  std::string mismatch(const CacheFingerprint& other) const;
};

// The weights' and tokenizer's part of the fingerprint of the model at `model_path` (a folder,
// or a .gguf file), on `device`. Reads the files' heads and samples (about 1 MiB a file).
// Throws IoError naming a file that cannot be read.
CacheFingerprint model_fingerprint(const std::filesystem::path& model_path, Device device);
// The `kv` field for these layers (Model::kv_params of each layer).
std::string kv_layout_fingerprint(PromptFileKind kind, const std::vector<KVCacheParams>& layers, int64_t block_size);

// The rows a layer of a file stores: a paged file's rows [first_row, n_tokens); a dense file's
// rows [0, n_tokens), or, for a windowed layer, its ring's min(n_tokens, window) rows (position p
// at row p % window).
int64_t prompt_file_rows(PromptFileKind kind, const KVCacheParams& layer, int64_t n_tokens, int64_t first_row);

struct PromptFileData {
  PromptFileKind kind = PromptFileKind::dense;
  std::string salt;             // the prompt-cache salt its rows were stored under
  std::vector<int32_t> tokens;  // the tokens of positions 0 .. n - 1
  int64_t first_row = 0;        // paged: the first stored row (a block boundary); dense: 0
  // Per layer: keys and values [n_kv_heads, prompt_file_rows(...), head_dim] on the CPU, each
  // head's rows contiguous (strides [any, head_dim, 1]).
  std::vector<std::pair<Array, Array>> layers;
};

// What a file's header says, checked (magic, version, header checksum, exact size).
struct PromptFileInfo {
  std::filesystem::path path;
  PromptFileKind kind = PromptFileKind::dense;
  CacheFingerprint fingerprint;
  std::string salt;
  int64_t n_tokens = 0;
  int64_t first_row = 0;
  uint64_t payload_bytes = 0;
  uint32_t payload_crc32 = 0;
  uint64_t file_bytes = 0;
  // Paged files: the prefix ids (prompt_prefix_id) of the tokens before the first stored row
  // (its parent run's end) and of each stored block's end.
  uint64_t parent_id = 0;
  std::vector<uint64_t> block_end_ids;
};

// How a writer puts bytes into a file: ::write by default. A test seam (a disk that fills up).
using PromptFileWriteFn = std::function<ssize_t(int fd, const void* data, size_t n)>;

// A 64-bit id of (salt, tokens), for file names and a paged run's links to its parent. Ids are
// only names: a restore compares the tokens themselves.
uint64_t prompt_prefix_id(const std::string& salt, std::span<const int32_t> tokens);

// crc32 (zlib's) of n bytes, continuing `crc`; large buffers are split over threads and the parts
// combined (crc32_combine).
uint32_t prompt_crc32(uint32_t crc, const void* data, size_t n);

// Writes `data` to `path` atomically: a temporary file in the same folder (mode 0600), the
// header and payload, fsync, rename over `path`, fsync of the folder. `block_size` is the paged
// pool's (for the block end ids of a paged file; 0 for dense files). Returns the file's size.
// Throws IoError naming `path` and the reason (ENOSPC included) after removing the temporary file.
// `stop`, when set, is polled between chunks; when it answers true the write is abandoned the same
// way.
uint64_t write_prompt_file(const std::filesystem::path& path, const PromptFileData& data,
                           const CacheFingerprint& fingerprint, const std::vector<KVCacheParams>& layers,
                           int64_t block_size, const PromptFileWriteFn& write = {},
                           const std::function<bool()>& stop = {});

// Reads and checks a file's header. Throws InvalidInput naming the file and what is wrong (not a
// prompt-cache file, another format version, a truncated or corrupted file), IoError when it
// cannot be read (a directory, a FIFO, no permission).
PromptFileInfo read_prompt_file_info(const std::filesystem::path& path);

// Reads the whole file into CPU arrays, after checking its header and that its fingerprint is
// `expected` ("written for another model: the weights differ"), and its payload's checksum.
// `layers` is the expected model's layout (what the fingerprint's kv field describes). Throws as
// read_prompt_file_info does.
PromptFileData read_prompt_file(const std::filesystem::path& path, const CacheFingerprint& expected,
                                const std::vector<KVCacheParams>& layers);

class Model;
// Every layer's Model::kv_params (`options`: step and inplace, as the caches are made): the
// layout the fingerprint's kv field describes. Throws Unsupported for a tensor-parallel model
// (its layers are split across ranks).
std::vector<KVCacheParams> model_kv_layers(const Model& model, const KVCacheParams& options = {});

// A dense file's data for a sequence cache's snapshot `states` (each at offset tokens.size()),
// called on the thread that owns the device's stream: rows of a CPU cache are views of the
// snapshot's buffers (no copy: a snapshot's rows never change), a device cache's are copied to
// the CPU.
PromptFileData dense_file_data(std::vector<int32_t> tokens, const std::vector<KVState>& states, std::string salt,
                               const std::vector<KVCacheParams>& layers);
// What a dense file restores, on `device`: per layer a state at offset tokens.size() holding its
// rows (a dense layer's in buffers of [heads, n rounded up to the layer's step, head_dim], as the
// cache grows them; a windowed layer its ring), new arrays no cache has written: restoring them
// is a foreign adoption, so the first write after it copies (kv/kv_cache.h).
std::vector<KVState> dense_file_states(const PromptFileData& data, const std::vector<KVCacheParams>& layers,
                                       Device device);

}  // namespace osprey
