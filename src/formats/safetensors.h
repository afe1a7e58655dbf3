#pragma once
// Memory-mapped safetensors checkpoints: one file, or shards listed by
// model.safetensors.index.json. Tensors are never read twice: get() returns a CPU array
// that points into the mapping (zero copy) and keeps it alive.
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/array.h"

namespace osprey {

class MappedFile;

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  size_t file_index = 0;   // into SafeTensors' file list
  size_t byte_offset = 0;  // absolute, within the file
  size_t nbytes = 0;
  // "F8_E4M3" (float8 e4m3fn, FP8 checkpoints): no Array element type; read as its bytes,
  // dtype u8, with this set (formats/hub_quant.h decodes them).
  bool float8_e4m3 = false;
};

// How a checkpoint's tensors differ from the Hugging Face layout that the families describe
// (both are set for GGUF files, whose converter rewrites some tensors; formats/gguf_model.h).
struct TensorLayout {
  // Each head's q and k projection rows hold the rotary pairs interleaved, (2i, 2i + 1), where
  // the family's checkpoints rotate the halves (i, i + head_dim / 2): llama.cpp's converter
  // permutes Llama's rows so. Rotating interleaved pairs gives the same attention scores.
  bool qk_rows_interleaved = false;
  // Norm weights already hold 1 + w where the family scales by (1 + w) (Gemma's).
  bool norm_unit_offset_folded = false;
};

class SafeTensors {
 public:
  // A model folder: model.safetensors.index.json if present, else model.safetensors, else
  // every *.safetensors in the folder. Throws IoError (missing folder, no files, unreadable
  // file) or InvalidInput (malformed header, out-of-bounds data, unknown dtype, a shard or
  // tensor the index names but the files lack) naming the file and tensor.
  static SafeTensors open(const std::filesystem::path& model_dir);
  static SafeTensors open_file(const std::filesystem::path& file);
  // Tensors of another container, already checked by its reader (formats/gguf.h): each
  // TensorInfo's file_index indexes `buffers` (each over one whole mapping, keeping it alive),
  // and its bytes lie within that buffer. `source` names the container in messages.
  static SafeTensors adopt(const std::filesystem::path& source, std::vector<std::shared_ptr<Buffer>> buffers,
                           std::vector<TensorInfo> tensors, const TensorLayout& layout);

  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws InvalidInput "missing tensor NAME in DIR".
  const TensorInfo& info(const std::string& name) const;
  Array get(const std::string& name) const;
  // get() that also checks dtype and shape, naming the tensor, both values and the source.
  Array get(const std::string& name, DType dtype, const Shape& shape) const;
  std::vector<std::string> names() const;
  const std::filesystem::path& source() const { return source_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t total_bytes() const;
  const TensorLayout& layout() const { return layout_; }

 private:
  void add_file(const std::filesystem::path& path);

  std::filesystem::path source_;
  std::vector<std::shared_ptr<MappedFile>> files_;
  std::vector<std::shared_ptr<Buffer>> buffers_;  // one per file, over the whole mapping
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  TensorLayout layout_;
};

// Writes `tensors` (CPU arrays, any strides) as one safetensors file, in the given order,
// with optional string metadata; the uint8 tensors named in `float8_e4m3` are declared F8_E4M3.
// Throws IoError when the file cannot be written.
void write_safetensors(const std::filesystem::path& path, const std::vector<std::pair<std::string, Array>>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       const std::set<std::string>& float8_e4m3 = {});

struct TensorSpec {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  bool float8_e4m3 = false;  // uint8 data declared F8_E4M3
  size_t nbytes() const { return size_t(shape.numel()) * dtype_size(dtype); }
};

// Writes one safetensors file tensor by tensor, so that only one tensor need be in memory:
// the header (every name, dtype and shape) goes out first, then each tensor's data, in the
// declared order. write() throws InvalidInput for a tensor out of order or of another dtype
// or shape; close() throws InvalidInput when a declared tensor was not written. IoError when
// the file cannot be written. A writer destroyed before close() leaves a truncated file.
class SafeTensorsWriter {
 public:
  SafeTensorsWriter(const std::filesystem::path& path, std::vector<TensorSpec> specs,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafeTensorsWriter();
  SafeTensorsWriter(const SafeTensorsWriter&) = delete;
  SafeTensorsWriter& operator=(const SafeTensorsWriter&) = delete;

  // `a`: a CPU array (any strides) matching the next declared tensor.
  void write(const std::string& name, const Array& a);
  void close();

 private:
  std::filesystem::path path_;
  std::vector<TensorSpec> specs_;
  size_t next_ = 0;
  std::FILE* file_ = nullptr;
};

}  // namespace osprey
