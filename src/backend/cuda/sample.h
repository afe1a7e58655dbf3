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

// logits [vocab] f32 (not modified) -> *out_token (device memory): a draw from
// softmax(logits / T) restricted to the kept set. NaN logits are never drawn.
//
// The kept set is {i : logits[i] >= t}, t the largest of the active cut values below. Each cut
// value is itself a logit, so every logit tied with a cut value is kept (top-k may then keep
// more than k).
//   top-k: the k-th largest non-NaN logit, counting repeats (when 0 < k < the non-NaN count).
//   top-p: over the top-k set K (all non-NaN logits when top-k is off), with weights
//          w_i = exp((logits[i] - max) / T): the largest logit value v whose mass
//          sum{w_i : i in K, logits[i] >= v} reaches top_p * sum{w_i : i in K}.
//          Weights are computed in f32 and summed in 2^-40 fixed point, so the cut is exact
//          up to ~1e-6 relative changes of the mass; the sums are associative, so the result
//          does not depend on the order in which blocks finish.
//   min-p: logits[i] == max or double(logits[i]) - max >= double(T) * log(double(min_p)), i.e.
//          w_i >= min_p (log taken on the host).
// The draw is Gumbel-max: out = argmax over the kept set of
// double(logits[i]) / double(T) + noise_gumbel(seed, counter, i), the lowest index winning a
// tie, which samples the renormalised softmax over the kept set exactly (up to the 2^-52 grid
// of the noise). The same (logits, args) always give the same token.
// Rows without a finite maximum: +inf logits are kept above everything and the lowest-index
// +inf is drawn; when no logit exceeds -inf, the lowest-index -inf logit (0 when all are NaN).
//
// Work: a pass computing the maximum, three histogram passes (11, 11, 10 bits of the
// order-preserving key of each logit) for each of top-k and top-p when active, and the draw;
// passes after a cut is settled return at once. Scratch: sample_scratch_bytes(vocab).
// Throws InvalidInput naming the field for an argument out of range, Unsupported for vocab
// above kSampleMaxVocab.
void sample(const float* logits, int64_t vocab, const SampleArgs& a, int32_t* out_token, cudaStream_t s);

}  // namespace osprey::cuda
