#pragma once
// Array: a ref-counted handle to a buffer plus dtype, shape, strides, a byte offset and a
// unique identity. Copying an Array copies the handle (same identity); every array made by
// an op or a view gets a new identity, from a 64-bit counter that never repeats.
#include <cstdint>
#include <memory>
#include <span>

#include "core/buffer.h"
#include "core/dtype.h"
#include "core/shape.h"

namespace osprey {

class Array {
 public:
  Array() = default;

  // Uninitialised, contiguous, from the device's allocator.
  static Array empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Array zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  // A contiguous array over `buffer` starting at `byte_offset`.
  static Array from_buffer(std::shared_ptr<Buffer> buffer, size_t byte_offset, const Shape& shape, DType dtype);
  // A strided view over `buffer` (strides in elements).
  static Array strided(std::shared_ptr<Buffer> buffer, size_t byte_offset, const Shape& shape, const Shape& strides,
                       DType dtype);

  bool defined() const { return impl_ != nullptr; }
  uint64_t id() const;
  DType dtype() const;
  const Shape& shape() const;
  const Shape& strides() const;  // in elements
  int ndim() const { return shape().n; }
  int64_t dim(int i) const { return shape()[i]; }
  int64_t numel() const { return shape().numel(); }
  size_t itemsize() const { return dtype_size(dtype()); }
  size_t nbytes() const { return size_t(numel()) * itemsize(); }
  bool is_contiguous() const;
  Device device() const;
  const std::shared_ptr<Buffer>& buffer() const;
  size_t byte_offset() const;

  void* raw() const;  // the first element
  template <typename T>
  T* data() const { return static_cast<T*>(raw()); }

  // A contiguous reshape (same buffer, new identity). Throws unless contiguous and same numel.
  Array reshape(const Shape& shape) const;
  // Rows [begin, end) of the first dimension (same buffer, new identity).
  Array slice_rows(int64_t begin, int64_t end) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// A human description for errors and logs: "bfloat16[2, 3]".
std::string describe(const Array& a);

// A host i32 array [ids.size()] holding `ids` (token ids, positions).
Array host_i32(std::span<const int32_t> ids);

}  // namespace osprey
