#pragma once
// UTF-8 helpers shared by the tokenizer: validation, code point iteration, lossy
// conversion and the GPT-2 byte-level alphabet.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace osprey::utf8 {

// What the bytes at a position hold.
struct Scan {
  enum Kind { kComplete, kInvalid, kTruncated } kind;
  // kComplete: length of the sequence (1..4) and its code point.
  // kInvalid: length of the maximal invalid subpart (>= 1) to replace with one U+FFFD.
  // kTruncated: number of bytes present, all a valid prefix of a longer sequence that the
  // input ends before completing.
  std::size_t len;
  uint32_t cp;
};

// Classifies the sequence starting at p[0]; n >= 1 bytes are available.
Scan scan(const unsigned char* p, std::size_t n);

// Returns the byte offset of the first invalid or truncated sequence, or npos when valid.
std::size_t find_invalid(std::string_view s);

// Appends s to out, each invalid or truncated subpart replaced by U+FFFD (the WHATWG and
// Rust from_utf8_lossy rule).
void append_lossy(std::string& out, std::string_view s);

// Like append_lossy, but a trailing truncated sequence is not converted: returns the number
// of bytes of s consumed; the rest (at most 3 bytes) must be kept for more input.
std::size_t append_lossy_complete(std::string& out, std::string_view s);

// Appends the UTF-8 encoding of cp (a valid scalar value).
void append(std::string& out, uint32_t cp);

// Decodes the code point at s[i] of valid UTF-8 and advances i past it.
inline uint32_t next(std::string_view s, std::size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  if (p[0] < 0x80) {
    ++i;
    return p[0];
  }
  if (p[0] < 0xE0) {
    i += 2;
    return (uint32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (p[0] < 0xF0) {
    i += 3;
    return (uint32_t(p[0] & 0x0F) << 12) | (uint32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  i += 4;
  return (uint32_t(p[0] & 0x07) << 18) | (uint32_t(p[1] & 0x3F) << 12) |
         (uint32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

// Length in bytes of the sequence led by byte b of valid UTF-8.
inline std::size_t seq_len(unsigned char b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

// The GPT-2 byte-level alphabet: byte b is written as code point byte_to_cp()[b]
// (printable Latin-1 bytes map to themselves, the other 68 to U+0100..U+0143).
const std::array<uint32_t, 256>& byte_to_cp();
// Inverse: code point -> byte, or -1 for code points outside the alphabet.
int cp_to_byte(uint32_t cp);

}  // namespace osprey::utf8
