#pragma once
// Checked arithmetic for sizes computed from files, flags and environment variables: a
// product or sum that does not fit is an error, never a wrapped value.
#include <cstdint>
#include <optional>
#include <string>

#include "core/error.h"

namespace osprey {

// a * b, or nullopt when it does not fit in 64 bits.
inline std::optional<uint64_t> mul_u64(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// a + b, or nullopt when it does not fit in 64 bits.
inline std::optional<uint64_t> add_u64(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// a * b; throws InvalidInput "<what>: <a> * <b> overflows 64 bits" when it does not fit.
inline uint64_t checked_mul(uint64_t a, uint64_t b, const std::string& what) {
  if (auto r = mul_u64(a, b)) return *r;
  throw InvalidInput(what + ": " + std::to_string(a) + " * " + std::to_string(b) + " overflows 64 bits");
}

// a + b; throws InvalidInput as checked_mul does.
inline uint64_t checked_add(uint64_t a, uint64_t b, const std::string& what) {
  if (auto r = add_u64(a, b)) return *r;
  throw InvalidInput(what + ": " + std::to_string(a) + " + " + std::to_string(b) + " overflows 64 bits");
}

}  // namespace osprey
