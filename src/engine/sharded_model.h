#pragma once
// A tensor-parallel model (docs/design.md, "Tensor parallelism"): N rank models, each with a
// slice of the weights and its own K/V heads, run on N threads that meet through a
// Communicator. To the engine it is one Model: forward() returns the full vocabulary's
// logits (rank 0's gathered copy, on rank 0's device), and make_cache() one SequenceCache
// holding every rank's layers, so that trimming, snapshots and the ownership guard work per
// rank and unchanged.
#include <filesystem>
#include <memory>

#include "model/model.h"

namespace osprey {

// Loads `dir` as `n_ranks` ranks on options.device: on the CPU, n_ranks threads of this
// process sharing memory (a check of the sharding, not a speed-up: the ranks share the same
// cores and memory bandwidth); on CUDA, devices options.device.index .. + n_ranks - 1 over
// NCCL. n_ranks == 1 is load_model() itself. Throws InvalidInput for n_ranks < 1, a count
// that does not divide the model's heads (named), or too few CUDA devices; Unsupported for a
// family that does not shard yet, or CUDA without NCCL in this build.
std::unique_ptr<Model> load_sharded_model(const std::filesystem::path& dir, int n_ranks,
                                          const LoadOptions& options = {});

}  // namespace osprey
