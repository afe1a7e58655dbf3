#include "core/dtype.h"

namespace osprey {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::f32: case DType::i32: case DType::u32: return 4;
    case DType::f16: case DType::bf16: case DType::i16: case DType::u16: return 2;
    case DType::i64: return 8;
    case DType::i8: case DType::u8: case DType::boolean: return 1;
  }
  return 0;
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::i32: return "int32";
    case DType::u32: return "uint32";
    case DType::i64: return "int64";
    case DType::i16: return "int16";
    case DType::u16: return "uint16";
    case DType::i8: return "int8";
    case DType::u8: return "uint8";
    case DType::boolean: return "bool";
  }
  return "?";
}

std::optional<DType> dtype_from_safetensors(std::string_view n) {
  if (n == "F32") return DType::f32;
  if (n == "F16") return DType::f16;
  if (n == "BF16") return DType::bf16;
  if (n == "I32") return DType::i32;
  if (n == "U32") return DType::u32;
  if (n == "I64") return DType::i64;
  if (n == "I16") return DType::i16;
  if (n == "U16") return DType::u16;
  if (n == "I8") return DType::i8;
  if (n == "U8") return DType::u8;
  if (n == "BOOL") return DType::boolean;
  return std::nullopt;
}

}  // namespace osprey
