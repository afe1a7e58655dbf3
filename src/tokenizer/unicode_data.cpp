#include "tokenizer/unicode_data.h"

#include <charconv>
#include <stdexcept>
#include <string>
#include <string_view>

// unicode_data.txt's bytes, embedded by the build (cmake/embed_file.cmake).
extern "C" const unsigned char osprey_unicode_data_txt[];
extern "C" const unsigned long osprey_unicode_data_txt_size;

namespace osprey::unicode_data {
namespace {

// Fields of one line after its tag, in base `bases[i]`; throws std::logic_error on a malformed line
// (the file is generated and embedded, so this is a build defect, not bad input).
template <std::size_t N>
void parse_fields(std::string_view line, const int (&bases)[N], uint32_t (&out)[N]) {
  std::size_t pos = 1;
  for (std::size_t i = 0; i < N; ++i) {
    while (pos < line.size() && line[pos] == ' ') ++pos;
    const auto [end, ec] = std::from_chars(line.data() + pos, line.data() + line.size(), out[i], bases[i]);
    if (ec != std::errc()) throw std::logic_error("unicode_data.txt: malformed line '" + std::string(line) + "'");
    pos = std::size_t(end - line.data());
  }
}

Tables parse() {
  Tables t;
  const std::string_view text(reinterpret_cast<const char*>(osprey_unicode_data_txt), osprey_unicode_data_txt_size);
  for (std::size_t start = 0; start < text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == 'D') {
      uint32_t f[4];
      parse_fields(line, {16, 16, 16, 10}, f);
      t.decompositions.push_back({f[0], f[1], f[2], f[3]});
    } else if (line[0] == 'C') {
      uint32_t f[3];
      parse_fields(line, {16, 16, 10}, f);
      t.combining_classes.push_back({f[0], f[1], f[2]});
    } else {
      throw std::logic_error("unicode_data.txt: unknown line '" + std::string(line) + "'");
    }
  }
  return t;
}

}  // namespace

const Tables& tables() {
  static const Tables t = parse();
  return t;
}

}  // namespace osprey::unicode_data
