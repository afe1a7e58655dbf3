#pragma once
// Linear layers that read one input (q/k/v; gate/up). WeightLoader::linear_group loads them
// and, when the backend declares that it runs them faster so (ops::DeviceTraits), stacks
// their rows into one weight so that a decode step streams them in one kernel. Families use
// them through model/blocks.h and never see which form they got.
#include <vector>

#include "backend/quant.h"

namespace osprey {

struct LinearGroup {
  // The parts as loaded ([out_i, in] each, with f32 [out_i] biases or all undefined); empty
  // once stacked.
  std::vector<LinearWeight> parts;
  std::vector<Array> biases;
  // The parts' rows stacked in order, [sum out_i, in], and their biases [sum out_i].
  LinearWeight stacked;
  Array stacked_bias;
  std::vector<int64_t> outs;  // out_i of each part

  bool is_stacked() const { return stacked.defined(); }
};

// Stacks `group`'s parts into one weight on their device when their quantization method stacks
// them (formats/quant_method.h, QuantMethod::stacks_with: one method, the same input width and
// storage settings), dropping the parts; otherwise leaves the group as it is. Throws InvalidInput when only some parts
// have a bias.
void stack_linear_group(LinearGroup& group);

}  // namespace osprey
