// osprey generate --prompt-cache FILE (llama-cli's flag) on the demo model, greedy: a second run
// restores the prompt from the file the first wrote and replies the same; a longer prompt reuses
// the common prefix; a file it cannot use is skipped with a warning naming it, and the run goes
// on as without it.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "support/test_util.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::run_osprey;

const std::string kCachedPrompt =
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a "
    "wife.";

std::string cache_gen(const std::string& model, const std::string& prompt, const std::string& flags) {
  return "generate -m " + model + " --device cpu -q --json -n 12 --ignore-eos -p '" + prompt + "' " + flags;
}

std::string demo_dir() { return (testing::source_dir() / "models/demo").string(); }

json run_json(const std::string& args, std::string* err = nullptr) {
  const testing::CommandResult r = run_osprey(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (err) *err = r.err;
  return r.exit_code == 0 ? json::parse(r.out) : json::object();
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(CliGeneratePromptCache, ASecondRunRestoresThePromptAndRepliesTheSame) {
  testing::TempDir d;
  const std::string file = (d / "session.oskv").string();
  const json plain = run_json(cache_gen(demo_dir(), kCachedPrompt, ""));
  const json first = run_json(cache_gen(demo_dir(), kCachedPrompt, "--prompt-cache " + file));
  ASSERT_TRUE(fs::exists(file));
  EXPECT_EQ(first["cached_tokens"], 0);
  EXPECT_EQ(first["tokens"], plain["tokens"]);

  const json second = run_json(cache_gen(demo_dir(), kCachedPrompt, "--prompt-cache " + file));
  const size_t n_prompt = second["prompt_tokens"].size();
  EXPECT_EQ(second["cached_tokens"], n_prompt - 1) << "all but the last prompt token";
  EXPECT_EQ(second["timings"]["cache_n"], n_prompt - 1);
  EXPECT_EQ(second["timings"]["prompt_n"], 1);
  EXPECT_EQ(second["timings"]["cache_read_bytes"].get<uint64_t>(), fs::file_size(file));
  EXPECT_EQ(second["tokens"], first["tokens"]);
  EXPECT_EQ(second["text"], first["text"]);

  // A longer prompt: the common prefix comes from the file, the rest is computed.
  const std::string longer = kCachedPrompt + " However little known the feelings";
  const json alone = run_json(cache_gen(demo_dir(), longer, ""));
  const json third = run_json(cache_gen(demo_dir(), longer, "--prompt-cache " + file));
  EXPECT_GE(third["cached_tokens"].get<int64_t>(), int64_t(n_prompt) - 2);
  EXPECT_LT(third["cached_tokens"].get<size_t>(), third["prompt_tokens"].size());
  EXPECT_EQ(third["tokens"], alone["tokens"]);
}

TEST(CliGeneratePromptCache, AFileItCannotUseIsSkippedWithAWarningNamingIt) {
  testing::TempDir d;
  const std::string file = (d / "session.oskv").string();
  const json first = run_json(cache_gen(demo_dir(), kCachedPrompt, "--prompt-cache " + file));
  std::string bytes = testing::read_file(file);

  // A flipped byte.
  bytes[bytes.size() - 50] ^= 0x20;
  testing::write_file(file, bytes);
  std::string err;
  json r = run_json(cache_gen(demo_dir(), kCachedPrompt, "--prompt-cache " + file), &err);
  EXPECT_TRUE(has(err, file)) << err;
  EXPECT_TRUE(has(err, "checksum")) << err;
  EXPECT_EQ(r["cached_tokens"], 0);
  EXPECT_EQ(r["tokens"], first["tokens"]);
  // The run wrote a good file over it.
  r = run_json(cache_gen(demo_dir(), kCachedPrompt, "--prompt-cache " + file));
  EXPECT_GT(r["cached_tokens"].get<int64_t>(), 0);

  // Truncated.
  bytes = testing::read_file(file);
  testing::write_file(file, bytes.substr(0, bytes.size() / 3));
  r = run_json(cache_gen(demo_dir(), kCachedPrompt, "--prompt-cache " + file), &err);
  EXPECT_TRUE(has(err, "truncated")) << err;
  EXPECT_EQ(r["cached_tokens"], 0);

  // Another model's file: the fixture Llama writes it, the demo model skips it.
  const std::string other = (testing::source_dir() / "tests/fixtures/models/llama").string();
  const std::string other_file = (d / "other.oskv").string();
  run_json("generate -m " + other + " --device cpu -q --json -n 2 --token-ids 1,5,9,13 --prompt-cache " + other_file);
  ASSERT_TRUE(fs::exists(other_file));
  r = run_json(cache_gen(demo_dir(), kCachedPrompt, "--prompt-cache " + other_file), &err);
  EXPECT_TRUE(has(err, other_file)) << err;
  EXPECT_TRUE(has(err, "another model")) << err;
  EXPECT_EQ(r["cached_tokens"], 0);

  // A directory where the file should be: skipped, and not saved (a warning, exit 0).
  fs::create_directory(d / "dir.oskv");
  r = run_json(cache_gen(demo_dir(), kCachedPrompt, "--prompt-cache " + (d / "dir.oskv").string()), &err);
  EXPECT_TRUE(has(err, "dir.oskv")) << err;
  EXPECT_TRUE(has(err, "not saved")) << err;
  EXPECT_EQ(r["tokens"], first["tokens"]);
}

}  // namespace osprey
