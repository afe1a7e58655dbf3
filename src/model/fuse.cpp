#include "model/fuse.h"

#include "backend/ops.h"
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

}  // namespace

LinearWeight fuse_rows(const std::vector<const LinearWeight*>& parts) {
  if (parts.size() < 2) return {};
  const LinearWeight& p0 = *parts[0];
  if (p0.quantized() ? p0.quant.device().is_cpu() : p0.dense.device().is_cpu()) return {};
  for (const LinearWeight* p : parts) {
    if (p->quantized() != p0.quantized() || p->in_features() != p0.in_features()) return {};
    if (p->quantized()) {
      if (p->quant.bits != p0.quant.bits || p->quant.group_size != p0.quant.group_size ||
          p->quant.scales.dtype() != p0.quant.scales.dtype() || !p->quant.packed.is_contiguous())
        return {};
    } else if (p->dense.dtype() != p0.dense.dtype() || !p->dense.is_contiguous()) {
      return {};
    }
  }
  LinearWeight f;
  if (p0.quantized()) {
    std::vector<Array> packed, scales, biases;
    for (const LinearWeight* p : parts) {
      packed.push_back(p->quant.packed);
      scales.push_back(p->quant.scales);
      biases.push_back(p->quant.biases);
    }
    f.quant.packed = stack_rows(packed);
    f.quant.scales = stack_rows(scales);
    f.quant.biases = stack_rows(biases);
    f.quant.bits = p0.quant.bits;
    f.quant.group_size = p0.quant.group_size;
  } else {
    std::vector<Array> dense;
    for (const LinearWeight* p : parts) dense.push_back(p->dense);
    f.dense = stack_rows(dense);
  }
  return f;
}

Array fuse_biases(const std::vector<const Array*>& parts) {
  int64_t n_defined = 0, total = 0;
  for (const Array* b : parts) n_defined += b->defined() ? 1 : 0;
  if (n_defined == 0) return {};
  if (n_defined != int64_t(parts.size()))
    throw InvalidInput("fuse_biases: some fused layers have a bias and some do not");
  std::vector<Array> rows;
  for (const Array* b : parts) {
    rows.push_back(b->reshape({b->numel(), 1}));
    total += b->numel();
  }
  return stack_rows(rows).reshape({total});
}

}  // namespace osprey
