#include "model/linear_group.h"

#include "backend/ops.h"
#include "backend/quant.h"
#include "core/error.h"

namespace osprey {
namespace {

// The arrays' rows stacked into a new array on their device (same dtype and row width).
Array stack_rows(const std::vector<Array>& parts) {
  int64_t rows = 0;
  for (const Array& a : parts) rows += a.dim(0);
  Array out = Array::empty({rows, parts[0].dim(1)}, parts[0].dtype(), parts[0].device());
  int64_t at = 0;
  for (const Array& a : parts) {
    ops::copy_into(out.slice_rows(at, at + a.dim(0)), a);
    at += a.dim(0);
  }
  return out;
}

bool same_storage(const std::vector<LinearWeight>& parts) {
  const LinearWeight& p0 = parts[0];
  for (const LinearWeight& p : parts) {
    if (p.quantized() != p0.quantized() || p.fp8.defined() != p0.fp8.defined() || p.in_features() != p0.in_features())
      return false;
    // One input order for all of them (the loader shares equal orders' array).
    if (p.in_perm.defined() != p0.in_perm.defined() || (p.in_perm.defined() && p.in_perm.raw() != p0.in_perm.raw()))
      return false;
    if (p.quantized()) {
      if (p.quant.bits != p0.quant.bits || p.quant.group_size != p0.quant.group_size ||
          p.quant.scales.dtype() != p0.quant.scales.dtype() || !p.quant.packed.is_contiguous())
        return false;
    } else if (p.fp8.defined()) {
      if (p.fp8.scales.dim(1) != p0.fp8.scales.dim(1) || !p.fp8.codes.is_contiguous() ||
          p.fp8.fp8_activations != p0.fp8.fp8_activations)
        return false;
    } else if (p.dense.dtype() != p0.dense.dtype() || !p.dense.is_contiguous()) {
      return false;
    }
  }
  return true;
}

LinearWeight stack_weights(const std::vector<LinearWeight>& parts) {
  LinearWeight f;
  f.in_perm = parts[0].in_perm;
  if (parts[0].quantized()) {
    std::vector<Array> packed, scales, biases;
    for (const LinearWeight& p : parts) {
      packed.push_back(p.quant.packed);
      scales.push_back(p.quant.scales);
      biases.push_back(p.quant.biases);
    }
    f.quant.packed = stack_rows(packed);
    f.quant.scales = stack_rows(scales);
    f.quant.biases = stack_rows(biases);
    f.quant.bits = parts[0].quant.bits;
    f.quant.group_size = parts[0].quant.group_size;
    ops::repack_for_cpu(f.quant);
  } else if (parts[0].fp8.defined()) {
    std::vector<Array> codes, scales;
    for (const LinearWeight& p : parts) {
      codes.push_back(p.fp8.codes);
      scales.push_back(p.fp8.scales);
    }
    f.fp8.codes = stack_rows(codes);
    f.fp8.scales = stack_rows(scales);
    f.fp8.fp8_activations = parts[0].fp8.fp8_activations;
  } else {
    std::vector<Array> dense;
    for (const LinearWeight& p : parts) dense.push_back(p.dense);
    f.dense = stack_rows(dense);
  }
  return f;
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
  group.stacked = stack_weights(group.parts);
  group.stacked_bias = stack_biases(group.biases);
  group.parts.clear();
  group.biases.clear();
}

}  // namespace osprey
