// The dense method (formats/quant_method.h): a float32, float16 or bfloat16 `<prefix>.weight`
// [out, in], read as WeightLoader::matrix reads it, run by the dense linear and embedding ops.
#include "backend/ops.h"
#include "core/error.h"
#include "formats/quant_method.h"
#include "formats/safetensors.h"

namespace osprey {
namespace {

const Array& dense_of(const LinearWeight& w) { return *w.payload<Array>(); }

// Whether `prefix` is an MLX affine layer (its own file claims it) or a hub format's.
bool other_layout(const SafeTensors& st, const QuantConfig& quant, const std::string& prefix) {
  const std::string weight = prefix + ".weight";
  if (quant.hub.present() && st.contains(prefix + ".qweight")) return true;
  if (st.contains(weight) && (st.info(weight).float8_e4m3 || st.info(weight).dtype == DType::u32)) return true;
  return st.contains(prefix + ".scales") || st.contains(prefix + ".biases");
}

class DenseMethod final : public QuantMethod {
 public:
  const char* name() const override { return "dense"; }

  Array linear(const Array& x, const LinearWeight& w, const Array& bias) const override {
    return ops::linear(x, dense_of(w), bias);
  }
  Array embedding(const LinearWeight& table, const Array& ids, float scale) const override {
    return ops::embedding(dense_of(table), ids, scale);
  }
  int64_t out_features(const LinearWeight& w) const override { return dense_of(w).dim(0); }
  int64_t in_features(const LinearWeight& w) const override { return dense_of(w).dim(1); }
  size_t nbytes(const LinearWeight& w) const override { return dense_of(w).nbytes(); }
  DType value_dtype(const LinearWeight& w) const override { return dense_of(w).dtype(); }
  const void* storage(const LinearWeight& w) const override { return dense_of(w).raw(); }
  void release_table_pages(const LinearWeight& w) const override { ops::release_mapped_source(dense_of(w)); }

  bool claims(const SafeTensors& st, const QuantConfig& quant, const std::string& prefix) const override {
    return !other_layout(st, quant, prefix);
  }

  LinearWeight load(LinearLoader& loader, const LinearRequest& r) const override {
    const QuantConfig& quant = loader.quant();
    const std::string weight = r.prefix + ".weight";
    const TensorInfo& ti = loader.tensors().info(weight);
    if (auto it = quant.overrides.find(r.prefix); it != quant.overrides.end() && it->second)
      throw InvalidInput(quant.where + " says " + r.prefix + " is " + setting_str(*it->second) + ", but tensor " +
                         weight + " is " + tensor_str(ti) + " without .scales and .biases");
    return dense_weight(loader.matrix(weight, r.out, r.in, r.dtype, r.slice));
  }

  bool stacks_with(const LinearWeight& a, const LinearWeight& b) const override {
    return b.payload<Array>() && dense_of(b).dtype() == dense_of(a).dtype() && dense_of(b).is_contiguous() &&
           dense_of(b).dim(1) == dense_of(a).dim(1);
  }

  LinearWeight stack(const std::vector<LinearWeight>& parts) const override {
    std::vector<Array> rows;
    for (const LinearWeight& p : parts) rows.push_back(dense_of(p));
    return dense_weight(stack_rows(rows));
  }
};

}  // namespace

const QuantMethod& dense_method() {
  static const DenseMethod method;
  return method;
}

}  // namespace osprey
