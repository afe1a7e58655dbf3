#include "core/dtype.h"

#include <iterator>

namespace osprey {
namespace {

struct DTypeRow {
  DType dtype;
  size_t size;              // bytes per element
  const char* name;         // as torch and numpy print it
  const char* safetensors;  // the header's spelling
};

// One row per DType, in the enum's order.
constexpr DTypeRow kDTypes[] = {
    {DType::f32, 4, "float32", "F32"}, {DType::f16, 2, "float16", "F16"}, {DType::bf16, 2, "bfloat16", "BF16"},
    {DType::i32, 4, "int32", "I32"},   {DType::u32, 4, "uint32", "U32"},  {DType::i64, 8, "int64", "I64"},
    {DType::i16, 2, "int16", "I16"},   {DType::u16, 2, "uint16", "U16"},  {DType::i8, 1, "int8", "I8"},
    {DType::u8, 1, "uint8", "U8"},     {DType::boolean, 1, "bool", "BOOL"},
    // Packed rows (bytes); no safetensors spelling.
    {DType::q8_0, 1, "q8_0", ""},      {DType::fp8_e4m3, 1, "fp8_e4m3", ""},
};

constexpr bool rows_in_enum_order() {
  for (size_t i = 0; i < std::size(kDTypes); ++i)
    if (size_t(kDTypes[i].dtype) != i) return false;
  return std::size(kDTypes) == size_t(DType::fp8_e4m3) + 1;
}
static_assert(rows_in_enum_order(), "kDTypes holds one row per DType, in the enum's order");

const DTypeRow* row(DType dt) { return size_t(dt) < std::size(kDTypes) ? &kDTypes[size_t(dt)] : nullptr; }

}  // namespace

size_t dtype_size(DType dt) {
  const DTypeRow* r = row(dt);
  return r ? r->size : 0;
}

const char* dtype_name(DType dt) {
  const DTypeRow* r = row(dt);
  return r ? r->name : "?";
}

std::optional<DType> dtype_from_safetensors(std::string_view n) {
  for (const DTypeRow& r : kDTypes)
    if (*r.safetensors && n == r.safetensors) return r.dtype;
  return std::nullopt;
}

int64_t packed_row_width(DType dt, int64_t n) {
  switch (dt) {
    case DType::q8_0: return n / 32 * 34;
    case DType::fp8_e4m3: return 4 + n;
    default: return n;
  }
}

}  // namespace osprey
