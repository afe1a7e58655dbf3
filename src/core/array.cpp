#include "core/array.h"

#include <algorithm>

#include <atomic>
#include <cstring>

#include "core/checked.h"
#include "core/error.h"

namespace osprey {

Shape::Shape(std::initializer_list<int64_t> dims) {
  if (dims.size() > size_t(kMaxDims)) throw Unsupported("shape with more than 4 dimensions");
  for (int64_t v : dims) d[n++] = v;
}

int64_t Shape::numel() const {
  int64_t r = 1;
  for (int i = 0; i < n; ++i) r *= d[i];
  return r;
}

bool Shape::operator==(const Shape& o) const {
  if (n != o.n) return false;
  for (int i = 0; i < n; ++i)
    if (d[i] != o.d[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < n; ++i) {
    if (i) s += ", ";
    s += std::to_string(d[i]);
  }
  return s + "]";
}

namespace {
std::atomic<uint64_t> g_next_id{1};

Shape contiguous_strides(const Shape& shape) {
  Shape s;
  s.n = shape.n;
  int64_t acc = 1;
  for (int i = shape.n - 1; i >= 0; --i) {
    s.d[i] = acc;
    acc *= shape.d[i];
  }
  return s;
}
}  // namespace

struct Array::Impl {
  std::shared_ptr<Buffer> buffer;
  size_t byte_offset = 0;
  Shape shape;
  Shape strides;
  DType dtype = DType::f32;
  uint64_t id = 0;
};

Array Array::strided(std::shared_ptr<Buffer> buffer, size_t byte_offset, const Shape& shape, const Shape& strides,
                     DType dtype) {
  auto impl = std::make_shared<Impl>();
  impl->buffer = std::move(buffer);
  impl->byte_offset = byte_offset;
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = dtype;
  impl->id = g_next_id.fetch_add(1, std::memory_order_relaxed);
  Array a;
  a.impl_ = std::move(impl);
  return a;
}

Array Array::from_buffer(std::shared_ptr<Buffer> buffer, size_t byte_offset, const Shape& shape, DType dtype) {
  size_t need = byte_offset + size_t(shape.numel()) * dtype_size(dtype);
  if (buffer && need > buffer->size())
    throw InvalidInput("array of " + shape.str() + " " + dtype_name(dtype) + " exceeds its buffer");
  return strided(std::move(buffer), byte_offset, shape, contiguous_strides(shape), dtype);
}

Array Array::empty(const Shape& shape, DType dtype, Device device) {
  // Checked: a shape from a file or a flag must not wrap to a small allocation.
  uint64_t bytes = dtype_size(dtype);
  for (int i = 0; i < shape.n; ++i) {
    if (shape.d[i] < 0) throw InvalidInput("an array of " + shape.str() + " " + dtype_name(dtype) + ": negative dimension");
    const auto r = mul_u64(bytes, uint64_t(shape.d[i]));
    if (!r || *r > uint64_t(INT64_MAX))
      throw OutOfMemory(device.str() + ": an array of " + shape.str() + " " + dtype_name(dtype) +
                        " would need more than 2^63 bytes");
    bytes = *r;
  }
  return from_buffer(allocator_for(device).allocate(bytes), 0, shape, dtype);
}

Array Array::zeros(const Shape& shape, DType dtype, Device device) {
  if (!device.is_cpu()) throw Unsupported("Array::zeros on " + device.str());
  Array a = empty(shape, dtype, device);
  std::memset(a.raw(), 0, a.nbytes());
  return a;
}

Array host_i32(std::span<const int32_t> ids) {
  Array a = Array::empty({int64_t(ids.size())}, DType::i32);
  std::copy(ids.begin(), ids.end(), a.data<int32_t>());
  return a;
}

uint64_t Array::id() const { return impl_ ? impl_->id : 0; }
DType Array::dtype() const { return impl_->dtype; }
const Shape& Array::shape() const {
  static const Shape kEmpty;
  return impl_ ? impl_->shape : kEmpty;
}
const Shape& Array::strides() const { return impl_->strides; }
Device Array::device() const { return impl_->buffer ? impl_->buffer->device() : Device::cpu(); }
const std::shared_ptr<Buffer>& Array::buffer() const { return impl_->buffer; }
size_t Array::byte_offset() const { return impl_->byte_offset; }
void* Array::raw() const { return static_cast<char*>(impl_->buffer->data()) + impl_->byte_offset; }

bool Array::is_contiguous() const {
  // A dimension of size 1 is contiguous whatever its stride.
  const Shape& sh = impl_->shape;
  const Shape want = contiguous_strides(sh);
  for (int i = 0; i < sh.n; ++i)
    if (sh.d[i] != 1 && impl_->strides.d[i] != want.d[i]) return false;
  return true;
}

Array Array::reshape(const Shape& shape) const {
  if (!is_contiguous()) throw InvalidInput("reshape of a non-contiguous array " + describe(*this));
  if (shape.numel() != numel())
    throw InvalidInput("reshape " + describe(*this) + " to " + shape.str() + ": element counts differ");
  return from_buffer(impl_->buffer, impl_->byte_offset, shape, impl_->dtype);
}

Array Array::slice_rows(int64_t begin, int64_t end) const {
  if (begin < 0 || end > dim(0) || begin > end)
    throw InvalidInput("slice_rows [" + std::to_string(begin) + ", " + std::to_string(end) + ") of " + describe(*this));
  Shape s = impl_->shape;
  s.d[0] = end - begin;
  size_t off = impl_->byte_offset + size_t(begin * impl_->strides.d[0]) * itemsize();
  return strided(impl_->buffer, off, s, impl_->strides, impl_->dtype);
}

std::string describe(const Array& a) {
  if (!a.defined()) return "<undefined array>";
  return std::string(dtype_name(a.dtype())) + a.shape().str();
}

}  // namespace osprey
