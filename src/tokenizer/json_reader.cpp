#include "tokenizer/json_reader.h"

namespace osprey::tok {
namespace {

// Builds the tree for everything but model.vocab and model.merges, which it appends to the
// tables as their entries arrive.
class Reader final : public nlohmann::json_sax<Json> {
 public:
  explicit Reader(const std::string& file)
      : file_(file), vocab_where_(child(child(file, "model"), "vocab")),
        merges_where_(child(child(file, "model"), "merges")) {}

  TokenizerJson take() { return {std::move(root_), std::move(tables_)}; }

  bool null() override { return value(Json()); }
  bool boolean(bool v) override { return value(Json(v)); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::kVocab) return vocab_id(v, std::to_string(v));
    return value(Json(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::kVocab)
      return vocab_id(v > uint64_t(kMaxTokenId) ? kMaxTokenId : int64_t(v), std::to_string(v));
    return value(Json(v));
  }
  bool number_float(number_float_t v, const string_t&) override { return value(Json(v)); }
  bool binary(binary_t& v) override { return value(Json(std::move(v))); }

  bool string(string_t& s) override {
    switch (mode_) {
      case Mode::kMerges: {
        const std::size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
          fail(child(merges_where_, tables_.merges.size()),
               "expected \"left right\" with exactly one space");
        tables_.merges.add(std::string_view(s).substr(0, space), std::string_view(s).substr(space + 1));
        return true;
      }
      case Mode::kMergePair:
        if (pair_size_ < 2) pair_[pair_size_] = std::move(s);
        ++pair_size_;
        return true;
      default:
        return value(Json(std::move(s)));
    }
  }

  bool start_object(std::size_t) override {
    if (mode_ == Mode::kDom && in_model() && pending_key_ == "vocab") {
      mode_ = Mode::kVocab;
      tables_.has_vocab = true;
      return true;
    }
    if (mode_ != Mode::kDom) return value(Json::object());  // reports the error
    open(Json::object());
    return true;
  }
  bool key(string_t& k) override {
    if (mode_ == Mode::kVocab)
      vocab_token_ = std::move(k);
    else
      pending_key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    if (mode_ == Mode::kVocab)
      mode_ = Mode::kDom;
    else
      frames_.pop_back();
    return true;
  }

  bool start_array(std::size_t) override {
    switch (mode_) {
      case Mode::kMerges:
        mode_ = Mode::kMergePair;
        pair_size_ = 0;
        return true;
      case Mode::kDom:
        if (in_model() && pending_key_ == "merges") {
          mode_ = Mode::kMerges;
          tables_.has_merges = true;
        } else {
          open(Json::array());
        }
        return true;
      default:
        return value(Json::array());  // reports the error
    }
  }
  bool end_array() override {
    switch (mode_) {
      case Mode::kMergePair:
        if (pair_size_ != 2) bad_merge();
        tables_.merges.add(pair_[0], pair_[1]);
        mode_ = Mode::kMerges;
        return true;
      case Mode::kMerges:
        mode_ = Mode::kDom;
        return true;
      default:
        frames_.pop_back();
        return true;
    }
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    throw InvalidInput(file_ + ": not valid JSON: " + e.what());
  }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };
  struct Frame {
    Json* node;
    std::string key;  // the key of this object or array in its parent object
  };

  // True when the next value is a member of the top-level "model" object.
  bool in_model() const {
    return frames_.size() == 2 && frames_[1].key == "model" && frames_[1].node->is_object();
  }

  [[noreturn]] void bad_merge() const {
    fail(child(merges_where_, tables_.merges.size()),
         "expected a string \"left right\" or a pair [\"left\", \"right\"]");
  }

  bool vocab_id(int64_t id, const std::string& text) {
    check_token_id(id, text, vocab_where_, vocab_token_);
    tables_.vocab.emplace_back(std::move(vocab_token_), int32_t(id));
    return true;
  }

  // Adds a scalar (or, in the table modes, reports a value of the wrong kind).
  bool value(Json v) {
    switch (mode_) {
      case Mode::kVocab:
        fail(child(vocab_where_, vocab_token_), "expected an integer token id");
      case Mode::kMerges:
      case Mode::kMergePair:
        bad_merge();
      case Mode::kDom:
        place(std::move(v));
        return true;
    }
    return true;
  }

  Json* place(Json v) {
    if (frames_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json& parent = *frames_.back().node;
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    Json& slot = parent[pending_key_];
    slot = std::move(v);
    return &slot;
  }

  void open(Json container) {
    std::string key = !frames_.empty() && frames_.back().node->is_object() ? pending_key_ : "";
    Json* node = place(std::move(container));
    frames_.push_back({node, std::move(key)});
  }

  const std::string& file_;
  const std::string vocab_where_, merges_where_;
  Json root_;
  BpeTables tables_;
  std::vector<Frame> frames_;
  std::string pending_key_;
  Mode mode_ = Mode::kDom;
  std::string vocab_token_;
  std::string pair_[2];
  int pair_size_ = 0;
};

}  // namespace

TokenizerJson read_tokenizer_json(std::string_view text, const std::string& file) {
  Reader reader(file);
  Json::sax_parse(text, &reader);
  TokenizerJson out = reader.take();
  if (!out.tree.is_object()) fail(file, "expected a JSON object at the top level");
  return out;
}

}  // namespace osprey::tok
