// The safetensors reader on arbitrary bytes. The first byte chooses what the rest is:
// even, a whole .safetensors file; odd, a model.safetensors.index.json next to a valid shard.
// Every tensor the reader accepts must lie inside the file.
#include <cstring>

#include "formats/safetensors.h"
#include "fuzz_util.h"

using namespace osprey;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const auto& dir = fuzz::scratch_dir();
  if (data[0] % 2 == 0) {
    const auto file = dir / "one.safetensors";
    fuzz::write_bytes(file, rest);
    fuzz::expect_clean([&] {
      SafeTensors st = SafeTensors::open_file(file);
      for (const auto& name : st.names()) {
        const TensorInfo& ti = st.info(name);
        if (ti.byte_offset + ti.nbytes > rest.size()) std::abort();  // accepted, but outside the file
        Array a = st.get(name);
        if (a.nbytes() != ti.nbytes) std::abort();
      }
    });
  } else {
    const auto folder = dir / "sharded";
    static const bool made = [&] {
      std::filesystem::create_directories(folder);
      std::filesystem::copy_file(fuzz::source_path("tests/fixtures/models/llama/model.safetensors"),
                                 folder / "model-00001-of-00001.safetensors",
                                 std::filesystem::copy_options::overwrite_existing);
      return true;
    }();
    (void)made;
    fuzz::write_bytes(folder / "model.safetensors.index.json", rest);
    fuzz::expect_clean([&] {
      SafeTensors st = SafeTensors::open(folder);
      (void)st.total_bytes();
    });
  }
  return 0;
}
