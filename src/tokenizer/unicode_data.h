#pragma once
// Raw Unicode tables for canonical normalization, read at first use from unicode_data.txt
// (written by tools/unicode_data_gen.py, embedded by the build). Hangul syllables are not
// listed: they are handled algorithmically.
#include <cstdint>
#include <vector>

namespace osprey::unicode_data {

// One level of canonical decomposition: cp -> first [second]. second == 0 for a singleton.
// composes == 1 when the pair (first, second) composes back to cp under NFC (a primary
// composite, not excluded from composition).
struct Decomposition {
  uint32_t cp;
  uint32_t first;
  uint32_t second;
  uint32_t composes;
};

// Code points first..last (inclusive) have canonical combining class ccc (never 0 here).
struct CombiningClassRange {
  uint32_t first;
  uint32_t last;
  uint32_t ccc;
};

struct Tables {
  std::vector<Decomposition> decompositions;            // sorted by cp
  std::vector<CombiningClassRange> combining_classes;  // sorted by first, non-overlapping
};
const Tables& tables();  // parsed once, on first use (thread-safe)

}  // namespace osprey::unicode_data
