#pragma once
// GGUF files (the format of llama.cpp and ollama), versions 2 and 3, little-endian: the
// metadata key/value pairs and the tensor table, read from a memory map. Tensors are never
// copied: a tensor's bytes are a view into the mapping, which lives as long as any view.
//
// Hostile input: every count, length, offset and dimension is checked against the file's
// size before it is used; no allocation is sized by a field before that check; strings are
// bounded by the bytes left in the file. Errors (InvalidInput, Unsupported for a version or
// tensor type Osprey does not read) name the file and the key or tensor at fault.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/array.h"

namespace osprey {

class MappedFile;

// Metadata value types, as the format numbers them.
enum class GgufValueType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9,
  u64 = 10, i64 = 11, f64 = 12,
};
const char* gguf_value_type_name(GgufValueType t);

// Tensor types, as ggml numbers them (the ids of removed types are not listed).
enum class GgufType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9, Q2_K = 10, Q3_K = 11,
  Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19,
  IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28,
  IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

// A type's block: `elements` consecutive values of a row stored in `bytes` bytes.
struct GgufBlock {
  int64_t elements = 0;
  int64_t bytes = 0;
};
// nullopt for an id that names no type.
std::optional<GgufBlock> gguf_block(uint32_t type);
// "Q4_K", or "type 99" for an id that names no type.
std::string gguf_type_name(uint32_t type);
// The Osprey dtype a tensor type is read as without conversion (F32, F16, BF16, I8, I16, I32,
// I64); nullopt for a block-quantized type or F64.
std::optional<DType> gguf_dense_dtype(GgufType type);

// One metadata value. Scalars are held decoded; strings and arrays are views into the
// mapping (checked at open: they lie within the file).
struct GgufValue {
  GgufValueType type = GgufValueType::u8;
  uint64_t u = 0;          // u8/u16/u32/u64, and bool (0 or 1)
  int64_t i = 0;           // i8/i16/i32/i64
  double f = 0;            // f32/f64
  std::string_view s;      // string
  GgufValueType elem = GgufValueType::u8;  // array: element type (never array)
  uint64_t count = 0;      // array: number of elements
  const uint8_t* data = nullptr;  // array: the first element
  size_t nbytes = 0;       // array: bytes of the elements
};

struct GgufTensorInfo {
  std::string name;
  GgufType type = GgufType::F32;
  Shape shape;              // row-major, outermost first: GGUF's ne[] reversed
  size_t byte_offset = 0;   // absolute, within the file
  size_t nbytes = 0;
};

class GgufFile {
 public:
  // Throws IoError (unreadable file) or InvalidInput / Unsupported as above.
  static GgufFile open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }

  // Metadata. The typed getters throw InvalidInput naming the file and key when the key is
  // missing or its value has another type (integers of any width convert when the value
  // fits the requested type; floats read f32 or f64).
  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  const GgufValue* find(const std::string& key) const;
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  std::string get_string(const std::string& key) const;
  uint64_t get_uint(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  // Arrays: of strings, of integers (any integer element type), of floats (f32 or f64).
  std::vector<std::string_view> get_string_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  std::vector<float> get_float_array(const std::string& key) const;
  // The number of elements of an array value (InvalidInput when not an array).
  uint64_t array_size(const std::string& key) const;

  // Tensors, in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // nullptr when the file holds no tensor of that name.
  const GgufTensorInfo* tensor(const std::string& name) const;
  // A CPU array over the tensor's bytes in the mapping: its dense dtype and shape for
  // F32/F16/BF16/I8/I16/I32/I64, else u8 [rows..., row bytes] (the blocks as stored).
  Array tensor_array(const GgufTensorInfo& info) const;
  const std::shared_ptr<MappedFile>& file() const { return file_; }
  // The buffer over the whole mapping (owns nothing; keeps the mapping alive).
  const std::shared_ptr<Buffer>& buffer() const { return buffer_; }

 private:
  std::string fail_where(const std::string& key) const;

  std::filesystem::path path_;
  std::shared_ptr<MappedFile> file_;
  std::shared_ptr<Buffer> buffer_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
};

}  // namespace osprey
