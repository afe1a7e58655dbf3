#include "tokenizer/utf8.h"

namespace osprey::utf8 {

Scan scan(const unsigned char* p, std::size_t n) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return {Scan::kComplete, 1, b0};
  std::size_t need;
  uint32_t cp;
  unsigned char lo = 0x80, hi = 0xBF;  // valid range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {Scan::kInvalid, 1, 0};
  }
  for (std::size_t k = 1; k < need; ++k) {
    if (k >= n) return {Scan::kTruncated, k, 0};
    const unsigned char b = p[k];
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return {Scan::kInvalid, k, 0};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Scan::kComplete, need, cp};
}

std::size_t find_invalid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const Scan sc = scan(p + i, n - i);
    if (sc.kind != Scan::kComplete) return i;
    i += sc.len;
  }
  return std::string_view::npos;
}

static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

static std::size_t lossy(std::string& out, std::string_view s, bool keep_truncated_tail) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0, run = 0;  // [run, i) is valid and not yet copied
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const Scan sc = scan(p + i, n - i);
    if (sc.kind == Scan::kComplete) {
      i += sc.len;
      continue;
    }
    out.append(s.substr(run, i - run));
    if (sc.kind == Scan::kTruncated && keep_truncated_tail) return i;
    out.append(kReplacement);
    i += sc.len;
    run = i;
  }
  out.append(s.substr(run, i - run));
  return n;
}

void append_lossy(std::string& out, std::string_view s) { lossy(out, s, false); }

std::size_t append_lossy_complete(std::string& out, std::string_view s) {
  return lossy(out, s, true);
}

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

namespace {

struct ByteAlphabet {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 0x144> to_byte{};

  ByteAlphabet() {
    to_byte.fill(-1);
    uint32_t next_extra = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_cp[b] = printable ? b : next_extra++;
      to_byte[to_cp[b]] = int16_t(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

}  // namespace

const std::array<uint32_t, 256>& byte_to_cp() { return alphabet().to_cp; }

int cp_to_byte(uint32_t cp) {
  const auto& a = alphabet();
  return cp < a.to_byte.size() ? a.to_byte[cp] : -1;
}

}  // namespace osprey::utf8
