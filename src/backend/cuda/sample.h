#pragma once
// Stochastic token choice on the device (temperature, top-k, top-p, min-p), so that the token
// of a pipelined decode step never visits the host. Internal header (CUDA types): only
// src/backend/cuda and the ops dispatch include it. Greedy decoding uses argmax (kernels.h).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/kernel_args.h"

namespace osprey::cuda {

using osprey::SampleArgs;  // backend/kernel_args.h

// The largest vocabulary sample() takes (its fixed-point mass sums stay below 2^63).
constexpr int64_t kSampleMaxVocab = int64_t(1) << 23;

// Bytes of scratch() that sample() uses for `vocab` logits: size scratch() with it before a
// graph capture, so that no call inside the capture grows it.
size_t sample_scratch_bytes(int64_t vocab);

// sample() itself: op_list.inc, with its contract.

}  // namespace osprey::cuda
