#include "chat/chat_template.h"

#include "chat/jinja.h"
#include "core/error.h"
#include "core/file_read.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) { return read_regular_file(path); }

nlohmann::json read_json(const fs::path& path) {
  try {
    return nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::parse_error& e) {
    throw InvalidInput(path.string() + ": malformed JSON: " + e.what());
  }
}

// Picks the template named `name` ("" = "default") from a chat_template field: a string, or a
// list of {"name", "template"}.
std::string pick_template(const nlohmann::json& field, const std::string& where, const std::string& name,
                          std::vector<std::string>& names) {
  if (field.is_string()) {
    names = {"default"};
    if (!name.empty() && name != "default")
      throw InvalidInput(where + ": has one template, \"default\"; no template named \"" + name + "\"");
    return field.get<std::string>();
  }
  if (!field.is_array()) throw InvalidInput(where + ": expected a string or a list of {name, template}");
  std::string wanted = name.empty() ? "default" : name;
  const nlohmann::json* found = nullptr;
  for (std::size_t k = 0; k < field.size(); ++k) {
    const auto& e = field[k];
    std::string at = where + "[" + std::to_string(k) + "]";
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("template") ||
        !e["template"].is_string())
      throw InvalidInput(at + ": expected {\"name\": string, \"template\": string}");
    names.push_back(e["name"].get<std::string>());
    if (names.back() == wanted) found = &e["template"];
  }
  if (!found) {
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    throw InvalidInput(where + ": no template named \"" + wanted + "\" (it has: " + list + ")");
  }
  return found->get<std::string>();
}

template <class J>
jinja::Value to_value(const J& j) {
  using jinja::Value;
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) throw Unsupported("chat request: an integer beyond 64 bits");
      return Value::integer(int64_t(u));
    }
    case nlohmann::json::value_t::number_float: return Value::floating(j.template get<double>());
    case nlohmann::json::value_t::string: return Value::string(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      jinja::List items;
      for (const auto& e : j) items.push_back(to_value(e));
      return Value::make_list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value d = Value::make_dict();
      for (auto it = j.begin(); it != j.end(); ++it) d.dict->set(it.key(), to_value(it.value()));
      return d;
    }
    default: throw InvalidInput("chat request: a value JSON cannot hold");
  }
}

template <class J>
void check_request(const J& req) {
  if (!req.is_object()) throw InvalidInput("chat request: expected a JSON object");
  auto it = req.find("messages");
  if (it == req.end()) throw InvalidInput("chat request: missing field \"messages\"");
  if (!it->is_array()) throw InvalidInput("chat request: messages: expected a list of messages");
  for (std::size_t k = 0; k < it->size(); ++k) {
    const auto& m = (*it)[k];
    std::string at = "chat request: messages[" + std::to_string(k) + "]";
    if (!m.is_object()) throw InvalidInput(at + ": expected an object");
    if (!m.contains("role") || !m["role"].is_string()) throw InvalidInput(at + ".role: expected a string");
    if (!m.contains("content")) continue;
    const auto& c = m["content"];
    if (c.is_string() || c.is_null()) continue;
    if (!c.is_array()) throw InvalidInput(at + ".content: expected a string or a list of parts");
    for (std::size_t p = 0; p < c.size(); ++p) {
      std::string pat = at + ".content[" + std::to_string(p) + "]";
      if (!c[p].is_object() || !c[p].contains("type") || !c[p]["type"].is_string())
        throw InvalidInput(pat + ": expected an object with a string \"type\"");
      if (c[p]["type"] == "text" && (!c[p].contains("text") || !c[p]["text"].is_string()))
        throw InvalidInput(pat + ".text: expected a string");
    }
  }
  if (auto g = req.find("add_generation_prompt"); g != req.end() && !g->is_boolean())
    throw InvalidInput("chat request: add_generation_prompt: expected true or false");
  if (auto t = req.find("tools"); t != req.end() && !t->is_null() && !t->is_array())
    throw InvalidInput("chat request: tools: expected a list");
  if (auto d = req.find("documents"); d != req.end() && !d->is_null()) {
    if (!d->is_array()) throw InvalidInput("chat request: documents: expected a list of objects");
    for (std::size_t k = 0; k < d->size(); ++k)
      if (!(*d)[k].is_object())
        throw InvalidInput("chat request: documents[" + std::to_string(k) + "]: expected an object");
  }
  if (auto kw = req.find("chat_template_kwargs"); kw != req.end() && !kw->is_null()) {
    if (!kw->is_object()) throw InvalidInput("chat request: chat_template_kwargs: expected an object");
    for (const char* reserved : {"messages", "tools", "documents", "add_generation_prompt"})
      if (kw->contains(reserved))
        throw InvalidInput(std::string("chat request: chat_template_kwargs.") + reserved +
                           ": set it at the top level of the request");
  }
}

template <class J>
std::string render_request(const jinja::Template& tpl, const std::vector<std::pair<std::string, std::string>>& special,
                           const J& req) {
  check_request(req);
  jinja::Dict vars;
  for (const auto& [k, v] : special) vars.set(k, jinja::Value::string(v));
  if (auto kw = req.find("chat_template_kwargs"); kw != req.end() && !kw->is_null())
    for (auto it = kw->begin(); it != kw->end(); ++it) vars.set(it.key(), to_value(it.value()));
  vars.set("messages", to_value(req["messages"]));
  auto opt = [&](const char* key) {
    auto it = req.find(key);
    return it == req.end() ? jinja::Value::none() : to_value(*it);
  };
  vars.set("tools", opt("tools"));
  vars.set("documents", opt("documents"));
  auto g = req.find("add_generation_prompt");
  vars.set("add_generation_prompt", jinja::Value::boolean(g == req.end() ? true : g->template get<bool>()));
  return tpl.render(vars);
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source, std::vector<std::pair<std::string, std::string>> special_tokens,
                           std::vector<std::string> names)
    : template_(std::make_shared<const jinja::Template>(source)),
      source_(source),
      special_tokens_(std::move(special_tokens)),
      names_(std::move(names)) {}

ChatTemplate ChatTemplate::load(const fs::path& dir, const std::string& name) {
  const fs::path config_path = dir / "tokenizer_config.json";
  nlohmann::json config;
  bool has_config = regular_file_exists(config_path);
  if (has_config) {
    config = read_json(config_path);
    if (!config.is_object()) throw InvalidInput(config_path.string() + ": expected a JSON object");
  }
  std::vector<std::pair<std::string, std::string>> special;
  if (has_config) {
    for (auto it = config.begin(); it != config.end(); ++it) {
      const std::string& key = it.key();
      if (key.size() < 6 || key.compare(key.size() - 6, 6, "_token") != 0) continue;
      const auto& v = it.value();
      if (v.is_string()) {
        special.emplace_back(key, v.get<std::string>());
      } else if (v.is_object() && v.contains("content")) {
        if (!v["content"].is_string())
          throw InvalidInput(config_path.string() + ": " + key + ".content: expected a string");
        special.emplace_back(key, v["content"].get<std::string>());
      }  // other values (add_bos_token: true, ...) are flags, not token texts
    }
  }
  std::vector<std::string> names;
  std::string source;
  const fs::path jinja_path = dir / "chat_template.jinja";
  const fs::path json_path = dir / "chat_template.json";
  if (regular_file_exists(jinja_path)) {
    source = read_text(jinja_path);
    names = {"default"};
    if (!name.empty() && name != "default")
      throw InvalidInput(jinja_path.string() + ": has one template, \"default\"; no template named \"" + name + "\"");
  } else if (regular_file_exists(json_path)) {
    nlohmann::json j = read_json(json_path);
    if (!j.is_object() || !j.contains("chat_template"))
      throw InvalidInput(json_path.string() + ": missing field \"chat_template\"");
    source = pick_template(j["chat_template"], json_path.string() + ": chat_template", name, names);
  } else if (has_config && config.contains("chat_template") && !config["chat_template"].is_null()) {
    source = pick_template(config["chat_template"], config_path.string() + ": chat_template", name, names);
  } else if (!has_config && !fs::exists(dir)) {
    throw IoError(dir.string() + ": no such folder");
  } else {
    throw InvalidInput(dir.string() + " has no chat template (no chat_template.jinja, chat_template.json or "
                       "tokenizer_config.json \"chat_template\")");
  }
  return ChatTemplate(source, std::move(special), std::move(names));
}

std::string ChatTemplate::render(const nlohmann::json& request) const {
  return render_request(*template_, special_tokens_, request);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& request) const {
  return render_request(*template_, special_tokens_, request);
}

std::vector<std::string> ChatTemplate::names() const { return names_; }

}  // namespace osprey
