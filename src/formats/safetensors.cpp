#include "formats/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "backend/ops.h"
#include "core/checked.h"
#include "core/error.h"
#include "core/file_read.h"
#include "core/mapped_file.h"

namespace osprey {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string safetensors_dtype_name(DType dt) {
  switch (dt) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::u32: return "U32";
    case DType::i64: return "I64";
    case DType::i16: return "I16";
    case DType::u16: return "U16";
    case DType::i8: return "I8";
    case DType::u8: return "U8";
    case DType::boolean: return "BOOL";
    case DType::q8_0:
    case DType::fp8_e4m3: break;  // the KV cache's packed rows: no safetensors dtype
  }
  throw Unsupported(std::string("safetensors has no dtype for ") + dtype_name(dt));
}

// Parses a JSON object, refusing a key that appears twice in the top-level object (the
// safetensors format forbids it; a plain parse would keep the last one silently).
json parse_unique_keys(const char* begin, const char* end, const std::string& where, const char* what) {
  std::set<std::string> seen;
  std::string duplicate;
  json j;
  try {
    j = json::parse(begin, end, [&](int depth, json::parse_event_t event, json& parsed) {
      if (depth == 1 && event == json::parse_event_t::key && duplicate.empty() &&
          !seen.insert(parsed.get<std::string>()).second)
        duplicate = parsed.get<std::string>();
      return true;
    });
  } catch (const json::exception& e) {
    throw InvalidInput(where + ": malformed JSON " + what + ": " + e.what());
  }
  if (!duplicate.empty()) throw InvalidInput(where + ": the " + std::string(what) + " holds the key \"" + duplicate + "\" twice");
  return j;
}

}  // namespace

SafeTensors SafeTensors::open(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw IoError("model folder " + dir.string() + " does not exist");
  if (!fs::is_directory(dir, ec)) throw IoError(dir.string() + " is not a folder");
  SafeTensors st;
  st.source_ = dir;
  fs::path index = dir / "model.safetensors.index.json";
  if (regular_file_exists(index)) {
    const std::map<std::string, std::string> weight_map = read_safetensors_index(index);
    const std::set<std::string> shards = index_shards(weight_map);
    for (const auto& shard : shards) {
      if (shard.find('/') != std::string::npos || shard.find("..") != std::string::npos)
        throw InvalidInput(index.string() + ": shard name \"" + shard + "\" is not a plain file name");
      if (!fs::exists(dir / shard)) throw IoError(index.string() + " names shard " + shard + ", which does not exist");
      st.add_file(dir / shard);
    }
    for (const auto& [name, file] : weight_map) {
      auto it = st.tensors_.find(name);
      if (it == st.tensors_.end() || st.files_[it->second.file_index]->path().filename() != file)
        throw InvalidInput(index.string() + " maps tensor " + name + " to " + file + ", which does not hold it");
    }
    return st;
  }
  if (fs::exists(dir / "model.safetensors")) {
    st.add_file(dir / "model.safetensors");
    return st;
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  if (files.empty()) throw IoError("no .safetensors files in " + dir.string());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) st.add_file(f);
  return st;
}

SafeTensors SafeTensors::open_file(const fs::path& file) {
  SafeTensors st;
  st.source_ = file;
  st.add_file(file);
  return st;
}

SafeTensors SafeTensors::adopt(const fs::path& source, std::vector<std::shared_ptr<Buffer>> buffers,
                               std::vector<TensorInfo> tensors, const TensorLayout& layout) {
  SafeTensors st;
  st.source_ = source;
  st.layout_ = layout;
  for (TensorInfo& ti : tensors) {
    if (ti.file_index >= buffers.size() || ti.byte_offset > buffers[ti.file_index]->size() ||
        ti.nbytes > buffers[ti.file_index]->size() - ti.byte_offset)
      throw InvalidInput(source.string() + ": tensor " + ti.name + " lies outside its file");
    std::string name = ti.name;
    if (!st.tensors_.emplace(name, std::move(ti)).second)
      throw InvalidInput(source.string() + ": tensor " + name + " appears twice");
  }
  st.buffers_ = std::move(buffers);
  return st;
}

void SafeTensors::add_file(const fs::path& path) {
  auto file = MappedFile::open(path);
  const std::string where = path.string();
  if (file->size() < 8)
    throw InvalidInput(where + ": truncated safetensors file (" + std::to_string(file->size()) +
                       " bytes, less than the 8-byte header length)");
  uint64_t header_len = 0;
  std::memcpy(&header_len, file->data(), 8);  // little endian on every supported host
  if (header_len > file->size() - 8)
    throw InvalidInput(where + ": header length " + std::to_string(header_len) + " runs past the end of the file (" +
                       std::to_string(file->size()) + " bytes)");
  const json header = parse_unique_keys(reinterpret_cast<const char*>(file->data()) + 8,
                                        reinterpret_cast<const char*>(file->data()) + 8 + header_len, where, "header");
  if (!header.is_object()) throw InvalidInput(where + ": the JSON header is not an object");
  const size_t data_start = 8 + header_len;
  const size_t data_size = file->size() - data_start;
  const size_t file_index = files_.size();
  // The buffer spans the mapping and owns nothing: the captured handle keeps it mapped.
  auto buffer = std::make_shared<Buffer>(const_cast<uint8_t*>(file->data()), file->size(), Device::cpu(),
                                         [keep = file](void*, size_t, bool) {});
  // Data regions, to check that they tile the data section exactly.
  struct Region {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Region> regions;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (entry.is_object())
        for (auto& [k, v] : entry.items())
          if (v.is_string()) metadata_[k] = v.get<std::string>();
      continue;
    }
    const std::string what = where + ": tensor " + name;
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      throw InvalidInput(what + ": header entry needs dtype, shape and data_offsets");
    if (!entry["dtype"].is_string()) throw InvalidInput(what + ": dtype is not a string");
    const bool f8 = entry["dtype"].get<std::string>() == "F8_E4M3";
    auto dtype = f8 ? std::optional<DType>(DType::u8) : dtype_from_safetensors(entry["dtype"].get<std::string>());
    if (!dtype) throw Unsupported(what + ": unsupported dtype " + entry["dtype"].get<std::string>());
    const json& shape_j = entry["shape"];
    const json& off_j = entry["data_offsets"];
    if (!shape_j.is_array() || shape_j.size() > size_t(Shape::kMaxDims))
      throw InvalidInput(what + ": shape must be an array of at most 4 dimensions");
    if (!off_j.is_array() || off_j.size() != 2 || !off_j[0].is_number_unsigned() || !off_j[1].is_number_unsigned())
      throw InvalidInput(what + ": data_offsets must be two non-negative integers");
    TensorInfo info;
    info.name = name;
    info.dtype = *dtype;
    info.float8_e4m3 = f8;
    // Element count and size in checked arithmetic, in the order Shape::numel multiplies:
    // a shape whose size does not fit in 63 bits is refused, never wrapped.
    uint64_t numel = 1;
    bool overflow = false;
    for (const auto& d : shape_j) {
      if (!d.is_number_unsigned()) throw InvalidInput(what + ": shape holds a value that is not a non-negative integer");
      const uint64_t v = d.get<uint64_t>();
      const auto product = mul_u64(numel, v);
      if (v > uint64_t(INT64_MAX) || !product || *product > uint64_t(INT64_MAX)) overflow = true;
      info.shape.d[info.shape.n++] = overflow ? 0 : int64_t(v);
      numel = product.value_or(0);
    }
    const auto nbytes = mul_u64(numel, dtype_size(*dtype));
    if (overflow || !nbytes || *nbytes > uint64_t(INT64_MAX))
      throw InvalidInput(what + ": shape " + shape_j.dump() + " of " + dtype_name(*dtype) +
                         " is too large (its size in bytes does not fit in 63 bits)");
    uint64_t begin = off_j[0].get<uint64_t>(), end = off_j[1].get<uint64_t>();
    if (begin > end || end > data_size)
      throw InvalidInput(what + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                         ") out of bounds of the " + std::to_string(data_size) + "-byte data section");
    if (end - begin != *nbytes)
      throw InvalidInput(what + ": data_offsets span " + std::to_string(end - begin) + " bytes but " +
                         dtype_name(*dtype) + info.shape.str() + " needs " + std::to_string(*nbytes));
    regions.push_back({begin, end, name});
    info.file_index = file_index;
    info.byte_offset = data_start + begin;
    info.nbytes = end - begin;
    if (tensors_.count(name)) throw InvalidInput(what + ": appears in more than one file");
    tensors_.emplace(name, std::move(info));
  }
  // The format requires the tensors' data to tile the data section: no overlap (two tensors
  // sharing bytes), no hole, nothing after the last tensor (a header length one byte short
  // shows as a trailing byte, every tensor shifted by one).
  std::sort(regions.begin(), regions.end(),
            [](const Region& a, const Region& b) { return a.begin < b.begin || (a.begin == b.begin && a.end < b.end); });
  uint64_t covered = 0;
  const Region* last = nullptr;
  for (const Region& r : regions) {
    if (r.begin < covered)
      throw InvalidInput(where + ": tensor " + r.name + " (bytes [" + std::to_string(r.begin) + ", " +
                         std::to_string(r.end) + ")) overlaps tensor " + last->name + " (bytes up to " +
                         std::to_string(covered) + ") in the data section");
    if (r.begin > covered)
      throw InvalidInput(where + ": the data section has a hole of " + std::to_string(r.begin - covered) +
                         " bytes at offset " + std::to_string(covered) + ", before tensor " + r.name);
    covered = r.end;
    last = &r;
  }
  if (covered != data_size)
    throw InvalidInput(where + ": " + std::to_string(data_size - covered) + " trailing bytes after the last tensor's data (at offset " +
                       std::to_string(covered) + " of a " + std::to_string(data_size) +
                       "-byte data section; is the header length right?)");
  files_.push_back(std::move(file));
  buffers_.push_back(std::move(buffer));
}

const TensorInfo& SafeTensors::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw InvalidInput("missing tensor " + name + " in " + source_.string());
  return it->second;
}

Array SafeTensors::get(const std::string& name) const {
  const TensorInfo& ti = info(name);
  return Array::from_buffer(buffers_[ti.file_index], ti.byte_offset, ti.shape, ti.dtype);
}

Array SafeTensors::get(const std::string& name, DType dtype, const Shape& shape) const {
  const TensorInfo& ti = info(name);
  if (ti.dtype != dtype || !(ti.shape == shape))
    throw InvalidInput("tensor " + name + " in " +
                       (ti.file_index < files_.size() ? files_[ti.file_index]->path() : source_).string() + " is " +
                       dtype_name(ti.dtype) + ti.shape.str() + ", but the config implies " + dtype_name(dtype) +
                       shape.str());
  return get(name);
}

std::vector<std::string> SafeTensors::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [k, v] : tensors_) out.push_back(k);
  return out;
}

size_t SafeTensors::total_bytes() const {
  size_t n = 0;
  for (const auto& [k, v] : tensors_) n += v.nbytes;
  return n;
}

void write_safetensors(const fs::path& path, const std::vector<std::pair<std::string, Array>>& tensors,
                       const std::map<std::string, std::string>& metadata, const std::set<std::string>& float8_e4m3) {
  std::vector<TensorSpec> specs;
  for (const auto& [name, a] : tensors) {
    const bool f8 = float8_e4m3.count(name) > 0;
    if (f8 && a.dtype() != DType::u8)
      throw InvalidInput(path.string() + ": tensor " + name + " is declared F8_E4M3 but is " + describe(a));
    specs.push_back({name, a.dtype(), a.shape(), f8});
  }
  SafeTensorsWriter writer(path, std::move(specs), metadata);
  for (const auto& [name, a] : tensors) writer.write(name, a);
  writer.close();
}

SafeTensorsWriter::SafeTensorsWriter(const fs::path& path, std::vector<TensorSpec> specs,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), specs_(std::move(specs)) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& spec : specs_) {
    if (header.contains(spec.name)) throw InvalidInput(path_.string() + ": tensor " + spec.name + " declared twice");
    std::vector<int64_t> shape(spec.shape.d, spec.shape.d + spec.shape.n);
    header[spec.name] = {{"dtype", spec.float8_e4m3 ? std::string("F8_E4M3") : safetensors_dtype_name(spec.dtype)}, {"shape", shape},
                         {"data_offsets", {offset, offset + spec.nbytes()}}};
    offset += spec.nbytes();
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');
  file_ = std::fopen(path_.string().c_str(), "wb");
  if (!file_) throw IoError(path_.string() + ": cannot open for writing: " + std::strerror(errno));
  const uint64_t n = h.size();
  if (std::fwrite(&n, 8, 1, file_) != 1 || std::fwrite(h.data(), 1, h.size(), file_) != h.size())
    throw IoError(path_.string() + ": write failed: " + std::strerror(errno));
}

SafeTensorsWriter::~SafeTensorsWriter() {
  if (file_) std::fclose(file_);
}

void SafeTensorsWriter::write(const std::string& name, const Array& a) {
  if (!file_) throw InvalidInput(path_.string() + ": write of " + name + " after close");
  if (next_ >= specs_.size() || specs_[next_].name != name)
    throw InvalidInput(path_.string() + ": tensor " + name + " written out of order (expected " +
                       (next_ < specs_.size() ? specs_[next_].name : std::string("no more tensors")) + ")");
  const TensorSpec& spec = specs_[next_];
  if (!a.defined()) throw InvalidInput(path_.string() + ": tensor " + name + " is undefined");
  if (a.dtype() != spec.dtype || !(a.shape() == spec.shape) || !a.device().is_cpu())
    throw InvalidInput(path_.string() + ": tensor " + name + " is " + describe(a) + " on " + a.device().str() +
                       ", but was declared " + dtype_name(spec.dtype) + spec.shape.str() + " on the CPU");
  const Array c = a.is_contiguous() ? a : ops::cast(a, a.dtype());
  if (std::fwrite(c.raw(), 1, c.nbytes(), file_) != c.nbytes())
    throw IoError(path_.string() + ": write failed: " + std::strerror(errno));
  ++next_;
}

void SafeTensorsWriter::close() {
  if (!file_) return;
  if (next_ != specs_.size())
    throw InvalidInput(path_.string() + ": tensor " + specs_[next_].name + " was declared but not written");
  const bool ok = std::fflush(file_) == 0 && std::ferror(file_) == 0;
  const int e = errno;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!ok || !closed) throw IoError(path_.string() + ": write failed: " + std::strerror(ok ? errno : e));
}

}  // namespace osprey
