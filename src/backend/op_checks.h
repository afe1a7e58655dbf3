#pragma once
// Internal to the op dispatch files (backend/ops.cpp, backend/quant_ops.cpp): argument checks
// and the CUDA branch selector.
#include <initializer_list>
#include <string>

#include "core/array.h"
#include "core/error.h"

#ifdef OSPREY_WITH_CUDA
#define OSPREY_CUDA_BRANCH(cond) if (cond)
#else
// Without the backend no array can live on a CUDA device, so the branch is never taken.
#define OSPREY_CUDA_BRANCH(cond) if (static_cast<void>(cond), false)
#endif

namespace osprey::ops::detail {

inline void require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw InvalidInput(std::string(op) + ": " + what);
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
