// The prompt-cache folder (serve/prompt_store.h): background writes, the byte-bounded queue,
// least-recently-used eviction under --prompt-cache-max-gib, paged runs removed with the run they
// continue, unusable files and folders skipped with a warning naming them, a full disk counted.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "core/error.h"
#include "serve/prompt_store.h"
#include "support/kv_params.h"
#include "support/test_util.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

std::vector<KVCacheParams> store_layers() {
  const KVCacheParams a = testing::kv_params(2, 8);
  return {a, a};
}

PromptStoreOptions store_options(const fs::path& dir, PromptFileKind kind = PromptFileKind::dense) {
  PromptStoreOptions o;
  o.dir = dir;
  o.kind = kind;
  o.layers = store_layers();
  o.block_size = kind == PromptFileKind::paged ? 4 : 0;
  o.fingerprint.weights = R"({"files":[]})";
  o.fingerprint.tokenizer = "none";
  o.fingerprint.device = "cpu";
  o.fingerprint.kv = kv_layout_fingerprint(kind, o.layers, o.block_size);
  return o;
}

// Rows [first_row, n) of tokens base, base + 1, ... (values: the token ids).
PromptFileData store_data(int64_t n, int32_t base, PromptFileKind kind = PromptFileKind::dense, int64_t first_row = 0) {
  PromptFileData d;
  d.kind = kind;
  d.first_row = first_row;
  for (int64_t i = 0; i < n; ++i) d.tokens.push_back(base + int32_t(i));
  for (const KVCacheParams& p : store_layers())
    d.layers.emplace_back(Array::zeros({p.n_kv_heads, n - first_row, p.head_dim}, p.dtype),
                          Array::zeros({p.n_kv_heads, n - first_row, p.head_dim}, p.dtype));
  return d;
}

uint64_t id_of(const PromptFileData& d) { return prompt_prefix_id(d.salt, d.tokens); }

std::vector<std::string> auto_files(const fs::path& dir) { return testing::prompt_cache_files(dir); }

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(PromptStore, WritesInTheBackgroundAndListsTheFilesMostRecentFirst) {
  TempDir d;
  PromptStore s(store_options(d.path()));
  ASSERT_TRUE(s.enabled());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(s.write(store_data(10 + i, 100 * i)));
    s.flush();  // one after another: distinct mtimes
  }
  const std::vector<PromptFileInfo> files = s.usable_files();
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0].n_tokens, 12);
  EXPECT_EQ(files[2].n_tokens, 10);
  EXPECT_EQ(files[0].path.filename().string(), s.auto_name(id_of(store_data(12, 200))));
  const std::optional<PromptFileData> back = s.read(files[1].path);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->tokens, store_data(11, 100).tokens);
  PromptStoreStats st = s.stats();
  EXPECT_EQ(st.n_written, 3u);
  EXPECT_EQ(st.n_files, 3u);
  EXPECT_EQ(st.n_write_failures, 0u);
  // An entry a longer one replaced: its file goes.
  s.remove(id_of(store_data(10, 0)));
  s.flush();
  EXPECT_EQ(auto_files(d.path()).size(), 2u);
  // A new store on the folder finds the two (and the folder's lock was released).
  s.close(std::chrono::seconds(5));
  PromptStore again(store_options(d.path()));
  EXPECT_TRUE(again.enabled());
  EXPECT_EQ(again.usable_files().size(), 2u);
  EXPECT_EQ(again.stats().n_files, 2u);
}

TEST(PromptStore, TheSizeBoundRemovesTheLeastRecentlyUsedFiles) {
  TempDir d;
  PromptStoreOptions o = store_options(d.path());
  // Each file: 16 tokens, 2 layers x 2 x [2, 16, 8] f16 rows = 2 KiB of rows, plus its header.
  o.max_bytes = 7000;
  PromptStore s(o);
  const PromptFileData a = store_data(16, 0), b = store_data(16, 100), c = store_data(16, 200), e = store_data(16, 300);
  for (const PromptFileData* x : {&a, &b, &c}) {
    s.write(*x);
    s.flush();
  }
  // Three do not fit: the oldest went.
  std::vector<std::string> want{s.auto_name(id_of(b)), s.auto_name(id_of(c))};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(auto_files(d.path()), want);
  // A hit on b makes c the least recently used.
  s.touch(id_of(b));
  s.write(e);
  s.flush();
  want = {s.auto_name(id_of(b)), s.auto_name(id_of(e))};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(auto_files(d.path()), want);
  EXPECT_EQ(s.stats().n_evicted, 2u);
  EXPECT_LE(s.stats().bytes, 7000u);
  // A file larger than the whole bound is not written at all.
  EXPECT_FALSE(s.write(store_data(200, 1000)));
  EXPECT_EQ(s.stats().n_dropped, 1u);
}

TEST(PromptStore, APagedRunGoesWithTheRunItContinues) {
  TempDir d;
  PromptStore s(store_options(d.path(), PromptFileKind::paged));
  const PromptFileData root = store_data(8, 0, PromptFileKind::paged, 0);
  const PromptFileData child = store_data(16, 0, PromptFileKind::paged, 8);
  const PromptFileData other = store_data(8, 500, PromptFileKind::paged, 0);
  for (const PromptFileData* x : {&root, &child, &other}) s.write(*x);
  s.flush();
  EXPECT_EQ(auto_files(d.path()).size(), 3u);
  s.remove(id_of(root));
  s.flush();
  EXPECT_EQ(auto_files(d.path()), std::vector<std::string>{s.auto_name(id_of(other))});
}

TEST(PromptStore, UnusableFilesAreSkippedWithAWarningNamingEach) {
  TempDir d;
  {
    PromptStore s(store_options(d.path()));
    s.write(store_data(8, 0));
    s.write(store_data(8, 50));
  }
  std::vector<std::string> good = auto_files(d.path());
  ASSERT_EQ(good.size(), 2u);
  const fs::path a = d / "auto" / good[0];
  const std::string bytes = testing::read_file(a);
  // Damaged copies under names the store reads.
  auto name = [](int i) { return "dense-000000000000000" + std::to_string(i) + ".oskv"; };
  testing::write_file(d / "auto" / name(1), bytes.substr(0, bytes.size() - 9));  // truncated
  std::string flipped = bytes;
  flipped[bytes.size() - 3] ^= 0x40;
  testing::write_file(d / "auto" / name(2), flipped);
  std::string version = bytes;
  version[8] = 7;
  testing::write_file(d / "auto" / name(3), version);
  fs::create_directory(d / "auto" / name(4));
  // Another model's file: a good file written under another fingerprint.
  PromptStoreOptions other = store_options(d.path());
  other.fingerprint.tokenizer = "0123456789abcdef";
  write_prompt_file(d / "auto" / name(5), store_data(8, 0), other.fingerprint, other.layers, 0);
  // Not ours: ignored without a word.
  testing::write_file(d / "auto" / "notes.txt", "hello");

  ::testing::internal::CaptureStderr();
  PromptStore s(store_options(d.path()));
  const std::vector<PromptFileInfo> files = s.usable_files();
  std::string log = ::testing::internal::GetCapturedStderr();
  // The two good files, and the one whose flipped byte is in the payload: its header reads.
  ASSERT_EQ(files.size(), 3u);
  const std::vector<std::pair<int, std::string>> why = {
      {1, "truncated"}, {3, "format version 7"}, {4, "directory"}, {5, "the tokenizer differs"}};
  for (const auto& [i, reason] : why) {
    SCOPED_TRACE(name(i));
    EXPECT_TRUE(has(log, (d / "auto" / name(i)).string())) << log;
    EXPECT_TRUE(has(log, reason)) << log;
  }
  EXPECT_EQ(s.stats().n_skipped, 4u);
  // Reading it whole finds the damage.
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(s.read(d / "auto" / name(2)));
  const std::string log2 = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(has(log2, (d / "auto" / name(2)).string())) << log2;
  EXPECT_TRUE(has(log2, "payload's checksum")) << log2;
  EXPECT_EQ(s.stats().n_skipped, 5u);
  EXPECT_FALSE(has(log, "notes.txt"));
}

TEST(PromptStore, AFolderThatCannotBeUsedLeavesTheStoreOff) {
  TempDir d;
  // auto/ is a file: nothing can be created in it (root ignores permission bits, not this).
  testing::write_file(d / "auto", "not a folder");
  ::testing::internal::CaptureStderr();
  PromptStore s(store_options(d.path()));
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(s.enabled());
  EXPECT_TRUE(has(log, (d / "auto").string())) << log;
  EXPECT_FALSE(s.write(store_data(8, 0)));
  EXPECT_TRUE(s.usable_files().empty());
  EXPECT_THROW(s.save("x", store_data(8, 0)), Unsupported);

  // A second store on a folder in use.
  TempDir e;
  PromptStore first(store_options(e.path()));
  ::testing::internal::CaptureStderr();
  PromptStore second(store_options(e.path()));
  log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(first.enabled());
  EXPECT_FALSE(second.enabled());
  EXPECT_TRUE(has(log, "another process")) << log;
}

TEST(PromptStore, AFullDiskIsAWarningNamingTheFileAndACount) {
  TempDir d;
  PromptStoreOptions o = store_options(d.path());
  o.write = [](int, const void*, size_t) -> ssize_t {
    errno = ENOSPC;
    return -1;
  };
  PromptStore s(o);
  const PromptFileData x = store_data(8, 0);
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(s.write(x));
  s.flush();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(has(log, s.auto_name(id_of(x)))) << log;
  EXPECT_TRUE(has(log, std::strerror(ENOSPC))) << log;
  EXPECT_EQ(s.stats().n_write_failures, 1u);
  EXPECT_EQ(s.stats().n_files, 0u);
  EXPECT_TRUE(auto_files(d.path()).empty());
  for (const auto& e : fs::directory_iterator(d / "auto")) EXPECT_EQ(e.path().filename(), ".lock") << "no temporary file";
}

TEST(PromptStore, TheQueueIsBoundedInBytesAndNeverWaitsForTheDisk) {
  TempDir d;
  PromptStoreOptions o = store_options(d.path());
  const uint64_t one = 8 * 4 + 2 * 2 * 2 * 8 * 8 * 2;  // an 8-token file's tokens and rows
  o.queue_bytes = 3 * one;
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  o.write = [&](int fd, const void* p, size_t n) -> ssize_t {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return open; });
    return ::write(fd, p, n);
  };
  PromptStore s(o);
  // The writer takes the first and blocks on the disk; its rows count until it is written. Two
  // more fill the queue; the fourth is dropped at once.
  EXPECT_TRUE(s.write(store_data(8, 0)));
  EXPECT_TRUE(s.write(store_data(8, 10)));
  EXPECT_TRUE(s.write(store_data(8, 20)));
  EXPECT_FALSE(s.write(store_data(8, 30)));
  EXPECT_EQ(s.stats().n_dropped, 1u);
  {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
  }
  cv.notify_all();
  s.flush();
  EXPECT_GE(s.stats().n_written, 3u);
}

TEST(PromptStore, SlotFileNamesArePlainNamesInTheFolder) {
  TempDir d;
  PromptStore s(store_options(d.path()));
  EXPECT_EQ(s.user_path("conv.bin"), d / "conv.bin");
  for (const std::string& bad : std::vector<std::string>{"", ".", "..", "../x", "a/b", "/etc/passwd", ".hidden",
                                                         "a\\b", "x\ny", std::string(256, 'a')})
    EXPECT_THROW(s.user_path(bad), InvalidInput) << bad;
  const PromptFileData x = store_data(8, 0);
  const uint64_t n = s.save("conv.bin", x);
  EXPECT_EQ(n, fs::file_size(d / "conv.bin"));
  EXPECT_EQ(s.load("conv.bin").tokens, x.tokens);
  // The slot routes' files are not the automatic ones.
  EXPECT_TRUE(s.usable_files().empty());
}

}  // namespace osprey
