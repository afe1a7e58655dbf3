#pragma once
// Raw Unicode tables for canonical normalization (generated into unicode_data.cpp by
// unicode_data_gen.py). Hangul syllables are not listed: they are handled algorithmically.
#include <cstddef>
#include <cstdint>

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

// Sorted by cp.
extern const Decomposition kDecompositions[];
extern const std::size_t kNumDecompositions;
// Sorted by first, non-overlapping.
extern const CombiningClassRange kCombiningClasses[];
extern const std::size_t kNumCombiningClasses;

}  // namespace osprey::unicode_data
