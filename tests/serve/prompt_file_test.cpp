// Prompt-cache files (serve/prompt_file.h): what is written is read back bit for bit, and every
// kind of damage (truncation, a flipped byte, another version, another model or layout, a
// directory, a full disk) is refused with an error naming the file and why, leaving nothing
// half-written. A restored snapshot is a foreign adoption: later in-place writes never reach it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "core/error.h"
#include "kv/dense_cache.h"
#include "serve/prompt_cache.h"
#include "serve/prompt_file.h"
#include "support/kv_params.h"
#include "support/test_util.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// Two layers: a dense one and a sliding-window one (a ring of 4 rows), f16 and bf16.
std::vector<KVCacheParams> file_layers() {
  KVCacheParams a = testing::kv_params(2, 4);
  a.step = 64;
  KVCacheParams b = a;
  b.dtype = DType::bf16;
  b.window = 4;
  return {a, b};
}

CacheFingerprint file_fingerprint(PromptFileKind kind = PromptFileKind::dense, int64_t block_size = 0) {
  CacheFingerprint fp;
  fp.weights = R"({"files":[{"bytes":1,"file":"model.safetensors","header_crc32":1,"samples_crc32":2}]})";
  fp.tokenizer = "00000000deadbeef";
  fp.device = "cpu";
  fp.kv = kv_layout_fingerprint(kind, file_layers(), block_size);
  return fp;
}

// f32 rows [n, heads, head_dim] of seeded values.
Array random_rows(int64_t n, int64_t heads, int64_t dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2, 2);
  Array a = Array::empty({n, heads, dim}, DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = u(rng);
  return a;
}

// A sequence cache of file_layers() holding n rows (written as one prefill).
SequenceCache filled_cache(int64_t n, uint32_t seed = 7) {
  std::vector<std::unique_ptr<KVCache>> layers;
  for (const KVCacheParams& p : file_layers()) layers.push_back(make_kv_cache(p));
  SequenceCache c(std::move(layers));
  for (size_t l = 0; l < c.n_layers(); ++l) {
    const KVCacheParams p = file_layers()[l];
    c.layer(l).update_and_fetch(random_rows(n, p.n_kv_heads, p.head_dim, seed + uint32_t(l)),
                                random_rows(n, p.n_kv_heads, p.head_dim, seed + 100 + uint32_t(l)));
  }
  return c;
}

std::vector<int32_t> tokens_upto(int64_t n) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(int32_t(100 + i * 3));
  return t;
}

// The bytes of rows [0, n) of a [heads, rows, dim] array, head by head.
std::string rows_bytes(const Array& a, int64_t n) {
  std::string out;
  const size_t row = size_t(a.dim(2)) * a.itemsize();
  for (int64_t h = 0; h < a.dim(0); ++h)
    out.append(static_cast<const char*>(a.raw()) + size_t(h * a.strides()[0]) * a.itemsize(), size_t(n) * row);
  return out;
}

fs::path write_dense(const TempDir& d, int64_t n, const std::string& name = "f.oskv") {
  SequenceCache c = filled_cache(n);
  const fs::path path = d / name;
  write_prompt_file(path, dense_file_data(tokens_upto(n), c.snapshot(), "salt", file_layers()), file_fingerprint(),
                    file_layers(), 0);
  return path;
}

// The error message read_prompt_file throws for `path`; "" when it reads.
std::string read_error(const fs::path& path, const CacheFingerprint& fp = file_fingerprint()) {
  try {
    read_prompt_file(path, fp, file_layers());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(PromptFile, DenseSnapshotRoundTripsBitForBitDenseAndRingLayers) {
  TempDir d;
  // 3 rows: the ring has not wrapped; 11: it has (the file keeps its whole ring).
  for (int64_t n : {3, 11}) {
    SCOPED_TRACE(n);
    SequenceCache c = filled_cache(n);
    const std::vector<KVState> snap = c.snapshot();
    const fs::path path = d / ("f" + std::to_string(n));
    const uint64_t bytes =
        write_prompt_file(path, dense_file_data(tokens_upto(n), snap, "salt", file_layers()), file_fingerprint(),
                          file_layers(), 0);
    EXPECT_EQ(bytes, fs::file_size(path));
    const PromptFileData back = read_prompt_file(path, file_fingerprint(), file_layers());
    EXPECT_EQ(back.kind, PromptFileKind::dense);
    EXPECT_EQ(back.salt, "salt");
    EXPECT_EQ(back.tokens, tokens_upto(n));
    ASSERT_EQ(back.layers.size(), 2u);
    EXPECT_EQ(back.layers[0].first.dim(1), n);
    EXPECT_EQ(back.layers[1].first.dim(1), std::min<int64_t>(n, 4));
    for (size_t l = 0; l < 2; ++l) {
      const int64_t rows = back.layers[l].first.dim(1);
      EXPECT_EQ(rows_bytes(back.layers[l].first, rows), rows_bytes(snap[l].keys, rows));
      EXPECT_EQ(rows_bytes(back.layers[l].second, rows), rows_bytes(snap[l].values, rows));
    }
    // The states it restores hold those rows at the snapshot's offset, the ring at its width.
    const std::vector<KVState> states = dense_file_states(back, file_layers(), Device::cpu());
    EXPECT_EQ(states[0].offset, n);
    EXPECT_EQ(states[1].keys.dim(1), 4);
    EXPECT_EQ(rows_bytes(states[1].keys, std::min<int64_t>(n, 4)), rows_bytes(snap[1].keys, std::min<int64_t>(n, 4)));
    EXPECT_EQ(names_in(d.path()).size(), n == 3 ? 1u : 2u) << "no temporary file is left";
  }
}

TEST(PromptFile, PagedRunRecordsItsParentAndBlockEnds) {
  TempDir d;
  const int64_t bs = 4;
  PromptFileData data;
  data.kind = PromptFileKind::paged;
  data.tokens = tokens_upto(12);
  data.first_row = 4;  // blocks 1 and 2; block 0 is the parent run's
  for (const KVCacheParams& p : file_layers())
    data.layers.emplace_back(Array::zeros({p.n_kv_heads, 8, p.head_dim}, p.dtype), Array::zeros({p.n_kv_heads, 8, p.head_dim}, p.dtype));
  const CacheFingerprint fp = file_fingerprint(PromptFileKind::paged, bs);
  write_prompt_file(d / "run", data, fp, file_layers(), bs);
  const PromptFileInfo info = read_prompt_file_info(d / "run");
  EXPECT_EQ(info.kind, PromptFileKind::paged);
  EXPECT_EQ(info.first_row, 4);
  EXPECT_EQ(info.parent_id, prompt_prefix_id("", std::span<const int32_t>(data.tokens).first(4)));
  EXPECT_EQ(info.block_end_ids, (std::vector<uint64_t>{prompt_prefix_id("", std::span<const int32_t>(data.tokens).first(8)),
                                                       prompt_prefix_id("", data.tokens)}));
  EXPECT_EQ(read_prompt_file(d / "run", fp, file_layers()).layers[0].first.dim(1), 8);
  // Not whole blocks: refused before anything is written.
  data.first_row = 2;
  EXPECT_THROW(write_prompt_file(d / "bad", data, fp, file_layers(), bs), InvalidInput);
  EXPECT_FALSE(fs::exists(d / "bad"));
}

TEST(PromptFile, DamagedFilesAreRefusedNamingTheFileAndWhy) {
  TempDir d;
  const fs::path good = write_dense(d, 9);
  const std::string bytes = testing::read_file(good);
  ASSERT_EQ(read_error(good), "");

  struct Case {
    std::string name, bytes, why;
  };
  std::string flipped_payload = bytes, flipped_header = bytes, version = bytes, magic = bytes;
  flipped_payload[bytes.size() - 7] ^= 0x10;
  flipped_header[40] ^= 0x01;
  version[8] = 2;
  magic[0] = 'X';
  const std::vector<Case> cases = {
      {"empty", "", "truncated"},
      {"lead_only", bytes.substr(0, 12), "truncated"},
      {"half_header", bytes.substr(0, 60), "truncated"},
      {"half_payload", bytes.substr(0, bytes.size() / 2 + 40), "truncated"},
      {"one_byte_short", bytes.substr(0, bytes.size() - 1), "truncated"},
      {"trailing", bytes + "x", "after the payload"},
      {"flipped_payload", flipped_payload, "payload's checksum"},
      {"flipped_header", flipped_header, "header's checksum"},
      {"version", version, "format version 2"},
      {"magic", magic, "not a prompt-cache file"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    testing::write_file(d / c.name, c.bytes);
    const std::string e = read_error(d / c.name);
    EXPECT_TRUE(has(e, (d / c.name).string())) << e;
    EXPECT_TRUE(has(e, c.why)) << e;
  }

  // Another model: each part of the fingerprint is named.
  CacheFingerprint other = file_fingerprint();
  other.tokenizer = "0000000000000001";
  EXPECT_TRUE(has(read_error(good, other), "the tokenizer differs"));
  other = file_fingerprint();
  other.weights = R"({"files":[]})";
  EXPECT_TRUE(has(read_error(good, other), "the weights differ"));
  other = file_fingerprint();
  other.device = "cuda";
  EXPECT_TRUE(has(read_error(good, other), "computed on cpu"));
  other = file_fingerprint(PromptFileKind::paged, 16);
  EXPECT_TRUE(has(read_error(good, other), "KV cache layout differs"));

  // A directory where a file should be: an IoError naming it.
  fs::create_directory(d / "dir.oskv");
  try {
    read_prompt_file(d / "dir.oskv", file_fingerprint(), file_layers());
    ADD_FAILURE() << "a directory was read";
  } catch (const IoError& e) {
    EXPECT_TRUE(has(e.what(), "dir.oskv")) << e.what();
    EXPECT_TRUE(has(e.what(), "directory")) << e.what();
  }
}

TEST(PromptFile, AFullDiskLeavesTheOldFileAndNoTemporaryFile) {
  TempDir d;
  const fs::path path = write_dense(d, 5);
  const std::string before = testing::read_file(path);
  // The disk fills after 100 bytes of the new file.
  size_t budget = 100;
  PromptFileWriteFn full = [&](int fd, const void* p, size_t n) -> ssize_t {
    if (budget == 0) {
      errno = ENOSPC;
      return -1;
    }
    const size_t m = std::min(n, budget);
    budget -= m;
    return ::write(fd, p, m);
  };
  SequenceCache c = filled_cache(9);
  try {
    write_prompt_file(path, dense_file_data(tokens_upto(9), c.snapshot(), "", file_layers()), file_fingerprint(),
                      file_layers(), 0, full);
    ADD_FAILURE() << "the write succeeded";
  } catch (const IoError& e) {
    EXPECT_TRUE(has(e.what(), path.string())) << e.what();
    EXPECT_TRUE(has(e.what(), std::strerror(ENOSPC))) << e.what();
  }
  EXPECT_EQ(testing::read_file(path), before);
  EXPECT_EQ(names_in(d.path()), std::vector<std::string>{"f.oskv"});
  // A write abandoned midway (the server stopping) is the same.
  EXPECT_THROW(write_prompt_file(path, dense_file_data(tokens_upto(9), c.snapshot(), "", file_layers()),
                                 file_fingerprint(), file_layers(), 0, {}, [] { return true; }),
               IoError);
  EXPECT_EQ(testing::read_file(path), before);
  EXPECT_EQ(names_in(d.path()), std::vector<std::string>{"f.oskv"});
}

TEST(PromptFile, TheModelFingerprintSeesTheWeightsAndTheTokenizer) {
  TempDir d;
  const fs::path m = d / "m";
  fs::create_directory(m);
  testing::write_tiny_llama(m, testing::tiny_llama_config(), 1);
  testing::write_file(m / "tokenizer.json", "{\"model\": 1}");
  const CacheFingerprint a = model_fingerprint(m, Device::cpu());
  EXPECT_EQ(a.mismatch(model_fingerprint(m, Device::cpu())), "");
  // Other weights of the same shapes: the header is the same, the sampled bytes are not.
  testing::write_tiny_llama(m, testing::tiny_llama_config(), 2);
  EXPECT_EQ(a.mismatch(model_fingerprint(m, Device::cpu())), "the weights differ");
  testing::write_tiny_llama(m, testing::tiny_llama_config(), 1);
  EXPECT_EQ(a.mismatch(model_fingerprint(m, Device::cpu())), "");
  testing::write_file(m / "tokenizer.json", "{\"model\": 2}");
  EXPECT_EQ(a.mismatch(model_fingerprint(m, Device::cpu())), "the tokenizer differs");
}

// A snapshot restored from a file is adopted as foreign: the first write after the restore (and
// a rewind to a shorter prefix) copies, so the entry the prompt cache keeps of it never changes
// while the cache decodes on in place. With the guard's rules dropped (the dense cache's test
// seam), the same steps do change it: the check can fail.
class UnguardedFileCache final : public DenseKVCache {
 public:
  using DenseKVCache::DenseKVCache;

 protected:
  bool owns_current_state() const override { return true; }
};

TEST(PromptFile, RestoredSnapshotsAreNeverWrittenInPlace) {
  TempDir d;
  const fs::path path = write_dense(d, 9);
  const PromptFileData data = read_prompt_file(path, file_fingerprint(), file_layers());
  for (bool guarded : {true, false}) {
    SCOPED_TRACE(guarded ? "guard on" : "guard off");
    PromptCache pc(1 << 20, /*keep_checksums=*/true);
    pc.store(data.tokens, dense_file_states(data, file_layers(), Device::cpu()));
    std::shared_ptr<const PromptCache::Entry> e = pc.find(data.tokens);
    ASSERT_TRUE(e);
    // The dense layer alone, as a slot's cache that restores the entry and rewinds to 6 rows.
    KVCacheParams p = file_layers()[0];
    p.step = 64;
    std::unique_ptr<DenseKVCache> c =
        guarded ? std::make_unique<DenseKVCache>(p) : std::make_unique<UnguardedFileCache>(p);
    c->restore(e->states[0]);
    c->trim(3);
    c->update_and_fetch(random_rows(1, p.n_kv_heads, p.head_dim, 1), random_rows(1, p.n_kv_heads, p.head_dim, 2));
    for (int i = 0; i < 20; ++i)
      c->update_and_fetch(random_rows(1, p.n_kv_heads, p.head_dim, 3 + i), random_rows(1, p.n_kv_heads, p.head_dim, 50 + i));
    if (guarded) {
      EXPECT_EQ(c->counters().n_copying_writes, 1u) << "the write after the restore";
      EXPECT_GT(c->counters().n_inplace_writes, 15u);
    }
    bool changed = false;
    for (const auto& s : pc.checksums()) changed |= s.at_store != s.now;
    EXPECT_EQ(changed, !guarded);
  }
}

}  // namespace osprey
