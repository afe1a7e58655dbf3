#pragma once
// GGUF files built byte by byte in tests, field by field as the format's specification lays
// them out (little-endian), independently of the reader under test (formats/gguf.h).
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace osprey::testing {

struct GgufBytes {
  // Value types, as the specification numbers them.
  static constexpr uint32_t kU8 = 0, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9, kU64 = 10;

  std::string b;
  template <class T>
  GgufBytes& put(T v) {
    char raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    b.append(raw, sizeof(T));
    return *this;
  }
  GgufBytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    b += s;
    return *this;
  }
  GgufBytes& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b += "GGUF";
    return put<uint32_t>(version).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
  }
  GgufBytes& kv_u32(const std::string& key, uint32_t v) { return str(key).put<uint32_t>(kU32).put<uint32_t>(v); }
  GgufBytes& kv_bool(const std::string& key, bool v) { return str(key).put<uint32_t>(kBool).put<uint8_t>(v ? 1 : 0); }
  GgufBytes& kv_str(const std::string& key, const std::string& v) { return str(key).put<uint32_t>(kString).str(v); }
  GgufBytes& kv_strs(const std::string& key, const std::vector<std::string>& v) {
    str(key).put<uint32_t>(kArray).put<uint32_t>(kString).put<uint64_t>(v.size());
    for (const auto& s : v) str(s);
    return *this;
  }
  GgufBytes& kv_i32s(const std::string& key, const std::vector<int32_t>& v) {
    str(key).put<uint32_t>(kArray).put<uint32_t>(kI32).put<uint64_t>(v.size());
    for (int32_t x : v) put<int32_t>(x);
    return *this;
  }
  // A tensor info: dims as GGUF orders them (ne[0], the row length, first).
  GgufBytes& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).put<uint32_t>(uint32_t(ne.size()));
    for (uint64_t d : ne) put<uint64_t>(d);
    return put<uint32_t>(type).put<uint64_t>(offset);
  }
  GgufBytes& align(size_t a) {
    while (b.size() % a) b.push_back('\0');
    return *this;
  }
};

}  // namespace osprey::testing
