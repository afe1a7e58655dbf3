#include "engine/decode_stepper.h"

#include "backend/fault_injection.h"
#include "backend/graph.h"
#include "backend/ops.h"
#include "core/log.h"
#include "model/model.h"

namespace osprey {

DecodeStepper::DecodeStepper(Model& model, SequenceCache& cache, const DecodeStepperOptions& options)
    : model_(model), cache_(cache), replay_(cache), options_(options) {
  const Device dev = model.info().device;
  token_ = Array::empty({1}, DType::i32, dev);
  position_ = Array::empty({1}, DType::i32, dev);
  ops::fill_i32_(token_, 0);
  ops::fill_i32_(position_, 0);
  if (dev.is_cpu() || !model.replayable_step()) options_.graphs = false;
}

DecodeStepper::~DecodeStepper() = default;

const Array& DecodeStepper::step() {
  const Device dev = model_.info().device;
  fault_injection_decode_step(dev);
  ops::fill_i32_(position_, int32_t(cache_.offset()));
  if (options_.graphs && replay_.next_write_in_place()) {
    if (graph_ && graph_memory_generation_ == CapturedGraph::memory_generation(dev) &&
        replay_.has_buffers(graph_key_)) {
      graph_->replay();
      replay_.commit_replayed_write();
      ++n_replays_;
      return logits_;
    }
    if (replay_.has_buffers(warm_key_)) {
      // The previous step ran in place over these buffers, so every scratch buffer this step
      // needs has its size already: capture it, then run it.
      graph_.reset();
      Array out;
      graph_ = CapturedGraph::capture(dev, [&] { out = model_.forward(token_, position_, cache_, false); });
      graph_key_ = replay_.buffers();
      graph_memory_generation_ = CapturedGraph::memory_generation(dev);
      logits_ = out;
      graph_->replay();
      ++n_captures_;
      log_debug("decode graph captured at position " + std::to_string(cache_.offset() - 1));
      return logits_;
    }
  }
  const bool inplace = replay_.next_write_in_place();
  logits_ = model_.forward(token_, position_, cache_, false);
  warm_key_ = inplace ? replay_.buffers() : std::vector<const void*>();
  return logits_;
}

}  // namespace osprey
