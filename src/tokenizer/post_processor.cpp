#include <functional>
#include <map>

#include "tokenizer/components.h"

namespace osprey::tok {
namespace {

// The single-sequence template: fixed ids around the encoded sequence.
class TemplatePostProcessor final : public PostProcessor {
 public:
  TemplatePostProcessor(std::vector<int32_t> before, std::vector<int32_t> after)
      : before_(std::move(before)), after_(std::move(after)) {}

  void process(std::vector<int32_t>& ids) const override {
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }
  std::optional<int32_t> leading_id() const override {
    if (before_.empty()) return std::nullopt;
    return before_.front();
  }

 private:
  std::vector<int32_t> before_;
  std::vector<int32_t> after_;
};

// ByteLevel post-processing only trims offsets; ids are unchanged.
class NoOpPostProcessor final : public PostProcessor {
 public:
  void process(std::vector<int32_t>&) const override {}
};

class SequencePostProcessor final : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> parts)
      : parts_(std::move(parts)) {}
  void process(std::vector<int32_t>& ids) const override {
    for (const auto& p : parts_) p->process(ids);
  }
  std::optional<int32_t> leading_id() const override {
    // The last processor that adds a leading id decides what comes first.
    std::optional<int32_t> id;
    for (const auto& p : parts_)
      if (auto l = p->leading_id()) id = l;
    return id;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

std::unique_ptr<PostProcessor> make_template(const Json& j, const std::string& where) {
  const std::string swhere = child(where, "single");
  const Json& single = require(j, "single", where);
  if (!single.is_array()) fail(swhere, "expected an array of template pieces");
  const Json& specials = require(j, "special_tokens", where);
  std::vector<int32_t> before, after;
  bool seen_sequence = false;
  for (std::size_t i = 0; i < single.size(); ++i) {
    const std::string iwhere = child(swhere, i);
    if (const Json* seq = optional(single[i], "Sequence")) {
      const std::string name = string_field(*seq, "id", child(iwhere, "Sequence"));
      if (name != "A") fail(iwhere, "single-sequence template refers to sequence " + name);
      if (seen_sequence) fail(iwhere, "sequence A appears twice");
      seen_sequence = true;
    } else if (const Json* tok = optional(single[i], "SpecialToken")) {
      const std::string name = string_field(*tok, "id", child(iwhere, "SpecialToken"));
      const Json* entry = optional(specials, name);
      if (entry == nullptr)
        fail(child(where, "special_tokens"), "no entry for \"" + name + "\" used in single");
      const std::string ewhere = child(child(where, "special_tokens"), name);
      const Json& ids = require(*entry, "ids", ewhere);
      if (!ids.is_array()) fail(child(ewhere, "ids"), "expected an array of ids");
      for (std::size_t k = 0; k < ids.size(); ++k)
        (seen_sequence ? after : before).push_back(as_id(ids[k], child(child(ewhere, "ids"), k)));
    } else {
      fail(iwhere, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
  }
  if (!seen_sequence) fail(swhere, "template has no sequence A");
  return std::make_unique<TemplatePostProcessor>(std::move(before), std::move(after));
}

// RobertaProcessing / BertProcessing: cls A sep, with "cls": [token, id], "sep": [token, id].
std::unique_ptr<PostProcessor> make_cls_sep(const Json& j, const std::string& where) {
  auto id_of = [&](std::string_view key) {
    const Json& pair = require(j, key, where);
    if (!pair.is_array() || pair.size() != 2) fail(child(where, key), "expected [token, id]");
    return as_id(pair[1], child(child(where, key), 1));
  };
  return std::make_unique<TemplatePostProcessor>(std::vector<int32_t>{id_of("cls")},
                                                 std::vector<int32_t>{id_of("sep")});
}

const std::map<std::string, StageBuilder<PostProcessor>>& post_processor_builders() {
  static const std::map<std::string, StageBuilder<PostProcessor>> builders = {
      {"TemplateProcessing", make_template},
      {"RobertaProcessing", make_cls_sep},
      {"BertProcessing", make_cls_sep},
      {"ByteLevel",
       [](const Json&, const std::string&) { return std::make_unique<NoOpPostProcessor>(); }},
      {"Sequence", sequence_builder<PostProcessor, SequencePostProcessor>("processors", make_post_processor)},
  };
  return builders;
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const Json& j, const std::string& where) {
  return build_stage(post_processor_builders(), j, where, "post-processor");
}

}  // namespace osprey::tok
