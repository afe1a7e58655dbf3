#pragma once
// An RGB image to a vision tower's input, as transformers' PIL-based Gemma3ImageProcessor
// makes it: resize to height x width with Pillow's bilinear filter (its two-pass resampler,
// 8-bit between and after the passes), rescale by 1/255 (in double, then float32), normalize
// (x - mean) / std in float32, channels first.
#include <array>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "core/array.h"
#include "vision/image_decode.h"

namespace osprey {

// The image processor's settings (preprocessor_config.json).
struct ImageProcessorConfig {
  int64_t height = 896;
  int64_t width = 896;
  bool do_resize = true;
  bool do_rescale = true;
  double rescale_factor = 1.0 / 255.0;
  bool do_normalize = true;
  std::array<double, 3> image_mean{0.5, 0.5, 0.5};
  std::array<double, 3> image_std{0.5, 0.5, 0.5};
  // Pan-and-scan (Gemma3ImageProcessor's; off by default, as there): an image whose aspect
  // ratio reaches min_ratio_to_activate is also cut into 2 to max_num_crops crops along its
  // longer side, each at least min_crop_size pixels, which the model sees after the whole
  // image. The defaults are Gemma3Processor's for keys the file leaves null.
  bool do_pan_and_scan = false;
  int64_t pan_and_scan_min_crop_size = 256;
  int64_t pan_and_scan_max_num_crops = 4;
  double pan_and_scan_min_ratio_to_activate = 1.2;
};

// preprocessor_config.json in `dir` when present, with Gemma3ImageProcessor's defaults for the
// keys it omits; otherwise the defaults with height and width = `image_size` (the vision
// config's). Throws InvalidInput naming the file and field for a bad value, Unsupported for a
// resample filter other than bilinear (2), do_convert_rgb false, or an image processor type
// other than Gemma3's.
ImageProcessorConfig load_image_processor_config(const std::filesystem::path& dir, int64_t image_size);

// Pillow's Image.resize(size, BILINEAR) of an RGB image (reducing_gap None, no box): each
// output pixel a separable, normalised tent filter whose support grows with the downscale
// factor, applied horizontally then vertically, each pass rounded to 8 bits.
RgbImage resize_bilinear(const RgbImage& in, int64_t width, int64_t height);

// The crops pan-and-scan cuts `image` into under `config`'s pan_and_scan_* settings (whatever
// do_pan_and_scan says: the caller decides), as Gemma3ImageProcessor.pan_and_scan does: none
// when the longer side is less than min_ratio_to_activate times the shorter, or when a crop
// would be smaller than min_crop_size; else n = round-half-up(long / short), at most
// long / min_crop_size, then clamped to [2, max_num_crops], crops of ceil(long / n) pixels
// along the longer side from 0 (the last one cut short at the edge), the whole shorter side,
// in reading order.
std::vector<RgbImage> pan_and_scan_crops(const RgbImage& image, const ImageProcessorConfig& config);

// pixel_values f32 [3, height, width] (CPU) for `image` under `config`.
Array preprocess_image(const RgbImage& image, const ImageProcessorConfig& config);

}  // namespace osprey
