#pragma once
#include <string>

namespace osprey {

struct Device {
  enum class Kind { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;

  static Device cpu() { return {}; }
  static Device cuda(int index = 0) { return {Kind::cuda, index}; }
  bool is_cpu() const { return kind == Kind::cpu; }
  bool operator==(const Device&) const = default;
  std::string str() const { return kind == Kind::cpu ? "cpu" : "cuda:" + std::to_string(index); }
};

}  // namespace osprey
