#pragma once
// The test images of tests/fixtures/vision (made by tools/make_vision_fixtures.py) and the
// helpers the vision suites share.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "support/test_util.h"

namespace osprey::testing {

inline std::filesystem::path vision_fixtures() { return source_dir() / "tests/fixtures/vision"; }

// A file's bytes, as decode_image takes them.
inline std::vector<uint8_t> file_bytes(const std::filesystem::path& p) {
  const std::string s = read_file(p);
  return std::vector<uint8_t>(s.begin(), s.end());
}

// Each test image: its name in reference.safetensors and its file under images/.
struct VisionImage {
  const char* name;
  const char* file;
};
inline constexpr VisionImage kVisionImages[] = {
    {"png_rgb_64x48", "png_rgb_64x48.png"},
    {"png_rgba_40x60", "png_rgba_40x60.png"},
    {"png_palette_33x17", "png_palette_33x17.png"},
    {"png_gray_50x50", "png_gray_50x50.png"},
    {"jpeg_rgb_120x80", "jpeg_rgb_120x80.jpg"},
    {"jpeg_gray_31x45", "jpeg_gray_31x45.jpg"},
    {"jpeg_progressive_300x200", "jpeg_progressive_300x200.jpg"},
    {"webp_lossy_96x64", "webp_lossy_96x64.webp"},
    {"webp_lossless_alpha_45x30", "webp_lossless_alpha_45x30.webp"},
    {"gif_40x25", "gif_40x25.gif"},
};

}  // namespace osprey::testing
