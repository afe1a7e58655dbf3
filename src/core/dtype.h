#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace osprey {

enum class DType : uint8_t { f32, f16, bf16, i32, u32, i64, i16, u16, i8, u8, boolean };

size_t dtype_size(DType dt);
const char* dtype_name(DType dt);
// safetensors spelling ("F32", "BF16", ...); nullopt for a name Osprey does not know.
std::optional<DType> dtype_from_safetensors(std::string_view name);
inline bool is_float(DType dt) { return dt == DType::f32 || dt == DType::f16 || dt == DType::bf16; }

}  // namespace osprey
