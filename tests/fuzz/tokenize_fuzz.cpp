// Encoding and decoding with the demo model's byte-level BPE tokenizer. The first byte
// chooses: even, encode the rest as text (with and without special-token parsing) and decode
// the ids back, which must give the text again when it is valid UTF-8 without special tokens;
// odd, decode the rest as little-endian int32 ids (ids outside the vocabulary must be errors).
#include <cstring>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

using namespace osprey;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Tokenizer t = Tokenizer::load(fuzz::source_path("models/demo"));
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    fuzz::expect_clean([&] { (void)t.decode(t.encode(rest, true, true)); });
    fuzz::expect_clean([&] {
      const std::vector<int32_t> ids = t.encode(rest, false, false);
      const std::string back = t.decode(ids);
      if (utf8::find_invalid(rest) == std::string_view::npos && back != rest) {
        std::fprintf(stderr, "fuzz: decode(encode(text)) differs from the text\n");
        std::abort();
      }
    });
  } else {
    std::vector<int32_t> ids(rest.size() / 4);
    if (!ids.empty()) std::memcpy(ids.data(), rest.data(), ids.size() * 4);
    fuzz::expect_clean([&] {
      (void)t.decode(ids);
      Tokenizer::StreamDecoder s(t);
      for (int32_t id : ids) (void)s.push(id);
      (void)s.flush();
    });
  }
  return 0;
}
