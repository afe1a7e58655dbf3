#pragma once
// The CUDA backend as the op dispatch (backend/ops.cpp, quant_ops.cpp, readback.cpp) calls it:
// the entry points of op_list.inc, declared without CUDA types so that the dispatch files
// include this header in every build. Each op enqueues its work on the current device's
// stream unless it says it waits. Implemented in cuda_ops.cpp with the backend; a build
// without it links backend/cuda_stub.cpp instead, whose functions throw Unsupported (no array
// can live on a CUDA device there, so the dispatch never reaches them).
#include <cstddef>
#include <cstdint>

#include "backend/kernel_args.h"
#include "backend/quant_args.h"
#include "core/dtype.h"

namespace osprey::cuda_ops {

struct TokenSlots;  // pinned host slots for token readback (cuda_ops.cpp)

#define OSPREY_CUDA_OP(name, params, args) void name params;
#define OSPREY_CUDA_ENTRY(ret, name, params) ret name params;
#include "backend/cuda/op_list.inc"
#undef OSPREY_CUDA_OP
#undef OSPREY_CUDA_ENTRY

}  // namespace osprey::cuda_ops
