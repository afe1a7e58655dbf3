#include "model/linear_group.h"

#include "backend/ops.h"
#include "backend/quant.h"
#include "core/error.h"
#include "formats/quant_method.h"

namespace osprey {
namespace {

// Whether the parts may be stacked: one input width, and what the first part's method asks of
// the others' payloads (the same storage kind, dtype, bits, group size, scale groups or input
// order; GGUF's block types of one affine setting stack, their payload being one).
bool same_storage(const std::vector<LinearWeight>& parts) {
  const LinearWeight& p0 = parts[0];
  const QuantMethod& method = method_of(p0);
  for (const LinearWeight& p : parts)
    if (p.in_features() != p0.in_features() || !method.stacks_with(p0, p)) return false;
  return true;
}

Array stack_biases(const std::vector<Array>& parts) {
  int64_t n_defined = 0, total = 0;
  for (const Array& b : parts) n_defined += b.defined() ? 1 : 0;
  if (n_defined == 0) return {};
  if (n_defined != int64_t(parts.size()))
    throw InvalidInput("linear group: some stacked layers have a bias and some do not");
  std::vector<Array> rows;
  for (const Array& b : parts) {
    rows.push_back(b.reshape({b.numel(), 1}));
    total += b.numel();
  }
  return stack_rows(rows).reshape({total});
}

}  // namespace

void stack_linear_group(LinearGroup& group) {
  if (group.parts.size() < 2 || !same_storage(group.parts)) return;
  group.stacked = method_of(group.parts[0]).stack(group.parts);
  group.stacked_bias = stack_biases(group.biases);
  group.parts.clear();
  group.biases.clear();
}

}  // namespace osprey
