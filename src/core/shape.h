#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>

namespace osprey {

// A shape of up to kMaxDims dimensions, held inline (no heap allocation per array).
struct Shape {
  static constexpr int kMaxDims = 4;
  int64_t d[kMaxDims] = {0, 0, 0, 0};
  int n = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  int64_t operator[](int i) const { return d[i < 0 ? i + n : i]; }
  int64_t& operator[](int i) { return d[i < 0 ? i + n : i]; }
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  std::string str() const;  // "[2, 3]"
};

}  // namespace osprey
