#pragma once
// Makes a family's weight arrays from a checkpoint, once, at load: checks each tensor's
// dtype and shape against what the config implies (errors name the tensor), places it on
// the target device, and reports progress.
#include <optional>
#include <string>

#include "core/array.h"
#include "model/model.h"

namespace osprey {

class SafeTensors;

class WeightLoader {
 public:
  WeightLoader(const SafeTensors& weights, const LoadOptions& options);

  // A [rows, cols] float matrix (f32, f16 or bf16); `dtype`, when given, must match too.
  // On the CPU the array points into the memory map (zero copy); on CUDA it is uploaded once.
  Array matrix(const std::string& name, int64_t rows, int64_t cols, std::optional<DType> dtype = std::nullopt);
  // A [n] float vector, converted to a float32 copy (norm weights, biases).
  Array vector_f32(const std::string& name, int64_t n);

  size_t bytes_loaded() const { return done_; }
  // Reports completion to the progress callback.
  void finish();

 private:
  void touch(const Array& a);

  const SafeTensors& weights_;
  const LoadOptions& options_;
  size_t total_ = 0;
  size_t done_ = 0;
};

}  // namespace osprey
