#include "server/base64.h"

#include <algorithm>
#include <array>
#include <cstdint>

namespace osprey {
namespace {
constexpr const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t w = uint32_t(uint8_t(bytes[i])) << 16;
    if (n > 1) w |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    if (n > 2) w |= uint32_t(uint8_t(bytes[i + 2]));
    out += kAlphabet[(w >> 18) & 63];
    out += kAlphabet[(w >> 12) & 63];
    out += n > 1 ? kAlphabet[(w >> 6) & 63] : '=';
    out += n > 2 ? kAlphabet[w & 63] : '=';
  }
  return out;
}

bool base64_decode(std::string_view text, std::string& out, size_t& bad_at) {
  static const std::array<int8_t, 256> value = [] {
    std::array<int8_t, 256> v{};
    v.fill(-1);
    for (int i = 0; i < 64; ++i) v[size_t(uint8_t(kAlphabet[i]))] = int8_t(i);
    return v;
  }();
  size_t n = text.size();
  size_t pad = 0;
  while (n > 0 && text[n - 1] == '=' && pad < 2) --n, ++pad;
  out.clear();
  out.reserve(n / 4 * 3 + 2);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n; ++i) {
    const int8_t v = value[size_t(uint8_t(text[i]))];
    if (v < 0) {
      bad_at = i;
      return false;
    }
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(char((acc >> bits) & 0xff));
    }
  }
  // Padding, when present, completes the last group of four; without it, a group of one
  // character holds no whole byte.
  if ((pad > 0 && (n + pad) % 4 != 0) || n % 4 == 1) {
    bad_at = text.size();
    return false;
  }
  return true;
}

}  // namespace osprey
