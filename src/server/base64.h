#pragma once
// Base64 with RFC 4648's alphabet: the embeddings route's `encoding_format: "base64"` replies
// and the images of `data:` URLs.
#include <cstddef>
#include <string>
#include <string_view>

namespace osprey {

// `bytes` as base64, padded with '='.
std::string base64_encode(std::string_view bytes);

// Base64 (its padding optional) into `out`. False for text that is not base64, with `bad_at`
// the position of the first character at fault (text.size() when the text ends inside a group
// of four).
bool base64_decode(std::string_view text, std::string& out, size_t& bad_at);

}  // namespace osprey
