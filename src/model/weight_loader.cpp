#include "model/weight_loader.h"

#include "backend/ops.h"
#include "core/error.h"
#include "model/safetensors.h"

namespace osprey {

WeightLoader::WeightLoader(const SafeTensors& weights, const LoadOptions& options)
    : weights_(weights), options_(options), total_(weights.total_bytes()) {}

void WeightLoader::touch(const Array& a) {
  // Fault the mapped pages in now, so the first forward pass is not the one that reads the
  // file, and so progress reflects the real reading.
  const auto* p = static_cast<const volatile uint8_t*>(a.raw());
  uint8_t sink = 0;
  for (size_t i = 0; i < a.nbytes(); i += 4096) sink ^= p[i];
  (void)sink;
  done_ += a.nbytes();
  if (options_.progress) options_.progress(done_, total_);
}

Array WeightLoader::matrix(const std::string& name, int64_t rows, int64_t cols, std::optional<DType> dtype) {
  const TensorInfo& ti = weights_.info(name);
  if (!is_float(ti.dtype))
    throw InvalidInput("tensor " + name + " is " + dtype_name(ti.dtype) + ti.shape.str() +
                       ", but a float matrix (float32, float16 or bfloat16) is expected");
  Array a = weights_.get(name, dtype.value_or(ti.dtype), {rows, cols});
  touch(a);
  return ops::to_device(a, options_.device);  // on the CPU: the mapped array itself
}

Array WeightLoader::vector_f32(const std::string& name, int64_t n) {
  const TensorInfo& ti = weights_.info(name);
  if (!is_float(ti.dtype))
    throw InvalidInput("tensor " + name + " is " + dtype_name(ti.dtype) + ti.shape.str() + ", but a float vector is expected");
  Array a = weights_.get(name, ti.dtype, {n});
  touch(a);
  return ops::to_device(ops::cast(a, DType::f32), options_.device);
}

void WeightLoader::finish() {
  if (options_.progress) options_.progress(total_, total_);
}

}  // namespace osprey
