// The KV cache's element types as the CLI names them (--cache-type-k, --cache-type-v), and what
// each device can store.
#include <string>

#include "core/error.h"
#include "kv/kv_cache.h"

namespace osprey {
namespace {

struct CacheTypeName {
  const char* name;
  DType dtype;
};
constexpr CacheTypeName kCacheTypes[] = {
    {"f16", DType::f16}, {"bf16", DType::bf16}, {"q8_0", DType::q8_0}, {"fp8", DType::fp8_e4m3}};

}  // namespace

DType parse_kv_cache_type(std::string_view value, std::string_view flag) {
  std::string names;
  for (const CacheTypeName& t : kCacheTypes) {
    if (value == t.name) return t.dtype;
    names += names.empty() ? t.name : std::string(", ") + t.name;
  }
  throw InvalidInput(std::string(flag) + ": unknown KV cache type '" + std::string(value) + "' (accepted: " + names +
                     ")");
}

const char* kv_cache_type_name(DType dt) {
  for (const CacheTypeName& t : kCacheTypes)
    if (t.dtype == dt) return t.name;
  return dtype_name(dt);
}

void check_kv_cache_types(const KVCacheParams& params) {
  const DType k = params.key_dtype(), v = params.value_dtype();
  for (auto [flag, dt] : {std::pair{"--cache-type-k", k}, std::pair{"--cache-type-v", v}}) {
    if (dt != DType::f16 && dt != DType::bf16 && !is_packed_rows(dt))
      throw Unsupported(std::string("a ") + dtype_name(dt) + " KV cache is not supported (" + flag +
                        ": f16, bf16, q8_0 or fp8)");
    if (dt == DType::q8_0 && params.head_dim % 32 != 0)
      throw Unsupported(std::string(flag) + " q8_0 needs a head_dim that is a multiple of 32 (the model's is " +
                        std::to_string(params.head_dim) + ")");
    if (!params.device.is_cpu() && is_packed_rows(dt))
      throw Unsupported(std::string(flag) + " " + kv_cache_type_name(dt) + " is not supported on cuda yet");
  }
  if (!params.device.is_cpu() && k != v)
    throw Unsupported(std::string("--cache-type-k ") + kv_cache_type_name(k) + " with --cache-type-v " +
                      kv_cache_type_name(v) + " is not supported on cuda yet (keys and values of one type)");
}

}  // namespace osprey
