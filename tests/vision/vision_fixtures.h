#pragma once
// The test images of tests/fixtures/vision (made by tools/make_vision_fixtures.py) and the
// helpers the vision suites share.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "support/test_util.h"

namespace osprey::testing {

inline std::filesystem::path vision_fixtures() { return source_dir() / "tests/fixtures/vision"; }

// A file's bytes, as decode_image takes them.
inline std::vector<uint8_t> file_bytes(const std::filesystem::path& p) {
  const std::string s = read_file(p);
  return std::vector<uint8_t>(s.begin(), s.end());
}

// The bytes of images/<file>.
inline std::vector<uint8_t> image_bytes(const std::string& file) { return file_bytes(vision_fixtures() / "images" / file); }

// reference.safetensors: each test image as Pillow and transformers see it.
inline SafeTensors vision_reference() { return SafeTensors::open_file(vision_fixtures() / "reference.safetensors"); }

// Gemma3ForConditionalGeneration's config around the text model `text`: a 28-pixel SigLIP of
// 14-pixel patches, 4 soft tokens an image, image token 250.
inline nlohmann::json tiny_gemma3_vlm_config(const nlohmann::json& text) {
  nlohmann::json c = {{"model_type", "gemma3"},
                      {"text_config", text},
                      {"mm_tokens_per_image", 4},
                      {"image_token_index", 250},
                      {"vision_config",
                       {{"hidden_size", 32}, {"intermediate_size", 48}, {"num_hidden_layers", 1},
                        {"num_attention_heads", 4}, {"image_size", 28}, {"patch_size", 14}}}};
  c["text_config"].erase("model_type");
  return c;
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
