#include "formats/gguf.h"

#include <algorithm>
#include <cstring>

#include "core/checked.h"
#include "core/error.h"
#include "core/mapped_file.h"

namespace osprey {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
// ggml's GGML_MAX_DIMS; also Osprey's Shape::kMaxDims.
constexpr uint32_t kMaxTensorDims = 4;

// Reads the header's fields in order, each checked against the bytes left; errors name the
// file and what was being read.
class GgufCursor {
 public:
  GgufCursor(const uint8_t* data, size_t size, std::string where) : data_(data), size_(size), where_(std::move(where)) {}

  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }
  const uint8_t* here() const { return data_ + pos_; }

  void need(uint64_t n, const std::string& what) const {
    if (n > left())
      throw InvalidInput(where_ + ": truncated at byte " + std::to_string(pos_) + " reading " + what + " (" +
                         std::to_string(n) + " bytes needed, " + std::to_string(left()) + " left)");
  }
  template <class T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  void skip(uint64_t n, const std::string& what) {
    need(n, what);
    pos_ += size_t(n);
  }
  std::string_view string(const std::string& what) {
    const uint64_t n = read<uint64_t>(what + " (its length)");
    need(n, what + " (a string of " + std::to_string(n) + " bytes)");
    std::string_view s(reinterpret_cast<const char*>(data_ + pos_), size_t(n));
    pos_ += size_t(n);
    return s;
  }
  // A count of items of at least `min_bytes` each: refused when the bytes left cannot hold
  // them, so that nothing is sized by it unchecked.
  uint64_t count(const std::string& what, uint64_t min_bytes) {
    const uint64_t n = read<uint64_t>(what);
    if (min_bytes > 0 && n > left() / min_bytes)
      throw InvalidInput(where_ + ": " + what + " is " + std::to_string(n) + ", more than the " +
                         std::to_string(left()) + " bytes left in the file can hold");
    return n;
  }
  const std::string& where() const { return where_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  std::string where_;
};

// The size of one element of a fixed-size value type; 0 for string and array.
size_t value_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8: case GgufValueType::i8: case GgufValueType::boolean: return 1;
    case GgufValueType::u16: case GgufValueType::i16: return 2;
    case GgufValueType::u32: case GgufValueType::i32: case GgufValueType::f32: return 4;
    case GgufValueType::u64: case GgufValueType::i64: case GgufValueType::f64: return 8;
    case GgufValueType::string: case GgufValueType::array: return 0;
  }
  return 0;
}

bool valid_value_type(uint32_t t) { return t <= uint32_t(GgufValueType::f64); }

bool unsigned_int_type(GgufValueType t) {
  return t == GgufValueType::u8 || t == GgufValueType::u16 || t == GgufValueType::u32 || t == GgufValueType::u64;
}
bool signed_int_type(GgufValueType t) {
  return t == GgufValueType::i8 || t == GgufValueType::i16 || t == GgufValueType::i32 || t == GgufValueType::i64;
}

// Decodes one fixed-size scalar of type `t` at `p` into `v`.
void decode_scalar(GgufValueType t, const uint8_t* p, GgufValue& v) {
  v.type = t;
  switch (t) {
    case GgufValueType::u8: v.u = p[0]; break;
    case GgufValueType::i8: v.i = int8_t(p[0]); break;
    case GgufValueType::boolean: v.u = p[0]; break;
    case GgufValueType::u16: { uint16_t x; std::memcpy(&x, p, 2); v.u = x; break; }
    case GgufValueType::i16: { int16_t x; std::memcpy(&x, p, 2); v.i = x; break; }
    case GgufValueType::u32: { uint32_t x; std::memcpy(&x, p, 4); v.u = x; break; }
    case GgufValueType::i32: { int32_t x; std::memcpy(&x, p, 4); v.i = x; break; }
    case GgufValueType::f32: { float x; std::memcpy(&x, p, 4); v.f = x; break; }
    case GgufValueType::u64: { uint64_t x; std::memcpy(&x, p, 8); v.u = x; break; }
    case GgufValueType::i64: { int64_t x; std::memcpy(&x, p, 8); v.i = x; break; }
    case GgufValueType::f64: { double x; std::memcpy(&x, p, 8); v.f = x; break; }
    case GgufValueType::string: case GgufValueType::array: break;
  }
}

GgufValue read_value(GgufCursor& c, GgufValueType t, const std::string& what) {
  GgufValue v;
  v.type = t;
  if (t == GgufValueType::string) {
    v.s = c.string(what);
    return v;
  }
  if (t != GgufValueType::array) {
    const size_t n = value_size(t);
    c.need(n, what);
    decode_scalar(t, c.here(), v);
    if (t == GgufValueType::boolean && v.u > 1)
      throw InvalidInput(c.where() + ": " + what + " is a bool of value " + std::to_string(v.u) + " (not 0 or 1)");
    c.skip(n, what);
    return v;
  }
  const uint32_t elem = c.read<uint32_t>(what + " (its element type)");
  if (!valid_value_type(elem))
    throw InvalidInput(c.where() + ": " + what + " is an array of unknown value type " + std::to_string(elem));
  v.elem = GgufValueType(elem);
  if (v.elem == GgufValueType::array)
    throw Unsupported(c.where() + ": " + what + " is an array of arrays, which no GGUF model uses and Osprey does not read");
  const size_t esize = value_size(v.elem);
  // A string element takes at least its 8-byte length.
  v.count = c.count(what + " (its element count)", esize ? esize : 8);
  v.data = c.here();
  if (v.elem == GgufValueType::string) {
    for (uint64_t i = 0; i < v.count; ++i) c.string(what + "[" + std::to_string(i) + "]");
  } else {
    c.skip(v.count * esize, what);  // count <= left / esize: no overflow
    if (v.elem == GgufValueType::boolean)
      for (uint64_t i = 0; i < v.count; ++i)
        if (v.data[i] > 1)
          throw InvalidInput(c.where() + ": " + what + "[" + std::to_string(i) + "] is a bool of value " +
                             std::to_string(v.data[i]) + " (not 0 or 1)");
  }
  v.nbytes = size_t(c.here() - v.data);
  return v;
}

// An integer value as int64, or nullopt when it is not an integer or does not fit.
std::optional<int64_t> as_int(const GgufValue& v) {
  if (signed_int_type(v.type)) return v.i;
  if (unsigned_int_type(v.type) && v.u <= uint64_t(INT64_MAX)) return int64_t(v.u);
  return std::nullopt;
}

}  // namespace

const char* gguf_value_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8: return "uint8";
    case GgufValueType::i8: return "int8";
    case GgufValueType::u16: return "uint16";
    case GgufValueType::i16: return "int16";
    case GgufValueType::u32: return "uint32";
    case GgufValueType::i32: return "int32";
    case GgufValueType::f32: return "float32";
    case GgufValueType::boolean: return "bool";
    case GgufValueType::string: return "string";
    case GgufValueType::array: return "array";
    case GgufValueType::u64: return "uint64";
    case GgufValueType::i64: return "int64";
    case GgufValueType::f64: return "float64";
  }
  return "?";
}

namespace {

struct TypeEntry {
  GgufType type;
  const char* name;
  GgufBlock block;
};

// Block sizes as ggml defines them (ggml-common.h's block structs).
constexpr TypeEntry kTypes[] = {
    {GgufType::F32, "F32", {1, 4}},           {GgufType::F16, "F16", {1, 2}},
    {GgufType::Q4_0, "Q4_0", {32, 18}},       {GgufType::Q4_1, "Q4_1", {32, 20}},
    {GgufType::Q5_0, "Q5_0", {32, 22}},       {GgufType::Q5_1, "Q5_1", {32, 24}},
    {GgufType::Q8_0, "Q8_0", {32, 34}},       {GgufType::Q8_1, "Q8_1", {32, 36}},
    {GgufType::Q2_K, "Q2_K", {256, 84}},      {GgufType::Q3_K, "Q3_K", {256, 110}},
    {GgufType::Q4_K, "Q4_K", {256, 144}},     {GgufType::Q5_K, "Q5_K", {256, 176}},
    {GgufType::Q6_K, "Q6_K", {256, 210}},     {GgufType::Q8_K, "Q8_K", {256, 292}},
    {GgufType::IQ2_XXS, "IQ2_XXS", {256, 66}}, {GgufType::IQ2_XS, "IQ2_XS", {256, 74}},
    {GgufType::IQ3_XXS, "IQ3_XXS", {256, 98}}, {GgufType::IQ1_S, "IQ1_S", {256, 50}},
    {GgufType::IQ4_NL, "IQ4_NL", {32, 18}},   {GgufType::IQ3_S, "IQ3_S", {256, 110}},
    {GgufType::IQ2_S, "IQ2_S", {256, 82}},    {GgufType::IQ4_XS, "IQ4_XS", {256, 136}},
    {GgufType::I8, "I8", {1, 1}},             {GgufType::I16, "I16", {1, 2}},
    {GgufType::I32, "I32", {1, 4}},           {GgufType::I64, "I64", {1, 8}},
    {GgufType::F64, "F64", {1, 8}},           {GgufType::IQ1_M, "IQ1_M", {256, 56}},
    {GgufType::BF16, "BF16", {1, 2}},         {GgufType::TQ1_0, "TQ1_0", {256, 54}},
    {GgufType::TQ2_0, "TQ2_0", {256, 66}},    {GgufType::MXFP4, "MXFP4", {32, 17}},
};

const TypeEntry* type_entry(uint32_t type) {
  for (const TypeEntry& e : kTypes)
    if (uint32_t(e.type) == type) return &e;
  return nullptr;
}

}  // namespace

std::optional<GgufBlock> gguf_block(uint32_t type) {
  if (const TypeEntry* e = type_entry(type)) return e->block;
  return std::nullopt;
}

std::string gguf_type_name(uint32_t type) {
  if (const TypeEntry* e = type_entry(type)) return e->name;
  return "type " + std::to_string(type);
}

std::optional<DType> gguf_dense_dtype(GgufType type) {
  switch (type) {
    case GgufType::F32: return DType::f32;
    case GgufType::F16: return DType::f16;
    case GgufType::BF16: return DType::bf16;
    case GgufType::I8: return DType::i8;
    case GgufType::I16: return DType::i16;
    case GgufType::I32: return DType::i32;
    case GgufType::I64: return DType::i64;
    default: return std::nullopt;
  }
}

GgufFile GgufFile::open(const std::filesystem::path& path) {
  GgufFile g;
  g.path_ = path;
  g.file_ = MappedFile::open(path);
  const std::string where = path.string();
  GgufCursor c(g.file_->data(), g.file_->size(), where);

  const uint32_t magic = c.read<uint32_t>("the magic number");
  if (magic != kGgufMagic) throw InvalidInput(where + ": not a GGUF file (it does not start with \"GGUF\")");
  g.version_ = c.read<uint32_t>("the version");
  if (g.version_ == 1)
    throw Unsupported(where + ": GGUF version 1 is not supported (versions 2 and 3 are; convert the file again)");
  if (g.version_ != 2 && g.version_ != 3) {
    // A big-endian file reads its version byte-swapped here.
    const bool swapped = g.version_ == 0x02000000u || g.version_ == 0x03000000u;
    throw Unsupported(where + ": GGUF version " + std::to_string(g.version_) + " is not supported (versions 2 and 3 are" +
                      (swapped ? "; this looks like a big-endian file, and Osprey reads little-endian GGUF" : "") + ")");
  }
  // A tensor info takes at least 24 bytes (name length, n_dims, type, offset); a key/value
  // pair at least 13 (key length, type, a one-byte value).
  const uint64_t n_tensors = c.count("the tensor count", 24);
  const uint64_t n_kv = c.count("the metadata key/value count", 13);

  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string what = "metadata pair " + std::to_string(k);
    const std::string key(c.string(what + "'s key"));
    const uint32_t type = c.read<uint32_t>("the value type of key " + key);
    if (!valid_value_type(type))
      throw InvalidInput(where + ": key " + key + " has unknown value type " + std::to_string(type));
    GgufValue v = read_value(c, GgufValueType(type), "the value of key " + key);
    if (!g.kv_.emplace(key, v).second) throw InvalidInput(where + ": key " + key + " appears twice");
  }
  if (const GgufValue* a = g.find("general.alignment")) {
    const auto n = as_int(*a);
    if (!n || *n <= 0 || (*n & (*n - 1)) != 0 || *n > (int64_t(1) << 30))
      throw InvalidInput(where + ": general.alignment must be a power of two (at most 2^30), got " +
                         (n ? std::to_string(*n) : std::string("a ") + gguf_value_type_name(a->type)));
    g.alignment_ = uint64_t(*n);
  } else {
    g.alignment_ = kDefaultAlignment;
  }

  struct Pending {
    GgufTensorInfo info;
    uint64_t offset;  // relative to the data section
  };
  std::vector<Pending> pending;
  for (uint64_t t = 0; t < n_tensors; ++t) {
    const std::string what = "tensor info " + std::to_string(t);
    Pending p;
    p.info.name = std::string(c.string(what + "'s name"));
    const std::string tw = where + ": tensor " + p.info.name;
    const uint32_t n_dims = c.read<uint32_t>("the dimension count of tensor " + p.info.name);
    if (n_dims == 0 || n_dims > kMaxTensorDims)
      throw InvalidInput(tw + ": " + std::to_string(n_dims) + " dimensions (1 to 4 are allowed)");
    uint64_t ne[kMaxTensorDims];
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      ne[d] = c.read<uint64_t>("the dimensions of tensor " + p.info.name);
      const auto product = mul_u64(numel, ne[d]);
      if (ne[d] > uint64_t(INT64_MAX) || !product || *product > uint64_t(INT64_MAX)) {
        std::string dims;
        for (uint32_t e = 0; e <= d; ++e) dims += (e ? ", " : "") + std::to_string(ne[e]);
        throw InvalidInput(tw + ": dimensions [" + dims + "] are too large (the element count does not fit in 63 bits)");
      }
      numel = *product;
    }
    const uint32_t type = c.read<uint32_t>("the type of tensor " + p.info.name);
    const auto block = gguf_block(type);
    if (!block) throw InvalidInput(tw + ": unknown tensor type " + std::to_string(type));
    p.info.type = GgufType(type);
    if (ne[0] % uint64_t(block->elements) != 0)
      throw InvalidInput(tw + ": its rows of " + std::to_string(ne[0]) + " elements are not whole " +
                         gguf_type_name(type) + " blocks of " + std::to_string(block->elements));
    const auto nbytes = mul_u64(numel / uint64_t(block->elements), uint64_t(block->bytes));
    if (!nbytes || *nbytes > uint64_t(INT64_MAX))
      throw InvalidInput(tw + ": its size in bytes does not fit in 63 bits");
    p.info.nbytes = size_t(*nbytes);
    p.info.shape.n = int(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) p.info.shape.d[n_dims - 1 - d] = int64_t(ne[d]);
    p.offset = c.read<uint64_t>("the data offset of tensor " + p.info.name);
    if (p.offset % g.alignment_ != 0)
      throw InvalidInput(tw + ": data offset " + std::to_string(p.offset) + " is not a multiple of the alignment " +
                         std::to_string(g.alignment_));
    if (g.by_name_.count(p.info.name)) throw InvalidInput(tw + ": appears twice in the tensor table");
    g.by_name_.emplace(p.info.name, pending.size());
    pending.push_back(std::move(p));
  }

  // The data section starts at the next multiple of the alignment after the header.
  const uint64_t header_end = c.pos();
  const uint64_t data_start = (header_end + g.alignment_ - 1) / g.alignment_ * g.alignment_;
  const uint64_t file_size = g.file_->size();
  if (!pending.empty() && data_start > file_size)
    throw InvalidInput(where + ": the data section would start at byte " + std::to_string(data_start) +
                       ", past the end of the file (" + std::to_string(file_size) + " bytes)");
  const uint64_t data_size = pending.empty() ? 0 : file_size - data_start;
  for (Pending& p : pending) {
    if (p.offset > data_size || p.info.nbytes > data_size - p.offset)
      throw InvalidInput(where + ": tensor " + p.info.name + ": bytes [" + std::to_string(p.offset) + ", " +
                         std::to_string(p.offset) + " + " + std::to_string(p.info.nbytes) + ") run past the end of the " +
                         std::to_string(data_size) + "-byte data section");
    p.info.byte_offset = size_t(data_start + p.offset);
  }
  // No two tensors share bytes.
  std::vector<const Pending*> order;
  for (const Pending& p : pending) order.push_back(&p);
  std::sort(order.begin(), order.end(), [](const Pending* a, const Pending* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i]->offset < order[i - 1]->offset + order[i - 1]->info.nbytes)
      throw InvalidInput(where + ": tensor " + order[i]->info.name + " (at data offset " +
                         std::to_string(order[i]->offset) + ") overlaps tensor " + order[i - 1]->info.name);
  g.tensors_.reserve(pending.size());
  for (Pending& p : pending) g.tensors_.push_back(std::move(p.info));
  // The buffer spans the mapping and owns nothing: the captured handle keeps it mapped.
  g.buffer_ = std::make_shared<Buffer>(const_cast<uint8_t*>(g.file_->data()), g.file_->size(), Device::cpu(),
                                       [keep = g.file_](void*, size_t, bool) {});
  return g;
}

std::string GgufFile::fail_where(const std::string& key) const { return path_.string() + ": metadata key " + key; }

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

namespace {

const GgufValue& require_key(const GgufFile& g, const std::string& key) {
  const GgufValue* v = g.find(key);
  if (!v) throw InvalidInput(g.path().string() + ": missing metadata key " + key);
  return *v;
}

[[noreturn]] void wrong_type(const GgufFile& g, const std::string& key, const GgufValue& v, const char* wanted) {
  std::string got = gguf_value_type_name(v.type);
  if (v.type == GgufValueType::array) got += std::string(" of ") + gguf_value_type_name(v.elem);
  throw InvalidInput(g.path().string() + ": metadata key " + key + " is " + got + ", but " + wanted + " is expected");
}

}  // namespace

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = require_key(*this, key);
  if (v.type != GgufValueType::string) wrong_type(*this, key, v, "a string");
  return std::string(v.s);
}

uint64_t GgufFile::get_uint(const std::string& key) const {
  const GgufValue& v = require_key(*this, key);
  if (unsigned_int_type(v.type)) return v.u;
  if (signed_int_type(v.type)) {
    if (v.i < 0) throw InvalidInput(fail_where(key) + " must not be negative, got " + std::to_string(v.i));
    return uint64_t(v.i);
  }
  wrong_type(*this, key, v, "an integer");
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = require_key(*this, key);
  if (!signed_int_type(v.type) && !unsigned_int_type(v.type)) wrong_type(*this, key, v, "an integer");
  if (auto n = as_int(v)) return *n;
  throw InvalidInput(fail_where(key) + " is " + std::to_string(v.u) + ", too large for a signed 64-bit integer");
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = require_key(*this, key);
  if (v.type == GgufValueType::f32 || v.type == GgufValueType::f64) return v.f;
  wrong_type(*this, key, v, "a float");
}

bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = require_key(*this, key);
  if (v.type != GgufValueType::boolean) wrong_type(*this, key, v, "a bool");
  return v.u != 0;
}

uint64_t GgufFile::array_size(const std::string& key) const {
  const GgufValue& v = require_key(*this, key);
  if (v.type != GgufValueType::array) wrong_type(*this, key, v, "an array");
  return v.count;
}

std::vector<std::string_view> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = require_key(*this, key);
  if (v.type != GgufValueType::array || v.elem != GgufValueType::string) wrong_type(*this, key, v, "an array of strings");
  std::vector<std::string_view> out;
  out.reserve(size_t(v.count));  // bounded by the file's size at open
  const uint8_t* p = v.data;
  for (uint64_t i = 0; i < v.count; ++i) {
    uint64_t n;
    std::memcpy(&n, p, 8);  // checked at open
    out.emplace_back(reinterpret_cast<const char*>(p + 8), size_t(n));
    p += 8 + n;
  }
  return out;
}

namespace {

// f(i, element i) for each element of the array value v (of scalar elements).
template <class F>
void for_each_element(const GgufValue& v, F&& f) {
  const size_t es = value_size(v.elem);
  for (uint64_t i = 0; i < v.count; ++i) {
    GgufValue e;
    decode_scalar(v.elem, v.data + i * es, e);
    f(i, e);
  }
}

}  // namespace

std::vector<int64_t> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = require_key(*this, key);
  if (v.type != GgufValueType::array || !(signed_int_type(v.elem) || unsigned_int_type(v.elem) || v.elem == GgufValueType::boolean))
    wrong_type(*this, key, v, "an array of integers");
  std::vector<int64_t> out;
  out.reserve(size_t(v.count));
  for_each_element(v, [&](uint64_t i, const GgufValue& e) {
    if (signed_int_type(v.elem)) {
      out.push_back(e.i);
    } else if (e.u > uint64_t(INT64_MAX)) {
      throw InvalidInput(fail_where(key) + "[" + std::to_string(i) + "] is " + std::to_string(e.u) +
                         ", too large for a signed 64-bit integer");
    } else {
      out.push_back(int64_t(e.u));
    }
  });
  return out;
}

std::vector<float> GgufFile::get_float_array(const std::string& key) const {
  const GgufValue& v = require_key(*this, key);
  if (v.type != GgufValueType::array || (v.elem != GgufValueType::f32 && v.elem != GgufValueType::f64))
    wrong_type(*this, key, v, "an array of floats");
  std::vector<float> out;
  out.reserve(size_t(v.count));
  for_each_element(v, [&](uint64_t, const GgufValue& e) { out.push_back(float(e.f)); });
  return out;
}

const GgufTensorInfo* GgufFile::tensor(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

Array GgufFile::tensor_array(const GgufTensorInfo& info) const {
  if (auto dt = gguf_dense_dtype(info.type)) return Array::from_buffer(buffer_, info.byte_offset, info.shape, *dt);
  // Blocks as stored: [outer dims..., bytes of one row].
  const GgufBlock block = *gguf_block(uint32_t(info.type));
  Shape s = info.shape;
  s.d[s.n - 1] = s.d[s.n - 1] / block.elements * block.bytes;
  return Array::from_buffer(buffer_, info.byte_offset, s, DType::u8);
}

}  // namespace osprey
