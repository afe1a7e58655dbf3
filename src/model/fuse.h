#pragma once
// Fusing linear layers that share an input (q/k/v, gate/up) into one weight with the rows
// stacked, so a decode step streams them in one kernel.
#include <vector>

#include "backend/quant.h"

namespace osprey {

// The weights' rows stacked in order, on their device, when that pays and is possible: a CUDA
// device (on the CPU the weights stay zero-copy views of the memory map), the same input
// width, and the same storage (dense dtype, or quantized bits, group size and scale dtype).
// Otherwise an undefined weight (callers keep the parts). The parts stay valid.
LinearWeight fuse_rows(const std::vector<const LinearWeight*>& parts);

// Biases of fused parts (f32 [out_i] each, or all undefined) stacked the same way.
Array fuse_biases(const std::vector<const Array*>& parts);

}  // namespace osprey
