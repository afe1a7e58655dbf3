#pragma once
// The seam through which a family gives a decoder layer another feed-forward block than the
// decoder's own gated MLP (a mixture of experts, model/moe.h). The decoder keeps computing
// attention, norms and the residual stream; for such a layer it calls the block where it
// would call the MLP (docs/design.md, "How a family is written").
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/array.h"

namespace osprey {

class WeightLoader;

class FeedForward {
 public:
  virtual ~FeedForward() = default;
  // h [n, hidden] f32 (the layer's normed input) on the model's device -> [n, hidden] f32 on
  // the same device: what the layer adds to its residual stream.
  virtual Array forward(const Array& h) const = 0;
  // Whether a step that runs forward() can be recorded once and replayed (Model::
  // replayable_step): false for a block that reads values back to the host to decide what to
  // run (which experts a token goes to).
  virtual bool replayable() const = 0;
};

// What a block's loader gets for one layer.
struct FeedForwardContext {
  WeightLoader& weights;
  std::string prefix;  // the layer's tensor names begin so: "model.layers.3."
  int64_t layer = 0;
  int64_t hidden = 0;
  DType dtype = DType::bf16;  // the checkpoint's weight type (its embedding table's)
};

// Loads layer `c.layer`'s block, or returns null for a layer with the decoder's gated MLP of
// intermediate_size. Called once per layer, in order, while the decoder loads.
using FeedForwardLoader = std::function<std::unique_ptr<FeedForward>(const FeedForwardContext& c)>;

}  // namespace osprey
