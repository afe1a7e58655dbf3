#pragma once
// Where a Gemma 3 prompt's images go, as transformers' Gemma3Processor lays them out: the text
// holds one "<start_of_image>" marker per image (the chat template writes one for each image
// part), and each marker becomes "\n\n<start_of_image>", mm_tokens_per_image
// "<image_soft_token>" and "<end_of_image>\n\n"; the soft tokens then replace the image tokens.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "vision/vision_tower.h"

namespace osprey {

inline constexpr const char* kImageMarker = "<start_of_image>";
inline constexpr const char* kImageToken = "<image_soft_token>";
inline constexpr const char* kImageEnd = "<end_of_image>";

// `text` with each image marker expanded. Throws InvalidInput when the text holds another
// number of markers than `n_images` (naming both), or already holds image tokens.
std::string expand_image_markers(const std::string& text, const VisionConfig& config, size_t n_images);
// The same where image i has n_crops[i] pan-and-scan crops (0: expanded as above). An image
// with crops becomes, as Gemma3Processor writes it, "Here is the original image " + its
// expansion + " and here are some crops to help you see better " + one expansion per crop,
// separated by spaces.
std::string expand_image_markers(const std::string& text, const VisionConfig& config, std::span<const size_t> n_crops);

// What a prompt's images become for the tower: each image, then its pan-and-scan crops, in
// order (the prompt holds an image's tokens for each view), and each image's crop count.
struct ImageViews {
  std::vector<RgbImage> views;
  std::vector<size_t> n_crops;
};
// `pan_and_scan[i]`: whether image i is cut (empty: processor.do_pan_and_scan for every one).
ImageViews image_views(std::vector<RgbImage> images, const ImageProcessorConfig& processor,
                       const std::vector<bool>& pan_and_scan = {});

// The first position of each image in `ids`: a run of config.image_token_id of exactly
// mm_tokens_per_image ids, right after config.boi_token_id and right before
// config.eoi_token_id. Throws InvalidInput naming the position of a run of another length or
// without its begin or end token.
std::vector<int64_t> image_token_runs(std::span<const int32_t> ids, const VisionConfig& config);

// The prompt cache's salt for a prompt holding these images (their bytes themselves, in order,
// appended to the request's salt): a cached prefix is reused only for the same images. Empty
// for no images.
std::string image_cache_salt(const std::vector<std::string>& image_bytes);

// The prompt's image spans: image i preprocessed as `encoder`'s processor says and encoded by
// its tower, at starts[i] (the runs image_token_runs found). Runs the tower on its device, so a
// server calls it on its engine thread. Throws InvalidInput when the counts differ (naming both).
std::vector<ImageSpan> encode_prompt_images(const ImageEncoder& encoder, std::span<const int64_t> starts,
                                            std::span<const RgbImage> images);

}  // namespace osprey
