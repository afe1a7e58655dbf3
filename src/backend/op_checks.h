#pragma once
// Internal to the op dispatch files (backend/ops.cpp, backend/quant_ops.cpp): argument checks
// and the device choice.
#include <initializer_list>
#include <string>
#include <type_traits>

#include "core/array.h"
#include "core/error.h"

namespace osprey::ops::detail {

inline void require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw InvalidInput(std::string(op) + ": " + what);
}
// The same, with the message made only when the check fails (`what()` returns it): for checks
// that run on every call of a decode step's op, where building the text would allocate.
template <class F, class = std::enable_if_t<std::is_invocable_r_v<std::string, F&>>>
inline void require(bool ok, const char* op, F&& what) {
  if (!ok) throw InvalidInput(std::string(op) + ": " + what());
}

// Checks that the defined arrays share one device; true when it is a CUDA device.
inline bool on_cuda(const char* op, std::initializer_list<const Array*> arrays) {
  const Array* first = nullptr;
  for (const Array* a : arrays) {
    if (!a->defined()) continue;
    if (!first)
      first = a;
    else if (!(a->device() == first->device()))
      throw InvalidInput(std::string(op) + ": arrays on " + first->device().str() + " and " + a->device().str());
  }
  return first && !first->device().is_cpu();
}

}  // namespace osprey::ops::detail
