// The persistent prompt cache (--prompt-cache-dir) over HTTP: the seed's replay script run
// across a restart gives the replies of a server that never restarted, the first requests after
// it reuse what the first server cached, and the restored snapshots are never written by later
// in-place writes; unusable files are skipped with a warning naming each; a full disk costs
// nothing but the files; and llama.cpp's slot routes save, erase and restore.
#include <gtest/gtest.h>
#include <sys/types.h>

#include <cerrno>
#include <cstring>

#include "model/model.h"
#include "serve/prompt_file.h"
#include "server/harness.h"
#include "server/replay_script.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::Replayer;
using testing::ReplayReply;
using testing::TempDir;
using testing::TestServer;

// Groups [0, kRestartAt) run before the restart, the rest after it: turns after it continue
// conversations begun before (b2, a4, a2z), and new ones share their system prompt.
constexpr size_t kRestartAt = 4;

using testing::expect_same_replies;

// Runs the script's groups before kRestartAt on a server of `o` (whose prompt cache goes to
// o.prompt_cache_dir), then stops that server: what its writer was handed is on disk. The
// replayer goes on only once given the next server (Replayer::use).
Replayer replay_until_restart(const ServerOptions& o, bool check_snapshots) {
  TestServer first(o);
  Replayer r(first, check_snapshots);
  r.run(0, kRestartAt);
  return r;
}

// No names where the folder has not been made.
std::vector<std::string> auto_names(const fs::path& dir) {
  if (!fs::is_directory(dir / "auto")) return {};
  return testing::prompt_cache_files(dir);
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(PromptCacheRestart, DenseRepliesAcrossARestartEqualThoseWithoutOne) {
  ServerOptions o = testing::dense_replay_options();
  o.prompt_cache_mib = 3;
  const auto want = testing::ReplayRun(o, false).replies;  // never restarted

  TempDir dir;
  o.prompt_cache_dir = dir.path();
  Replayer r = replay_until_restart(o, true);
  EXPECT_FALSE(auto_names(dir.path()).empty());

  TestServer second(o);
  EXPECT_GT(second.metric("osprey:prompt_cache_disk_restored_files_total"), 0);
  EXPECT_EQ(second.metric("osprey:prompt_cache_disk_skipped_files_total"), 0);
  r.use(second);
  // Every snapshot the second server holds, restored ones included, is checked after each group
  // of requests, which restore them into slots and decode on in place.
  const auto got = r.run(kRestartAt);
  expect_same_replies(got, want);
  // The first request after the restart shares the system prompt with the restored entries, and
  // b2 continues b1 from before it.
  EXPECT_GT(got.at("c1").cached, 0);
  EXPECT_GT(got.at("b2").cached, int64_t(got.at("c1").cached));
  EXPECT_GT(r.n_checked_, 10u);
  EXPECT_GT(second.metric("osprey:prompt_cache_disk_writes_total"), 0);
  EXPECT_EQ(second.metric("osprey:prompt_cache_disk_write_failures_total"), 0);
}

TEST(PromptCacheRestart, PagedRepliesAcrossARestartEqualThoseWithoutOne) {
  ServerOptions o = testing::paged_replay_options();
  const auto want = testing::ReplayRun(o, false).replies;  // never restarted

  TempDir dir;
  o.prompt_cache_dir = dir.path();
  Replayer r = replay_until_restart(o, false);
  EXPECT_FALSE(auto_names(dir.path()).empty());

  TestServer second(o);
  EXPECT_GT(second.metric("osprey:prompt_cache_disk_restored_files_total"), 0);
  EXPECT_GT(second.metric("osprey:kv_pool_blocks_cached"), 0);
  r.use(second);
  const auto got = r.run(kRestartAt);
  expect_same_replies(got, want);
  EXPECT_GT(got.at("c1").cached, 0);
  EXPECT_EQ(got.at("c1").cached % 16, 0) << "whole blocks";
  EXPECT_EQ(second.metric("osprey:kv_pool_blocks_in_use"), 0);
}

// A folder holding what the first server wrote, plus one file of every unusable kind: the
// second server names each in a warning, skips it, restores the rest and serves.
TEST(PromptCacheRestart, UnusableFilesAreSkippedWithAWarningNamingEach) {
  TempDir dir;
  ServerOptions o = testing::demo_server_options();
  o.kv_layout = KVLayout::dense;
  o.batch_invariant = true;
  o.prompt_cache_dir = dir.path();
  std::string reply;
  {
    TestServer first(o);
    auto [st, r] = first.post_json("/v1/completions", {{"prompt", "Emma Woodhouse, handsome, clever"}, {"max_tokens", 4}, {"temperature", 0}});
    ASSERT_EQ(st, 200) << r.dump();
    reply = r["choices"][0]["text"];
  }
  const std::vector<std::string> good = auto_names(dir.path());
  ASSERT_EQ(good.size(), 1u);
  const fs::path auto_dir = dir / "auto";
  const std::string bytes = testing::read_file(auto_dir / good[0]);
  auto name = [](int i) { return "dense-00000000000000a" + std::to_string(i) + ".oskv"; };
  testing::write_file(auto_dir / name(1), bytes.substr(0, bytes.size() / 2));  // truncated
  std::string flipped = bytes;
  flipped[bytes.size() - 100] ^= 0x08;
  testing::write_file(auto_dir / name(2), flipped);  // a flipped byte
  std::string version = bytes;
  version[8] = 9;
  testing::write_file(auto_dir / name(3), version);  // another format version
  fs::create_directory(auto_dir / name(4));         // a directory
  {
    // Another model's file: the first server's, as if the tokenizer had changed.
    std::unique_ptr<Model> m = load_model(o.model_dir);
    const std::vector<KVCacheParams> layers = model_kv_layers(*m);
    CacheFingerprint fp = model_fingerprint(o.model_dir, Device::cpu());
    fp.kv = kv_layout_fingerprint(PromptFileKind::dense, layers, 0);
    PromptFileData d = read_prompt_file(auto_dir / good[0], fp, layers);
    fp.tokenizer = "ffffffffffffffff";
    write_prompt_file(auto_dir / name(5), d, fp, layers, 0);
  }

  ::testing::internal::CaptureStderr();
  std::optional<TestServer> second(std::in_place, o);
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::vector<std::pair<int, std::string>> why = {{1, "truncated"},
                                                        {2, "checksum does not match"},
                                                        {3, "format version 9"},
                                                        {4, "is a directory"},
                                                        {5, "the tokenizer differs"}};
  for (const auto& [i, reason] : why) {
    SCOPED_TRACE(name(i));
    EXPECT_TRUE(has(log, (auto_dir / name(i)).string() + ": ")) << log;
    EXPECT_TRUE(has(log, reason)) << log;
  }
  EXPECT_EQ(second->metric("osprey:prompt_cache_disk_skipped_files_total"), 5);
  EXPECT_EQ(second->metric("osprey:prompt_cache_disk_restored_files_total"), 1);
  auto [st, r] = second->post_json("/v1/completions", {{"prompt", "Emma Woodhouse, handsome, clever"}, {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["text"], reply);
  EXPECT_GT(r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0);
  second.reset();
  // Skipped files are left where they were (the size bound may remove them).
  for (int i = 1; i <= 5; ++i) EXPECT_TRUE(fs::exists(auto_dir / name(i))) << name(i);
}

TEST(PromptCacheRestart, AFullDiskCostsTheFilesAndNothingElse) {
  for (KVLayout layout : {KVLayout::dense, KVLayout::paged}) {
    SCOPED_TRACE(layout == KVLayout::dense ? "dense" : "paged");
    TempDir dir;
    ServerOptions o = testing::demo_server_options();
    o.kv_layout = layout;
    o.prompt_cache_dir = dir.path();
    o.prompt_cache_write = [](int, const void*, size_t) -> ssize_t {
      errno = ENOSPC;
      return -1;
    };
    ::testing::internal::CaptureStderr();
    std::string log;
    {
      TestServer s(o);
      for (int i = 0; i < 2; ++i) {
        auto [st, r] = s.post_json("/v1/completions", {{"prompt", std::string(200, 'a' + char(i))}, {"max_tokens", 4}});
        EXPECT_EQ(st, 200) << r.dump();
      }
      s.server().flush_prompt_cache_dir();
      EXPECT_GE(s.metric("osprey:prompt_cache_disk_write_failures_total"), 2);
      EXPECT_EQ(s.metric("osprey:prompt_cache_disk_files"), 0);
      // The in-memory cache still serves.
      auto [st, r] = s.post_json("/v1/completions", {{"prompt", std::string(200, 'a')}, {"max_tokens", 4}});
      EXPECT_EQ(st, 200);
      EXPECT_GT(r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0);
    }
    log = ::testing::internal::GetCapturedStderr();
    EXPECT_TRUE(has(log, (dir / "auto").string() + "/" + (layout == KVLayout::dense ? "dense-" : "paged-"))) << log;
    EXPECT_TRUE(has(log, std::strerror(ENOSPC))) << log;
    EXPECT_TRUE(auto_names(dir.path()).empty());
    for (const auto& e : fs::directory_iterator(dir / "auto")) EXPECT_EQ(e.path().filename(), ".lock");
  }
}

// llama.cpp's routes: a slot's cached prompt saved to a named file, erased (from memory and from
// the folder), and restored by a new server, whose next request reuses it.
TEST(SlotRoutes, SaveEraseAndRestoreInBothLayouts) {
  const std::string prompt =
      "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want "
      "of a wife. However little known the feelings or views of such a man may be on his first entering a "
      "neighbourhood, this truth is so well fixed in the minds of the surrounding families.";
  for (KVLayout layout : {KVLayout::dense, KVLayout::paged}) {
    SCOPED_TRACE(layout == KVLayout::dense ? "dense" : "paged");
    TempDir dir;
    ServerOptions o = testing::demo_server_options();
    o.kv_layout = layout;
    o.n_slots = 1;
    o.batch_invariant = true;  // the reply after the restore is the first one, bit for bit
    o.prompt_cache_dir = dir.path();
    json first_reply;
    int64_t n_saved = 0;
    {
      TestServer a(o);
      auto [st, r] = a.post_json("/v1/completions", {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}});
      ASSERT_EQ(st, 200) << r.dump();
      first_reply = r["choices"][0]["text"];
      auto [s1, saved] = a.post_json("/slots/0?action=save", {{"filename", "conv.oskv"}});
      ASSERT_EQ(s1, 200) << saved.dump();
      EXPECT_EQ(saved["id_slot"], 0);
      EXPECT_EQ(saved["filename"], "conv.oskv");
      n_saved = saved["n_saved"];
      EXPECT_GT(n_saved, 16);
      EXPECT_EQ(saved["n_written"].get<uint64_t>(), fs::file_size(dir / "conv.oskv"));
      EXPECT_TRUE(saved["timings"].contains("save_ms"));
      a.server().flush_prompt_cache_dir();
      auto [s2, erased] = a.post_json("/slots/0?action=erase", json::object());
      ASSERT_EQ(s2, 200) << erased.dump();
      EXPECT_EQ(erased["id_slot"], 0);
      EXPECT_GT(erased["n_erased"].get<int64_t>(), 0);
      // Refusals.
      for (const std::string bad : {"../x.oskv", "a/b", ".hidden", ""}) {
        auto [s3, e] = a.post_json("/slots/0?action=save", {{"filename", bad}});
        EXPECT_EQ(s3, 400) << bad << " " << e.dump();
      }
      EXPECT_EQ(a.post_json("/slots/0?action=restore", {{"filename", "missing.oskv"}}).first, 404);
      EXPECT_EQ(a.post_json("/slots/1?action=save", {{"filename", "x"}}).first, 400);
      EXPECT_EQ(a.post_json("/slots/zero?action=save", {{"filename", "x"}}).first, 400);
      EXPECT_EQ(a.post_json("/slots/0?action=fly", {{"filename", "x"}}).first, 400);
      EXPECT_EQ(a.post_json("/slots/0?action=save", {{"name", "x"}}).first, 400);
      testing::write_file(dir / "junk.oskv", "not a cache file");
      auto [s4, junk] = a.post_json("/slots/0?action=restore", {{"filename", "junk.oskv"}});
      EXPECT_EQ(s4, 400);
      EXPECT_TRUE(has(junk.dump(), "junk.oskv")) << junk.dump();
    }
    // The erase took the automatic file too: nothing comes back by itself.
    TestServer b(o);
    EXPECT_EQ(b.metric("osprey:prompt_cache_disk_restored_files_total"), 0);
    auto [s5, restored] = b.post_json("/slots/0?action=restore", {{"filename", "conv.oskv"}});
    ASSERT_EQ(s5, 200) << restored.dump();
    EXPECT_EQ(restored["n_restored"], n_saved);
    EXPECT_EQ(restored["n_read"].get<uint64_t>(), fs::file_size(dir / "conv.oskv"));
    EXPECT_TRUE(restored["timings"].contains("restore_ms"));
    auto [st, r] = b.post_json("/v1/completions", {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}});
    ASSERT_EQ(st, 200) << r.dump();
    EXPECT_EQ(r["choices"][0]["text"], first_reply);
    EXPECT_GT(r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0);
  }
}

TEST(SlotRoutes, AServerWithoutAFolderAnswers501) {
  TestServer s;
  auto [st, r] = s.post_json("/slots/0?action=save", {{"filename", "x.oskv"}});
  EXPECT_EQ(st, 501) << r.dump();
  EXPECT_TRUE(has(r.dump(), "--prompt-cache-dir")) << r.dump();
}

}  // namespace osprey
