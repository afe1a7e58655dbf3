#include "server/completion_request.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "sample/sampler_fields.h"
#include "server/api_error.h"
#include "tokenizer/tokenizer.h"

namespace osprey {
namespace {

using nlohmann::json;

std::string type_name(const json& v) {
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  return std::string("a") + (v.is_object() || v.is_array() ? "n " : " ") + v.type_name();
}

const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string range(double min, double max) {
  auto fmt = [](double x) {
    std::string s = std::to_string(x);
    s.erase(s.find_last_not_of('0') + 1);
    if (s.back() == '.') s.pop_back();
    return s;
  };
  return "[" + fmt(min) + ", " + fmt(max) + "]";
}

std::vector<int32_t> token_ids(const json& a, const char* param, int64_t vocab_size) {
  std::vector<int32_t> ids;
  ids.reserve(a.size());
  for (const json& t : a) {
    if (!t.is_number_integer())
      throw bad_request(std::string("'") + param + "': a token id must be an integer, not " + type_name(t), param);
    const int64_t id = t.is_number_unsigned() ? int64_t(std::min<uint64_t>(t.get<uint64_t>(), uint64_t(INT64_MAX)))
                                              : t.get<int64_t>();
    if (id < 0 || id >= vocab_size)
      throw bad_request(std::string("'") + param + "': token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                            std::to_string(vocab_size) + ")",
                        param);
    ids.push_back(int32_t(id));
  }
  return ids;
}

std::vector<int32_t> encode(const std::string& text, const Tokenizer& tokenizer) {
  try {
    return tokenizer.encode(text, /*add_special=*/true, /*parse_special=*/true);
  } catch (const InvalidInput& e) {
    throw bad_request(std::string("'prompt': ") + e.what(), "prompt");
  }
}

// Fields of OpenAI's API (and of other servers') that this server does not implement: a
// request that sets them is refused by name rather than answered as if they were honoured.
void refuse_unsupported(const json& body, bool chat) {
  auto set = [&](const char* name) { return field(body, name) != nullptr; };
  auto refuse = [](const char* name, const std::string& why) {
    throw bad_request(std::string("'") + name + "' is not supported: " + why, name);
  };
  if (auto b = field(body, "best_of"); b && !(b->is_number_integer() && b->get<int64_t>() == 1))
    refuse("best_of", "one candidate is generated per choice");
  if (auto s = field(body, "suffix"); s && !(s->is_string() && s->get<std::string>().empty()))
    refuse("suffix", "no insertion (fill-in-the-middle) mode");
  if (set("functions")) refuse("functions", "use 'tools'");
  if (set("function_call")) refuse("function_call", "use 'tool_choice'");
  if (set("audio")) refuse("audio", "the model takes and writes text only");
  if (auto m = field(body, "modalities"); m && *m != json::array({"text"}))
    refuse("modalities", "the model writes text only");
  if (set("prediction")) refuse("prediction", "no predicted outputs");
  if (set("web_search_options")) refuse("web_search_options", "no web search");
  if (set("reasoning_effort"))
    refuse("reasoning_effort", "use chat_template_kwargs.enable_thinking for models that take it");
  if (!chat)
    for (const char* name : {"tools", "tool_choice", "parallel_tool_calls"})
      if (set(name)) refuse(name, "tools are a chat completions field");
  // Other servers' sampling fields: accepted at the value that changes nothing, refused by name
  // otherwise (the chain is sample/sampler.h's).
  auto off_unless = [&](const char* name, double off, const char* why) {
    const json* v = field(body, name);
    if (v && !(v->is_number() && v->get<double>() == off)) refuse(name, why);
  };
  off_unless("mirostat", 0, "Mirostat sampling is not implemented (0 is accepted)");
  off_unless("tfs_z", 1, "tail-free sampling is not implemented (1 is accepted)");
  off_unless("dynatemp_range", 0, "dynamic temperature is not implemented (0 is accepted)");
  off_unless("xtc_probability", 0, "XTC sampling is not implemented (0 is accepted)");
  off_unless("dry_multiplier", 0, "DRY sampling is not implemented (0 is accepted)");
  off_unless("top_n_sigma", -1, "top-n-sigma sampling is not implemented (-1 is accepted)");
  off_unless("min_tokens", 0, "no minimum reply length (0 is accepted)");
  off_unless("length_penalty", 1, "no beam search (1 is accepted)");
  off_unless("n_probs", 0, "use 'logprobs' (0 is accepted)");
  if (auto v = field(body, "min_keep"); v && !(v->is_number() && v->get<double>() <= 1))
    refuse("min_keep", "every cut keeps at least its best token, no more (0 and 1 are accepted)");
  if (auto v = field(body, "penalize_nl"); v && !(v->is_boolean() && !v->get<bool>()))
    refuse("penalize_nl", "newlines are penalised as any other token (false is accepted)");
  if (auto b = field(body, "use_beam_search"); b && !(b->is_boolean() && !b->get<bool>()))
    refuse("use_beam_search", "no beam search");
  if (set("samplers") || set("sampler_seq"))
    refuse(set("samplers") ? "samplers" : "sampler_seq",
           "the sampler order is fixed: penalties, temperature, top-k, top-p, min-p, typical-p (docs/server.md)");
  for (const char* name : {"bad_words", "stop_token_ids"})
    if (auto v = field(body, name); v && !(v->is_array() && v->empty())) refuse(name, "not implemented (use 'stop' or 'logit_bias')");
  // llama.cpp's per-request speculative settings: here they are server-wide.
  for (const char* name : {"speculative.n_max", "speculative.n_min", "speculative.p_min"})
    if (set(name))
      refuse(name, "speculative decoding is set for the whole server (--draft-max, --draft-min, --draft-p-min)");
}

// tools, tool_choice, parallel_tool_calls.
void read_tools(const json& body, CompletionRequest& r) {
  if (const json* tools = field(body, "tools")) {
    if (!tools->is_array()) throw bad_request("'tools' must be an array, not " + type_name(*tools), "tools");
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string at = "'tools[" + std::to_string(i) + "]'";
      if (!t.is_object() || t.value("type", json()) != "function")
        throw bad_request(at + " must be {\"type\": \"function\", \"function\": {...}}", "tools");
      const json* f = field(t, "function");
      if (!f || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string() ||
          (*f)["name"].get<std::string>().empty())
        throw bad_request(at + ".function must be an object with a non-empty string 'name'", "tools");
      if (const json* p = field(*f, "parameters"); p && !p->is_object())
        throw bad_request(at + ".function.parameters must be a JSON Schema object", "tools");
      r.tool_names.push_back((*f)["name"].get<std::string>());
      const json* p = field(*f, "parameters");
      r.tool_choice.schemas.push_back(p ? *p : json());
    }
  }
  std::string choice = "auto";
  if (const json* tc = field(body, "tool_choice")) {
    if (tc->is_string()) {
      choice = tc->get<std::string>();
      if (choice != "none" && choice != "auto" && choice != "required")
        throw bad_request("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                          "\"function\": {\"name\"}}",
                          "tool_choice");
    } else if (tc->is_object()) {
      const json* f = field(*tc, "function");
      if (!f || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string())
        throw bad_request("'tool_choice' must name a function: {\"type\": \"function\", \"function\": {\"name\"}}",
                          "tool_choice");
      const std::string name = (*f)["name"].get<std::string>();
      if (std::find(r.tool_names.begin(), r.tool_names.end(), name) == r.tool_names.end())
        throw bad_request("'tool_choice' names the function '" + name + "', which 'tools' does not offer", "tool_choice");
      choice = "function";
      r.tool_choice.function = name;
    } else {
      throw bad_request("'tool_choice' must be a string or an object, not " + type_name(*tc), "tool_choice");
    }
  }
  if (choice == "required" && r.tool_names.empty())
    throw bad_request("'tool_choice' \"required\" needs 'tools'", "tool_choice");
  r.parallel_tool_calls = bool_field(body, "parallel_tool_calls").value_or(true);
  r.parse_tool_calls = !r.tool_names.empty() && choice != "none";
  r.tool_choice.mode = choice;
  r.tool_choice.names = r.tool_names;
  r.tool_choice.parallel = r.parallel_tool_calls;
}

}  // namespace

std::optional<double> number_field(const json& body, const char* name, double min, double max) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw bad_request(std::string("'") + name + "' must be a number, not " + type_name(*v), name);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < min || x > max)
    throw bad_request(std::string("'") + name + "' must be in " + range(min, max), name);
  return x;
}

std::optional<int64_t> int_field(const json& body, const char* name, int64_t min, int64_t max) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer())
    throw bad_request(std::string("'") + name + "' must be an integer, not " + type_name(*v), name);
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(max))
    throw bad_request(std::string("'") + name + "' must be <= " + std::to_string(max), name);
  const int64_t x = v->get<int64_t>();
  if (x < min || x > max)
    throw bad_request(std::string("'") + name + "' must be in [" + std::to_string(min) + ", " + std::to_string(max) + "]",
                      name);
  return x;
}

std::optional<bool> bool_field(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw bad_request(std::string("'") + name + "' must be a boolean, not " + type_name(*v), name);
  return v->get<bool>();
}

std::optional<std::string> string_field(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw bad_request(std::string("'") + name + "' must be a string, not " + type_name(*v), name);
  return v->get<std::string>();
}

CompletionRequest read_completion_fields(const json& body, bool chat, const SamplerParams& defaults) {
  if (!body.is_object()) throw bad_request("the request body must be a JSON object, not " + type_name(body));
  refuse_unsupported(body, chat);
  CompletionRequest r;
  r.chat = chat;
  r.model = string_field(body, "model").value_or("");
  string_field(body, "user");
  if (auto salt = string_field(body, "cache_salt")) {
    if (salt->empty()) throw bad_request("'cache_salt' must be a non-empty string", "cache_salt");
    r.cache_salt = *salt;
  }
  constexpr int64_t kMaxTokens = int64_t(1) << 31;
  r.max_tokens = int_field(body, "max_completion_tokens", 1, kMaxTokens);
  if (!r.max_tokens) r.max_tokens = int_field(body, "max_tokens", 1, kMaxTokens);
  r.n = int_field(body, "n", 1, INT64_MAX).value_or(1);  // the server bounds it by its sequences
  if (auto echo = bool_field(body, "echo"); echo && *echo) throw bad_request("'echo' is not supported", "echo");

  SamplerParams& s = r.params.sampler;
  // A field left out takes the model's default (its generation_config.json's, else OpenAI's).
  for (const SamplerField& f : sampler_fields()) {
    // llama.cpp's spelling (repeat_penalty) or vLLM's (repetition_penalty) of one setting.
    const char* name = f.key;
    const json* v = field(body, f.key);
    if (f.alias) {
      const json* a = field(body, f.alias);
      if (a && v && *a != *v)
        throw bad_request(std::string("'") + f.alias + "' and '" + f.key + "' name the same setting: give one", f.key);
      if (a && !v) name = f.alias, v = a;
    }
    if (!v) {
      f.set(s, f.get(defaults));
      continue;
    }
    const double hi = f.request_hi > 0 ? f.request_hi : f.hi;
    const std::string expected = std::string(f.integer ? "an integer" : "a number") + " in " + f.range_text();
    if (f.integer ? !v->is_number_integer() : !v->is_number())
      throw bad_request(std::string("'") + name + "' must be " + expected + ", not " + type_name(*v), name);
    const double x = v->get<double>();
    if (!f.accepts(x) || x > hi) {
      SamplerField shown = f;
      shown.hi = hi;
      shown.hi_open = f.hi_open && hi == f.hi;
      throw bad_request(std::string("'") + name + "' must be in " + shown.range_text(), name);
    }
    f.set(s, x);
  }
  // No seed, or -1 (llama.cpp's "random"): a fresh random seed for this request.
  const std::optional<int64_t> seed = int_field(body, "seed", -1, INT64_MAX);
  s.seed = seed && *seed >= 0 ? uint64_t(*seed) : random_seed();

  if (const json* stop = field(body, "stop")) {
    if (stop->is_string()) {
      r.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > 16) throw bad_request("'stop' may hold at most 16 strings", "stop");
      for (const json& s1 : *stop) {
        if (!s1.is_string()) throw bad_request("'stop' must be a string or a list of strings", "stop");
        r.stop.push_back(s1.get<std::string>());
      }
    } else {
      throw bad_request("'stop' must be a string or a list of strings, not " + type_name(*stop), "stop");
    }
    for (const std::string& s1 : r.stop)
      if (s1.empty()) throw bad_request("'stop' strings must not be empty", "stop");
  }

  // As vLLM's and llama.cpp's: the reply runs to max_tokens (or the context) whatever the
  // model says, so a benchmark's request lengths are the ones it asked for.
  r.ignore_eos = bool_field(body, "ignore_eos").value_or(false);

  r.stream = bool_field(body, "stream").value_or(false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) throw bad_request("'stream_options' must be an object", "stream_options");
    r.include_usage = bool_field(*so, "include_usage").value_or(false);
  }

  if (chat) {
    r.logprobs = bool_field(body, "logprobs").value_or(false);
    r.top_logprobs = int(int_field(body, "top_logprobs", 0, 20).value_or(0));
    if (r.top_logprobs > 0 && !r.logprobs) throw bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  } else if (auto lp = int_field(body, "logprobs", 0, 5)) {
    r.logprobs = true;
    r.top_logprobs = int(*lp);
  }
  r.params.n_top_logprobs = r.logprobs ? r.top_logprobs : -1;
  if (chat) read_tools(body, r);
  return r;
}

void read_logit_bias(const json& body, int64_t vocab_size, SamplerParams& params) {
  const json* lb = field(body, "logit_bias");
  if (!lb) return;
  if (!lb->is_object())
    throw bad_request("'logit_bias' must be an object of token ids to biases, not " + type_name(*lb), "logit_bias");
  for (auto it = lb->begin(); it != lb->end(); ++it) {
    const std::string& key = it.key();
    char* end = nullptr;
    errno = 0;
    const long long id = key.empty() ? -1 : std::strtoll(key.c_str(), &end, 10);
    if (key.empty() || *end != '\0' || errno != 0 || !std::isdigit((unsigned char)key[0]) || id >= vocab_size)
      throw bad_request("'logit_bias': \"" + key + "\" is not a token id in [0, " + std::to_string(vocab_size) + ")",
                        "logit_bias");
    if (!it->is_number())
      throw bad_request("'logit_bias': the bias of token " + key + " must be a number, not " + type_name(*it),
                        "logit_bias");
    const double b = it->get<double>();
    if (!std::isfinite(b) || b < -100 || b > 100)
      throw bad_request("'logit_bias': the bias of token " + key + " must be in [-100, 100]", "logit_bias");
    params.logit_bias.emplace_back(int32_t(id), float(b));
  }
}

void prepare_chat_messages(nlohmann::ordered_json& request) {
  auto it = request.find("messages");
  if (it == request.end() || !it->is_array()) return;
  for (size_t i = 0; i < it->size(); ++i) {
    auto& m = (*it)[i];
    if (!m.is_object()) continue;
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (m.contains("content") && m["content"].is_array()) {
      std::string text;
      bool all_text = true;
      for (size_t k = 0; k < m["content"].size(); ++k) {
        const auto& part = m["content"][k];
        const std::string type = part.is_object() && part.contains("type") && part["type"].is_string()
                                     ? part["type"].get<std::string>()
                                     : "";
        // Image parts were read before (server/image_parts.h) and left as {"type": "image"}.
        for (const char* media : {"image_url", "input_image", "input_audio", "audio", "file", "video_url"})
          if (type == media)
            throw bad_request(at + ".content[" + std::to_string(k) + "]: this server reads text and images only; a '" +
                                  type + "' part cannot be read",
                              "messages");
        if (type != "text" || !part.contains("text") || !part["text"].is_string()) {
          all_text = false;
          break;
        }
        if (!text.empty()) text += "\n";
        text += part["text"].get<std::string>();
      }
      if (all_text) m["content"] = text;
    }
    auto calls = m.find("tool_calls");
    if (calls == m.end() || calls->is_null()) continue;
    // OpenAI clients send content null beside tool calls; templates read a string (vLLM too
    // passes "").
    if (!m.contains("content") || m["content"].is_null()) m["content"] = "";
    calls = m.find("tool_calls");
    if (!calls->is_array()) throw bad_request("'" + at + ".tool_calls' must be an array", "messages");
    for (size_t k = 0; k < calls->size(); ++k) {
      auto& c = (*calls)[k];
      const std::string cat = at + ".tool_calls[" + std::to_string(k) + "]";
      if (!c.is_object() || !c.contains("function") || !c["function"].is_object() || !c["function"].contains("name") ||
          !c["function"]["name"].is_string())
        throw bad_request("'" + cat + "' must be {\"type\": \"function\", \"function\": {\"name\", \"arguments\"}}",
                          "messages");
      auto& args = c["function"]["arguments"];
      if (args.is_string()) {
        try {
          args = nlohmann::ordered_json::parse(args.get<std::string>());
        } catch (const nlohmann::ordered_json::exception&) {
          throw bad_request("'" + cat + ".function.arguments' is not valid JSON", "messages");
        }
      }
      if (!args.is_object())
        throw bad_request("'" + cat + ".function.arguments' must be a JSON object (or a string holding one)", "messages");
    }
  }
}

std::vector<std::vector<int32_t>> read_prompts(const json& prompt, const Tokenizer& tokenizer, int64_t vocab_size) {
  std::vector<std::vector<int32_t>> out;
  auto empty = [] { return bad_request("'prompt' must not be empty", "prompt"); };
  if (prompt.is_string()) {
    out.push_back(encode(prompt.get<std::string>(), tokenizer));
  } else if (prompt.is_array()) {
    if (prompt.empty()) throw empty();
    if (prompt[0].is_number()) {
      out.push_back(token_ids(prompt, "prompt", vocab_size));
    } else {
      if (prompt.size() > 64) throw bad_request("'prompt' may hold at most 64 prompts", "prompt");
      for (const json& p : prompt) {
        if (p.is_string())
          out.push_back(encode(p.get<std::string>(), tokenizer));
        else if (p.is_array())
          out.push_back(token_ids(p, "prompt", vocab_size));
        else
          throw bad_request("'prompt' must be a string, an array of token ids, or an array of either", "prompt");
      }
    }
  } else {
    throw bad_request("'prompt' must be a string, an array of token ids, or an array of either, not " + type_name(prompt),
                      "prompt");
  }
  for (const auto& p : out)
    if (p.empty()) throw empty();
  return out;
}

}  // namespace osprey
