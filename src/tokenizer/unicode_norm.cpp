#include "tokenizer/unicode_norm.h"

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "tokenizer/unicode_data.h"
#include "tokenizer/utf8.h"

namespace osprey::unicode {
namespace {

// Hangul syllable arithmetic (Unicode section 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

// Below U+0300 every ccc is 0, nothing changes under NFC and no composition has its
// second element there: text made only of such code points is already NFC. NFD also
// leaves code points below U+00C0 alone.
constexpr uint32_t kFirstInteresting = 0x300;
// Lead bytes of U+0300 and U+00C0: every code point at or above them has a lead byte at or
// above these values, and no byte of a smaller code point reaches them.
constexpr unsigned char kNfcLeadByte = 0xCC, kNfdLeadByte = 0xC3;

uint32_t combining_class(uint32_t cp) {
  if (cp < kFirstInteresting) return 0;
  const auto& ranges = unicode_data::tables().combining_classes;
  auto it = std::upper_bound(ranges.begin(), ranges.end(), cp, [](uint32_t c, const auto& r) { return c < r.first; });
  if (it == ranges.begin()) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

const unicode_data::Decomposition* find_decomposition(uint32_t cp) {
  if (cp < 0xC0) return nullptr;
  const auto& ds = unicode_data::tables().decompositions;
  const auto it = std::lower_bound(ds.begin(), ds.end(), cp, [](const auto& d, uint32_t c) { return d.cp < c; });
  return (it != ds.end() && it->cp == cp) ? &*it : nullptr;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const auto* d = find_decomposition(cp);
  if (d == nullptr) {
    out.push_back(cp);
    return;
  }
  decompose(d->first, out);
  if (d->second != 0) decompose(d->second, out);
}

uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t(a) << 32) | b; }

const std::unordered_map<uint64_t, uint32_t>& composition_table() {
  static const auto table = [] {
    std::unordered_map<uint64_t, uint32_t> t;
    for (const auto& d : unicode_data::tables().decompositions) {
      if (d.composes) t.emplace(pair_key(d.first, d.second), d.cp);
    }
    return t;
  }();
  return table;
}

// Returns the primary composite of (a, b), or 0.
uint32_t compose_pair(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto& t = composition_table();
  const auto it = t.find(pair_key(a, b));
  return it == t.end() ? 0 : it->second;
}

bool has_byte_at_least(std::string_view s, unsigned char lead) {
  for (const char c : s)
    if (static_cast<unsigned char>(c) >= lead) return true;
  return false;
}

// Full canonical decomposition followed by canonical ordering.
std::vector<uint32_t> decompose_ordered(std::string_view s) {
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) decompose(utf8::next(s, i), cps);
  // Stable sort of each run of non-starters by combining class.
  std::size_t i = 0;
  while (i < cps.size()) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0) ++j;
    if (j - i > 1)
      std::stable_sort(cps.begin() + i, cps.begin() + j, [](uint32_t a, uint32_t b) {
        return combining_class(a) < combining_class(b);
      });
    i = j;
  }
  return cps;
}

std::string encode(const std::vector<uint32_t>& cps, std::size_t n) {
  std::string out;
  out.reserve(n * 2);
  for (std::size_t i = 0; i < n; ++i) utf8::append(out, cps[i]);
  return out;
}

}  // namespace

std::string nfd(std::string_view s) {
  if (!has_byte_at_least(s, kNfdLeadByte)) return std::string(s);
  const auto cps = decompose_ordered(s);
  return encode(cps, cps.size());
}

std::string nfc(std::string_view s) {
  if (!has_byte_at_least(s, kNfcLeadByte)) return std::string(s);
  auto cps = decompose_ordered(s);
  if (cps.empty()) return {};
  // Canonical composition (Unicode section 3.11), in place.
  std::size_t starter = 0;
  uint32_t last_class = combining_class(cps[0]) == 0 ? 0 : 256;
  std::size_t n_out = 1;
  for (std::size_t i = 1; i < cps.size(); ++i) {
    const uint32_t cp = cps[i];
    const uint32_t cls = combining_class(cp);
    const uint32_t composite = last_class == 256 ? 0 : compose_pair(cps[starter], cp);
    if (composite != 0 && (last_class < cls || last_class == 0)) {
      cps[starter] = composite;
      continue;
    }
    if (cls == 0) starter = n_out;
    last_class = cls;
    cps[n_out++] = cp;
  }
  return encode(cps, n_out);
}

}  // namespace osprey::unicode
