#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace osprey {

// q8_0 and fp8_e4m3 are packed row formats of the KV cache (kv/kv_cache.h): an array of one is
// bytes, its last dimension the bytes of a row (packed_row_width), never an element count.
//   q8_0: per 32 elements one block of 34 bytes: the f16 scale d, then 32 int8 q (x = d * q),
//     as llama.cpp's block_q8_0.
//   fp8_e4m3: a float32 scale s, then one OCP e4m3 (e4m3fn) code per element (x = s * e4m3).
enum class DType : uint8_t { f32, f16, bf16, i32, u32, i64, i16, u16, i8, u8, boolean, q8_0, fp8_e4m3 };

size_t dtype_size(DType dt);
const char* dtype_name(DType dt);
// safetensors spelling ("F32", "BF16", ...); nullopt for a name Osprey does not know.
std::optional<DType> dtype_from_safetensors(std::string_view name);
inline bool is_float(DType dt) { return dt == DType::f32 || dt == DType::f16 || dt == DType::bf16; }
inline bool is_packed_rows(DType dt) { return dt == DType::q8_0 || dt == DType::fp8_e4m3; }
// The last dimension of an array of `dt` holding rows of n elements: n for an element type; the
// bytes of a packed row (q8_0: n / 32 * 34, n a multiple of 32; fp8_e4m3: 4 + n).
int64_t packed_row_width(DType dt, int64_t n);

}  // namespace osprey
