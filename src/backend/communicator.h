#pragma once
// Tensor parallelism's collectives (docs/design.md, "Tensor parallelism"): the ranks of one
// model each hold a slice of its weights and meet at two points per layer (a sum of partial
// activations) and once at the head (the vocabulary slices of the logits gathered). One
// interface, two implementations: N ranks as N threads of one process sharing memory (the
// CPU, where it tests the sharding), and NCCL (one thread and stream per GPU).
#include <cstdint>
#include <memory>
#include <vector>

#include "core/array.h"

namespace osprey {

// Which slice of the model a rank holds.
struct ShardSpec {
  int rank = 0;
  int size = 1;
  bool sharded() const { return size > 1; }
};

// Rows [begin, end) of `n` that `rank` of `size` holds when n need not divide evenly: the
// first n % size ranks hold one row more (the head's vocabulary split).
struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t count() const { return end - begin; }
};
ShardRange shard_range(int64_t n, const ShardSpec& shard);

// One rank's end of a group of `size()` ranks. Every collective is called by every rank of
// the group, in the same order, each from its own thread; a call returns once this rank's
// result is complete (on CUDA: once it is enqueued on the rank's stream, where it runs in
// order with the rank's other work, so that a captured decode step includes it).
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  ShardSpec shard() const { return {rank(), size()}; }

  // x (f32, contiguous, on the rank's device, the same shape on every rank) becomes the
  // element-wise sum of every rank's x. The CPU sums in rank order (rank 0 + rank 1 + ...),
  // so every rank gets the same bits and a run repeats exactly.
  virtual void all_reduce_sum_(Array& x) = 0;
  // x [rows, w_r] f32 contiguous, where w_r = shard_range(total, {r, size}).count() ->
  // [rows, total]: the ranks' columns side by side in rank order, on every rank.
  virtual Array all_gather_cols(const Array& x, int64_t total) = 0;
  // Returns once every rank has called it (the CPU); orders the ranks' streams (NCCL).
  virtual void barrier() = 0;
};

// N ranks of one process (one thread each) that meet through shared memory. Throws
// InvalidInput for n < 1.
std::vector<std::unique_ptr<Communicator>> make_cpu_communicators(int n);

// Whether this build has the NCCL communicator (CMake found nccl.h and libnccl).
bool nccl_available();
// One communicator per CUDA device in `devices` (ncclCommInitAll), rank i on devices[i].
// Throws Unsupported naming the cause in a build without NCCL.
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(const std::vector<int>& devices);

}  // namespace osprey
