#include "core/error.h"
#include "core/file_read.h"
#include "tokenizer/json_reader.h"
#include "tokenizer/tokenizer_impl.h"

namespace osprey {
namespace {

using tok::Json;

Json parse_json(const std::string& text, const std::string& file) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::parse_error& e) {
    throw InvalidInput(file + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw InvalidInput(file + ": expected a JSON object at the top level");
  return j;
}

// "bos_token": "<s>" | {"content": "<s>", ...} | null.
std::string special_token_text(const Json& config, std::string_view key, const std::string& file) {
  const Json* v = tok::optional(config, key);
  if (v == nullptr) return {};
  const std::string where = tok::child(file, key);
  if (v->is_string()) return v->get<std::string>();
  if (v->is_object()) return tok::string_field(*v, "content", where);
  tok::fail(where, "expected a string or an object with \"content\"");
}

std::string chat_template_of(const Json& config, const std::string& file) {
  const Json* v = tok::optional(config, "chat_template");
  if (v == nullptr) return {};
  const std::string where = tok::child(file, "chat_template");
  if (v->is_string()) return v->get<std::string>();
  if (!v->is_array()) tok::fail(where, "expected a string or a list of {name, template}");
  std::string first;
  for (std::size_t i = 0; i < v->size(); ++i) {
    const std::string name = tok::string_field((*v)[i], "name", tok::child(where, i));
    std::string text = tok::string_field((*v)[i], "template", tok::child(where, i));
    if (name == "default") return text;
    if (i == 0) first = std::move(text);
  }
  return first;
}

std::vector<tok::AddedToken> parse_added_tokens(const Json& tokenizer, const std::string& file) {
  std::vector<tok::AddedToken> out;
  const Json* list = tok::optional(tokenizer, "added_tokens");
  if (list == nullptr) return out;
  const std::string where = tok::child(file, "added_tokens");
  if (!list->is_array()) tok::fail(where, "expected an array");
  for (std::size_t i = 0; i < list->size(); ++i) {
    const Json& t = (*list)[i];
    const std::string at = tok::child(where, i);
    tok::AddedToken a;
    a.content = tok::string_field(t, "content", at);
    const Json& id = tok::require(t, "id", at);
    if (!id.is_number_integer()) tok::fail(tok::child(at, "id"), "expected an integer token id");
    tok::check_token_id(id.is_number_unsigned() && id.get<uint64_t>() > uint64_t(tok::kMaxTokenId)
                            ? tok::kMaxTokenId
                            : id.get<int64_t>(),
                        id.dump(), at, a.content);
    a.id = int32_t(id.get<int64_t>());
    if (a.content.empty()) tok::fail(tok::child(at, "content"), "empty added token");
    a.special = tok::bool_field(t, "special", false, at);
    a.lstrip = tok::bool_field(t, "lstrip", false, at);
    a.rstrip = tok::bool_field(t, "rstrip", false, at);
    a.single_word = tok::bool_field(t, "single_word", false, at);
    a.normalized = tok::bool_field(t, "normalized", !a.special, at);
    out.push_back(std::move(a));
  }
  return out;
}

std::unique_ptr<tok::BpeModel> make_model(const Json& tokenizer, tok::BpeTables tables,
                                          const std::string& file) {
  const Json& model = tok::require(tokenizer, "model", file);
  const std::string where = tok::child(file, "model");
  const std::string type = tok::type_of(model, where);
  if (type != "BPE") throw Unsupported(where + ": " + type + " model is not supported");
  return std::make_unique<tok::BpeModel>(model, std::move(tables), where);
}

void build(Tokenizer::Impl& t, const Json& tokenizer, tok::BpeTables tables, const Json& config,
           const std::string& file, const std::string& config_file) {
  using Kind = Tokenizer::Impl::Kind;
  t.model = make_model(tokenizer, std::move(tables), file);
  t.normalizer = tok::make_normalizer(tokenizer.value("normalizer", Json()), tok::child(file, "normalizer"));
  t.pre_tokenizer =
      tok::make_pre_tokenizer(tokenizer.value("pre_tokenizer", Json()), tok::child(file, "pre_tokenizer"));
  t.post_processor = tok::make_post_processor(tokenizer.value("post_processor", Json()),
                                              tok::child(file, "post_processor"));
  t.decoder = tok::make_decoder(tokenizer.value("decoder", Json()), tok::child(file, "decoder"));

  std::vector<tok::AddedToken> added = parse_added_tokens(tokenizer, file);

  // Ids are below kMaxTokenId (checked as read), so id + 1 cannot overflow; the tables are
  // indexed by id, so ids must also be dense enough for the number of tokens.
  int32_t max_id = -1;
  const tok::AddedToken* max_added = nullptr;
  for (const auto& [token, id] : t.model->vocab()) max_id = std::max(max_id, id);
  for (const auto& a : added)
    if (a.id > max_id) max_id = a.id, max_added = &a;
  const int64_t id_limit = 2 * int64_t(t.model->vocab().size() + added.size()) + 1024;
  if (max_id >= id_limit) {
    std::string token;
    if (max_added != nullptr) {
      token = max_added->content;
    } else {
      for (const auto& [text, id] : t.model->vocab())
        if (id == max_id) token = text;
    }
    tok::fail(file, "token " + Json(token).dump() + " has id " + std::to_string(max_id) +
                        ", too sparse for a tokenizer of " +
                        std::to_string(t.model->vocab().size() + added.size()) +
                        " tokens (ids must be below " + std::to_string(id_limit) + ")");
  }
  const int32_t n_vocab = max_id + 1;
  t.id_to_token.assign(n_vocab, {});
  t.kind.assign(n_vocab, Kind::kNone);
  for (const auto& [token, id] : t.model->vocab()) {
    t.id_to_token[id] = token;
    t.kind[id] = Kind::kVocab;
  }
  std::vector<tok::AddedToken> raw, normalized;
  for (auto& a : added) {
    t.id_to_token[a.id] = a.content;
    t.kind[a.id] = a.special ? Kind::kSpecial : Kind::kAdded;
    t.added_to_id.insert_or_assign(a.content, a.id);
    if (a.normalized && t.normalizer) {
      a.content = t.normalizer->normalize(a.content);
      if (a.content.empty()) continue;
    }
    (a.normalized ? normalized : raw).push_back(std::move(a));
  }
  t.raw_added = tok::AddedTokenMatcher(std::move(raw));
  t.normalized_added = tok::AddedTokenMatcher(std::move(normalized));

  t.id_bytes.assign(n_vocab, {});
  for (int32_t id = 0; id < n_vocab; ++id)
    if (t.kind[id] != Kind::kNone) t.id_bytes[id] = t.decoder->token_bytes(t.id_to_token[id]);

  // tokenizer_config.json
  auto id_of = [&](const std::string& token, std::string_view key) {
    const std::optional<int32_t> id = t.id_of(token);
    if (!id) tok::fail(tok::child(config_file, key), "token \"" + token + "\" is not in the vocabulary");
    return *id;
  };
  t.bos_token = special_token_text(config, "bos_token", config_file);
  t.eos_token = special_token_text(config, "eos_token", config_file);
  t.chat_template = chat_template_of(config, config_file);
  if (const Json* v = tok::optional(config, "add_bos_token")) {
    if (!v->is_boolean()) tok::fail(tok::child(config_file, "add_bos_token"), "expected true or false");
    t.add_bos_token = v->get<bool>();
  }
  if (!t.bos_token.empty())
    t.bos_id = id_of(t.bos_token, "bos_token");
  else if (t.post_processor)
    t.bos_id = t.post_processor->leading_id();
  if (!t.eos_token.empty()) t.eos_ids.push_back(id_of(t.eos_token, "eos_token"));
}

// The tokenizer of a read tokenizer.json and tokenizer_config.json.
std::shared_ptr<Tokenizer::Impl> build_impl(tok::TokenizerJson tokenizer, const Json& config, const std::string& file,
                                            const std::string& config_file) {
  auto impl = std::make_shared<Tokenizer::Impl>();
  try {
    build(*impl, tokenizer.tree, std::move(tokenizer.tables), config, file, config_file);
  } catch (const Json::exception& e) {
    // Type errors that the field helpers did not anticipate.
    throw InvalidInput(file + ": " + e.what());
  }
  return impl;
}

}  // namespace

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::load(const std::filesystem::path& dir) {
  const std::filesystem::path tokenizer_path = dir / "tokenizer.json";
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  const std::string file = tokenizer_path.string();
  const std::string config_file = config_path.string();
  tok::TokenizerJson tokenizer = tok::read_tokenizer_json(read_regular_file(tokenizer_path), file);
  Json config = Json::object();
  if (regular_file_exists(config_path)) config = parse_json(read_regular_file(config_path), config_file);
  return Tokenizer(build_impl(std::move(tokenizer), config, file, config_file));
}

Tokenizer Tokenizer::from_json(const std::string& tokenizer_json, const std::string& config_json,
                               const std::string& where) {
  const std::string file = where + " (tokenizer.json)";
  const std::string config_file = where + " (tokenizer_config.json)";
  tok::TokenizerJson tokenizer = tok::read_tokenizer_json(tokenizer_json, file);
  return Tokenizer(build_impl(std::move(tokenizer), parse_json(config_json, config_file), file, config_file));
}

}  // namespace osprey
