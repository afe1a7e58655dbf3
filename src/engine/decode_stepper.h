#pragma once
// Decode steps of one sequence, the way the device runs them best (docs/design.md, "Graph
// capture and replay").
//
// The step's input token and position live in device arrays owned here, so that on CUDA a
// step can be captured once as a graph and replayed: the batch-1 step is captured on the
// second consecutive in-place step over the same cache buffers (the first sizes every scratch
// buffer) and replayed while the cache keeps those buffers; a copying write, a growth or a
// restored cache runs eagerly. On the CPU every step runs eagerly.
#include <cstdint>
#include <memory>
#include <vector>

#include "core/array.h"
#include "kv/replay.h"

namespace osprey {

class Model;
class SequenceCache;
class CapturedGraph;

struct DecodeStepperOptions {
  bool graphs = true;  // OSPREY_CUDA_GRAPHS; ignored on the CPU
};

class DecodeStepper {
 public:
  DecodeStepper(Model& model, SequenceCache& cache, const DecodeStepperOptions& options);
  ~DecodeStepper();

  // The next step's input token: [1] i32 on the model's device. Write it (e.g. a device
  // sampler's output, or ops::fill_i32_) before step().
  Array& token() { return token_; }

  // Enqueues one decode step of token() at position cache.offset() and returns its logits,
  // [1, vocab] f32 on the model's device, valid until the next step.
  const Array& step();

  uint64_t n_graph_replays() const { return n_replays_; }
  uint64_t n_graph_captures() const { return n_captures_; }

 private:
  Model& model_;
  SequenceCache& cache_;
  SequenceReplay replay_;  // the caches' graph-replay hooks
  DecodeStepperOptions options_;
  Array token_;     // [1] i32
  Array position_;  // [1] i32
  Array logits_;
  std::unique_ptr<CapturedGraph> graph_;
  std::vector<const void*> graph_key_;  // the cache buffers the graph writes into
  uint64_t graph_memory_generation_ = 0;
  std::vector<const void*> warm_key_;   // the buffers of the last eager in-place step
  uint64_t n_replays_ = 0, n_captures_ = 0;
};

}  // namespace osprey
