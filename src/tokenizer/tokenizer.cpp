#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace osprey {

void Tokenizer::Impl::encode_plain(std::string_view text, bool parse_special,
                                   std::vector<int32_t>& ids) const {
  std::string normalized = normalizer ? normalizer->normalize(std::string(text)) : std::string(text);
  std::vector<tok::Segment> segments;
  normalized_added.split(normalized, parse_special, segments);
  std::vector<std::string> pieces;
  for (const auto& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    pieces.assign(1, std::string(seg.text));
    if (pre_tokenizer) pre_tokenizer->pre_tokenize(pieces);
    for (const auto& p : pieces) model->encode(p, ids);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  const std::size_t bad = utf8::find_invalid(text);
  if (bad != std::string_view::npos)
    throw InvalidInput("tokenizer input: invalid UTF-8 at byte " + std::to_string(bad));
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<tok::Segment> segments;
  impl_->raw_added.split(text, parse_special, segments);
  for (const auto& seg : segments) {
    if (seg.id >= 0)
      ids.push_back(seg.id);
    else
      impl_->encode_plain(seg.text, parse_special, ids);
  }
  if (add_special && impl_->post_processor) impl_->post_processor->process(ids);
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (const int32_t id : ids) {
    if (!impl_->known(id) || (skip_special && impl_->special(id))) continue;
    bytes += impl_->id_bytes[id];
  }
  if (utf8::find_invalid(bytes) == std::string::npos) return bytes;
  std::string out;
  utf8::append_lossy(out, bytes);
  return out;
}

std::string Tokenizer::token_text(int32_t id) const {
  if (!impl_->known(id)) throw InvalidInput("token id " + std::to_string(id) + " has no token");
  return impl_->id_to_token[id];
}

std::string Tokenizer::token_bytes(int32_t id) const { return impl_->known(id) ? impl_->id_bytes[size_t(id)] : std::string(); }

int32_t Tokenizer::vocab_size() const { return int32_t(impl_->kind.size()); }

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  return impl_->id_of(token);
}

bool Tokenizer::is_special(int32_t id) const { return impl_->special(id); }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos_id; }
std::vector<int32_t> Tokenizer::eos_ids() const { return impl_->eos_ids; }
const std::string& Tokenizer::bos_token() const { return impl_->bos_token; }
const std::string& Tokenizer::eos_token() const { return impl_->eos_token; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
std::optional<bool> Tokenizer::add_bos_token() const { return impl_->add_bos_token; }

Tokenizer::StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : impl_(tokenizer.impl_), skip_special_(skip_special) {}

std::string Tokenizer::StreamDecoder::push(int32_t id) {
  if (!impl_->known(id) || (skip_special_ && impl_->special(id))) return {};
  pending_ += impl_->id_bytes[id];
  std::string out;
  const std::size_t used = utf8::append_lossy_complete(out, pending_);
  pending_.erase(0, used);
  return out;
}

std::string Tokenizer::StreamDecoder::flush() {
  std::string out;
  utf8::append_lossy(out, pending_);
  pending_.clear();
  return out;
}

}  // namespace osprey
