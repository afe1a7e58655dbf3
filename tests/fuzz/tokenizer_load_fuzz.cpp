// tokenizer.json loading on arbitrary bytes; a tokenizer that loads must then encode and
// decode a fixed text and every id it has without failing.
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

using namespace osprey;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto dir = fuzz::scratch_dir() / "tokenizer";
  std::filesystem::create_directories(dir);
  fuzz::write_bytes(dir / "tokenizer.json", std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::expect_clean([&] {
    const Tokenizer t = Tokenizer::load(dir);
    const std::vector<int32_t> ids = t.encode("Hello, world! 123 <|x|> \xc3\xa9\xe2\x82\xac", true, true);
    (void)t.decode(ids);
    std::vector<int32_t> all;
    for (int32_t id = 0; id < int32_t(t.vocab_size()) && id < 4096; ++id) all.push_back(id);
    (void)t.decode(all);
  });
  return 0;
}
