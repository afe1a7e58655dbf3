// The GGUF reader on arbitrary bytes, as a whole .gguf file. Every metadata value the reader
// accepts is read back through the typed getters, and every tensor it accepts must lie
// inside the file; every tensor of a block type Osprey decodes is decoded, and the file is
// read as a checkpoint (the quantized tensors repacked).
#include <vector>

#include "core/mapped_file.h"
#include "formats/gguf.h"
#include "formats/gguf_blocks.h"
#include "formats/gguf_model.h"
#include "fuzz_util.h"

using namespace osprey;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const auto file = fuzz::scratch_dir() / "one.gguf";
  fuzz::write_bytes(file, bytes);
  fuzz::expect_clean([&] {
    GgufFile g = GgufFile::open(file);
    for (const auto& entry : g.metadata()) {
      const std::string& key = entry.first;
      const GgufValue& v = entry.second;
      fuzz::expect_clean([&] {
        switch (v.type) {
          case GgufValueType::string: (void)g.get_string(key); break;
          case GgufValueType::f32: case GgufValueType::f64: (void)g.get_float(key); break;
          case GgufValueType::boolean: (void)g.get_bool(key); break;
          case GgufValueType::array:
            if (v.elem == GgufValueType::string) (void)g.get_string_array(key);
            else if (v.elem == GgufValueType::f32 || v.elem == GgufValueType::f64) (void)g.get_float_array(key);
            else (void)g.get_int_array(key);
            break;
          default: (void)g.get_int(key); break;
        }
      });
    }
    for (const GgufTensorInfo& ti : g.tensors()) {
      if (ti.byte_offset + ti.nbytes > size) std::abort();  // accepted, but outside the file
      Array a = g.tensor_array(ti);
      if (a.nbytes() != ti.nbytes) std::abort();
      if (gguf_dequantizes(ti.type) && ti.shape.numel() <= (int64_t(1) << 20)) {
        std::vector<float> out(size_t(ti.shape.numel()));
        gguf_dequantize(ti.type, g.file()->data() + ti.byte_offset, ti.shape.numel(), out.data());
      }
    }
    fuzz::expect_clean([&] { (void)read_gguf_checkpoint(g); });
  });
  return 0;
}
