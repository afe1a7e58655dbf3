#pragma once
// Canonical Unicode normalization (NFC, NFD) of valid UTF-8, using the tables in
// unicode_data.cpp (Unicode 14.0) plus algorithmic Hangul. Compatibility forms (NFKC/NFKD)
// are not implemented.
#include <string>
#include <string_view>

namespace osprey::unicode {

// s must be valid UTF-8. Thread-safe.
std::string nfc(std::string_view s);
std::string nfd(std::string_view s);

}  // namespace osprey::unicode
