#include "vision/image_prompt.h"

#include "core/error.h"

namespace osprey {
namespace {

size_t image_marker_count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

}  // namespace

std::string expand_image_markers(const std::string& text, const VisionConfig& config, size_t n_images) {
  const std::vector<size_t> none(n_images, 0);
  return expand_image_markers(text, config, std::span<const size_t>(none));
}

std::string expand_image_markers(const std::string& text, const VisionConfig& config, std::span<const size_t> n_crops) {
  const size_t n_images = n_crops.size();
  const size_t markers = image_marker_count(text, kImageMarker);
  if (markers != n_images)
    throw InvalidInput("the prompt holds " + std::to_string(markers) + " image marker" + (markers == 1 ? "" : "s") +
                       " (" + kImageMarker + ") for " + std::to_string(n_images) + " image" +
                       (n_images == 1 ? "" : "s") + ": put one where each image goes");
  if (image_marker_count(text, kImageToken) > 0 || image_marker_count(text, kImageEnd) > 0)
    throw InvalidInput(std::string("the prompt holds ") + kImageToken + " or " + kImageEnd +
                       " already: write only the marker " + kImageMarker + " where an image goes");
  std::string image;
  for (int64_t i = 0; i < config.mm_tokens_per_image; ++i) image += kImageToken;
  const std::string expansion = std::string("\n\n") + kImageMarker + image + kImageEnd + "\n\n";
  std::string out;
  size_t from = 0, i = 0;
  for (size_t at = text.find(kImageMarker); at != std::string::npos; at = text.find(kImageMarker, from), ++i) {
    out += text.substr(from, at - from);
    if (n_crops[i] == 0) {
      out += expansion;
    } else {
      out += "Here is the original image " + expansion + " and here are some crops to help you see better ";
      for (size_t c = 0; c < n_crops[i]; ++c) out += (c > 0 ? " " : "") + expansion;
    }
    from = at + std::string(kImageMarker).size();
  }
  out += text.substr(from);
  return out;
}

ImageViews image_views(std::vector<RgbImage> images, const ImageProcessorConfig& processor,
                       const std::vector<bool>& pan_and_scan) {
  if (!pan_and_scan.empty() && pan_and_scan.size() != images.size())
    throw InvalidInput("image_views: " + std::to_string(pan_and_scan.size()) + " pan-and-scan choices for " +
                       std::to_string(images.size()) + " images");
  ImageViews v;
  for (size_t i = 0; i < images.size(); ++i) {
    const bool cut = pan_and_scan.empty() ? processor.do_pan_and_scan : pan_and_scan[i];
    std::vector<RgbImage> crops = cut ? pan_and_scan_crops(images[i], processor) : std::vector<RgbImage>{};
    v.n_crops.push_back(crops.size());
    v.views.push_back(std::move(images[i]));
    for (RgbImage& c : crops) v.views.push_back(std::move(c));
  }
  return v;
}

std::vector<int64_t> image_token_runs(std::span<const int32_t> ids, const VisionConfig& config) {
  std::vector<int64_t> runs;
  const int64_t n = int64_t(ids.size());
  for (int64_t i = 0; i < n;) {
    if (ids[size_t(i)] != config.image_token_id) {
      ++i;
      continue;
    }
    int64_t j = i;
    while (j < n && ids[size_t(j)] == config.image_token_id) ++j;
    const std::string where = "image tokens (id " + std::to_string(config.image_token_id) + ") at positions [" +
                              std::to_string(i) + ", " + std::to_string(j) + ")";
    if (j - i != config.mm_tokens_per_image)
      throw InvalidInput(where + ": an image takes exactly " + std::to_string(config.mm_tokens_per_image) +
                         " (mm_tokens_per_image)");
    if (i == 0 || ids[size_t(i - 1)] != config.boi_token_id)
      throw InvalidInput(where + ": not preceded by the begin-of-image token " + std::to_string(config.boi_token_id));
    if (j == n || ids[size_t(j)] != config.eoi_token_id)
      throw InvalidInput(where + ": not followed by the end-of-image token " + std::to_string(config.eoi_token_id));
    runs.push_back(i);
    i = j;
  }
  return runs;
}

std::vector<ImageSpan> encode_prompt_images(const ImageEncoder& encoder, std::span<const int64_t> starts,
                                            std::span<const RgbImage> images) {
  if (starts.size() != images.size())
    throw InvalidInput("the prompt holds the tokens of " + std::to_string(starts.size()) + " image(s) for " +
                       std::to_string(images.size()) + " image(s) given");
  std::vector<ImageSpan> spans;
  for (size_t i = 0; i < images.size(); ++i)
    spans.push_back({starts[i], encoder.tower->encode(preprocess_image(images[i], encoder.processor))});
  return spans;
}

std::string image_cache_salt(const std::vector<std::string>& image_bytes) {
  // The bytes themselves, each after its length: equal salts mean equal images (no hash
  // decides).
  std::string salt;
  for (const std::string& b : image_bytes) salt += "\x01image:" + std::to_string(b.size()) + ":" + b;
  return salt;
}

}  // namespace osprey
