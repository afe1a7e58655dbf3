// osprey generate's prompt, context and stop flags and its banner, run on the demo model with
// greedy decoding (the default temperature, 0), so that two runs of one prompt agree.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "support/test_util.h"

namespace osprey {
namespace {

using nlohmann::json;
using testing::CommandResult;
using testing::run_osprey;

const std::string kPrompt = "It is a truth universally acknowledged";

std::string demo() { return (testing::source_dir() / "models/demo").string(); }

std::string gen(const std::string& flags) { return "generate -m " + demo() + " --device cpu " + flags; }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// run_osprey, with `input` on stdin.
CommandResult run_with_stdin(const std::string& args, const std::string& input) {
  testing::TempDir d;
  testing::write_file(d / "stdin", input);
  const std::string cmd = std::string(OSPREY_BINARY) + " " + args + " <" + (d / "stdin").string() + " >" +
                          (d / "out").string() + " 2>" + (d / "err").string();
  const int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = testing::read_file(d / "out");
  r.err = testing::read_file(d / "err");
  return r;
}

TEST(CliGenerate, StopEndsTheOutputBeforeTheStopText) {
  const auto first = run_osprey(gen("-q -n 40 --ignore-eos -p '" + kPrompt + "'"));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_GT(first.out.size(), 20u) << first.out;
  // A stop text the greedy reply is seen to contain: 5 characters from its middle (which may
  // begin inside a token), cut at its first occurrence.
  const std::string text = first.out.substr(0, first.out.size() - 1);  // less the final newline
  const std::string stop = text.substr(text.size() / 2, 5);
  ASSERT_EQ(stop.find_first_of("'\n"), std::string::npos) << stop;
  const size_t at = text.find(stop);

  const auto second = run_osprey(gen("-q -n 40 --ignore-eos -p '" + kPrompt + "' --stop '" + stop + "'"));
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(second.out, text.substr(0, at) + "\n");

  const auto j = run_osprey(gen("-q -n 40 --ignore-eos --json -p '" + kPrompt + "' --stop '" + stop + "'"));
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const json r = json::parse(j.out);
  EXPECT_EQ(r["text"], text.substr(0, at));
  EXPECT_EQ(r["stop_reason"], "stop");
  EXPECT_LT(r["tokens"].size(), 40u);
}

TEST(CliGenerate, EitherOfTwoStopTextsEndsTheOutput) {
  const auto first = run_osprey(gen("-q -n 40 --ignore-eos -p '" + kPrompt + "'"));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const std::string text = first.out.substr(0, first.out.size() - 1);
  const std::string stop = text.substr(text.size() / 3, 4);
  ASSERT_EQ(stop.find_first_of("'\n"), std::string::npos) << stop;
  const auto r = run_osprey(gen("-q -n 40 --ignore-eos -p '" + kPrompt + "' --stop 'never in the text' --stop '" +
                                stop + "'"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, text.substr(0, text.find(stop)) + "\n");
}

TEST(CliGenerate, EmptyStopTextIsAUsageError) {
  const auto r = run_osprey(gen("-p hello --stop ''"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "--stop")) << r.err;
}

TEST(CliGenerate, PromptFromAFileGeneratesAsTheSameTextGivenWithP) {
  const auto with_p = run_osprey(gen("-q -n 16 -p '" + kPrompt + "'"));
  ASSERT_EQ(with_p.exit_code, 0) << with_p.err;
  testing::TempDir d;
  testing::write_file(d / "prompt.txt", kPrompt);
  const auto with_f = run_osprey(gen("-q -n 16 -f " + (d / "prompt.txt").string()));
  ASSERT_EQ(with_f.exit_code, 0) << with_f.err;
  EXPECT_EQ(with_f.out, with_p.out);
  // Stdin, with the final newline an editor or echo adds (dropped).
  const auto with_stdin = run_with_stdin(gen("-q -n 16 -f -"), kPrompt + "\n");
  ASSERT_EQ(with_stdin.exit_code, 0) << with_stdin.err;
  EXPECT_EQ(with_stdin.out, with_p.out);
}

TEST(CliGenerate, PromptFileAndPromptTextExcludeEachOther) {
  testing::TempDir d;
  testing::write_file(d / "prompt.txt", kPrompt);
  const auto r = run_osprey(gen("-p hello -f " + (d / "prompt.txt").string()));
  EXPECT_EQ(r.exit_code, 2) << r.err;
}

TEST(CliGenerate, MissingPromptFileIsNamed) {
  const auto r = run_osprey(gen("-f /nonexistent/prompt.txt"));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "/nonexistent/prompt.txt")) << r.err;
}

TEST(CliGenerate, ContextBeyondTheModelsIsAUsageErrorNamingC) {
  const json config = json::parse(testing::read_file(testing::source_dir() / "models/demo/config.json"));
  const int64_t max_ctx = config["max_position_embeddings"];
  const auto r = run_osprey(gen("-p hello -c " + std::to_string(max_ctx + 1)));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "-c")) << r.err;
  EXPECT_TRUE(contains(r.err, std::to_string(max_ctx))) << r.err;
}

TEST(CliGenerate, ContextBoundsPromptAndReplyTogether) {
  const auto r = run_osprey(gen("-q -n 100 -c 12 --ignore-eos --json -p '" + kPrompt + "'"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_LT(j["prompt_tokens"].size(), 12u);
  EXPECT_EQ(j["prompt_tokens"].size() + j["tokens"].size(), 12u);
  EXPECT_EQ(j["stop_reason"], "length");
}

TEST(CliGenerate, PromptLongerThanTheContextIsNamed) {
  const auto r = run_osprey(gen("-c 3 -p '" + kPrompt + "'"));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "exceeds the context of 3 tokens (-c)")) << r.err;
}

TEST(CliGenerate, BannerOnStderrNamesTheModelTheCpuAndTheContext) {
  const json config = json::parse(testing::read_file(testing::source_dir() / "models/demo/config.json"));
  const auto r = run_osprey(gen("-n 2 --json -p hello"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string banner = r.err.substr(0, r.err.find('\n'));
  EXPECT_TRUE(contains(banner, "demo")) << banner;
  EXPECT_TRUE(contains(banner, "CPU")) << banner;
  EXPECT_TRUE(contains(banner, "threads")) << banner;
  EXPECT_TRUE(contains(banner, "context " + std::to_string(int64_t(config["max_position_embeddings"])))) << banner;
  // stdout holds the JSON object alone.
  json parsed;
  EXPECT_NO_THROW(parsed = json::parse(r.out)) << r.out;
  EXPECT_FALSE(contains(r.out, "demo")) << r.out;
}

TEST(CliGenerate, QuietLeavesStderrEmpty) {
  const auto r = run_osprey(gen("-q -n 2 -p hello"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_FALSE(r.out.empty());
}

TEST(CliGenerate, SystemMessageGoesThroughTheChatTemplate) {
  // The demo template: BOS, then "role: content" and a blank line per message, then "assistant:".
  const auto tokens = run_osprey("tokenize -m " + demo() +
                                 " '<|begin_of_text|>system: Be brief.\n\nuser: Hello\n\nassistant:'");
  ASSERT_EQ(tokens.exit_code, 0) << tokens.err;
  const auto r = run_osprey(gen("-q -n 1 --json --chat --system 'Be brief.' -p Hello"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["prompt_tokens"], json::parse(tokens.out));
}

TEST(CliGenerate, SystemMessageWithoutChatIsAUsageError) {
  const auto r = run_osprey(gen("--system 'Be brief.' -p Hello"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "--chat")) << r.err;
}

}  // namespace
}  // namespace osprey
