#include "server/completion_request.h"

#include <cmath>

#include "core/error.h"
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

CompletionRequest read_completion_fields(const json& body, bool chat) {
  if (!body.is_object()) throw bad_request("the request body must be a JSON object, not " + type_name(body));
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
  if (auto n = int_field(body, "n", 1, INT64_MAX); n && *n != 1)
    throw bad_request("'n' must be 1: one choice per request is supported", "n");
  if (auto echo = bool_field(body, "echo"); echo && *echo) throw bad_request("'echo' is not supported", "echo");

  SamplerParams& s = r.params.sampler;
  s.temperature = float(number_field(body, "temperature", 0, 2).value_or(1.0));
  s.top_p = float(number_field(body, "top_p", 0, 1).value_or(1.0));
  if (s.top_p <= 0) throw bad_request("'top_p' must be in (0, 1]", "top_p");
  s.top_k = int(int_field(body, "top_k", 0, 1 << 30).value_or(0));
  s.min_p = float(number_field(body, "min_p", 0, 1).value_or(0.0));
  if (s.min_p >= 1) throw bad_request("'min_p' must be in [0, 1)", "min_p");
  s.repetition_penalty = float(number_field(body, "repeat_penalty", 0, 1e6).value_or(1.0));
  if (s.repetition_penalty <= 0) throw bad_request("'repeat_penalty' must be > 0", "repeat_penalty");
  s.repeat_last_n = int(int_field(body, "repeat_last_n", 0, 1 << 30).value_or(64));
  s.presence_penalty = float(number_field(body, "presence_penalty", -2, 2).value_or(0.0));
  s.frequency_penalty = float(number_field(body, "frequency_penalty", -2, 2).value_or(0.0));
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
  return r;
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
