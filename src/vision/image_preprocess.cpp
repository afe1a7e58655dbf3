#include "vision/image_preprocess.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "formats/config_reader.h"

namespace osprey {
namespace {

// Pillow's resampler for 8-bit images (libImaging/Resample.c): coefficients in double,
// normalised per output pixel, then fixed point with 22 fractional bits.
constexpr int kPrecisionBits = 32 - 8 - 2;

struct Taps {
  int64_t ksize = 0;
  std::vector<int64_t> first, count;  // per output pixel: the first input index and how many
  std::vector<int32_t> k;             // [out, ksize] fixed-point weights
};

double bilinear(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

Taps bilinear_taps(int64_t in_size, int64_t out_size) {
  const double scale = double(in_size) / double(out_size);
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;  // the bilinear filter's support is 1
  Taps t;
  t.ksize = int64_t(std::ceil(support)) * 2 + 1;
  t.first.resize(size_t(out_size));
  t.count.resize(size_t(out_size));
  t.k.assign(size_t(out_size * t.ksize), 0);
  std::vector<double> w(size_t(t.ksize));
  for (int64_t o = 0; o < out_size; ++o) {
    const double center = (double(o) + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    // C's (int) conversion truncates toward zero, as Pillow's does.
    int64_t lo = int64_t(center - support + 0.5);
    if (lo < 0) lo = 0;
    int64_t hi = int64_t(center + support + 0.5);
    if (hi > in_size) hi = in_size;
    const int64_t n = hi - lo;
    double sum = 0.0;
    for (int64_t x = 0; x < n; ++x) {
      w[size_t(x)] = bilinear((double(x + lo) - center + 0.5) * ss);
      sum += w[size_t(x)];
    }
    for (int64_t x = 0; x < n; ++x) {
      double v = w[size_t(x)];
      if (sum != 0.0) v /= sum;
      t.k[size_t(o * t.ksize + x)] = v < 0 ? int32_t(-0.5 + v * (1 << kPrecisionBits))
                                           : int32_t(0.5 + v * (1 << kPrecisionBits));
    }
    t.first[size_t(o)] = lo;
    t.count[size_t(o)] = n;
  }
  return t;
}

uint8_t clip8(int32_t acc) {
  const int32_t v = acc >> kPrecisionBits;  // arithmetic shift: floor
  return uint8_t(std::clamp(v, 0, 255));
}

// One pass along x (along=0) or y (along=1): in [h, w, 3] -> out.
RgbImage resample_pass(const RgbImage& in, int64_t out_size, int along) {
  const int64_t in_size = along == 0 ? in.width : in.height;
  const Taps t = bilinear_taps(in_size, out_size);
  RgbImage out;
  out.width = along == 0 ? out_size : in.width;
  out.height = along == 0 ? in.height : out_size;
  out.rgb.resize(size_t(out.width * out.height * 3));
  for (int64_t y = 0; y < out.height; ++y)
    for (int64_t x = 0; x < out.width; ++x) {
      const int64_t o = along == 0 ? x : y;
      const int32_t* k = &t.k[size_t(o * t.ksize)];
      int32_t acc[3] = {1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1)};
      for (int64_t j = 0; j < t.count[size_t(o)]; ++j) {
        const int64_t src = t.first[size_t(o)] + j;
        const uint8_t* p = along == 0 ? &in.rgb[size_t((y * in.width + src) * 3)] : &in.rgb[size_t((src * in.width + x) * 3)];
        for (int c = 0; c < 3; ++c) acc[c] += int32_t(p[c]) * k[j];
      }
      uint8_t* q = &out.rgb[size_t((y * out.width + x) * 3)];
      for (int c = 0; c < 3; ++c) q[c] = clip8(acc[c]);
    }
  return out;
}

std::array<double, 3> three_floats(const ConfigReader& c, const std::string& key, std::array<double, 3> fallback) {
  if (!c.has(key)) return fallback;
  const nlohmann::json& v = c.json()[key];
  if (v.is_number()) return {v.get<double>(), v.get<double>(), v.get<double>()};
  if (!v.is_array() || v.size() != 3 || !std::all_of(v.begin(), v.end(), [](const auto& x) { return x.is_number(); }))
    c.fail(key, "must be a number or a list of 3 numbers (one per channel), got " + v.dump());
  return {v[0].get<double>(), v[1].get<double>(), v[2].get<double>()};
}

}  // namespace

RgbImage resize_bilinear(const RgbImage& in, int64_t width, int64_t height) {
  if (width <= 0 || height <= 0 || in.width <= 0 || in.height <= 0)
    throw InvalidInput("resize_bilinear: sizes must be positive, got " + std::to_string(in.width) + "x" +
                       std::to_string(in.height) + " to " + std::to_string(width) + "x" + std::to_string(height));
  // Pillow returns a copy for an unchanged size and skips a pass whose size is unchanged.
  RgbImage out = in;
  if (width != in.width) out = resample_pass(out, width, 0);
  if (height != in.height) out = resample_pass(out, height, 1);
  return out;
}

ImageProcessorConfig load_image_processor_config(const std::filesystem::path& dir, int64_t image_size) {
  ImageProcessorConfig cfg;
  cfg.height = cfg.width = image_size;
  const std::filesystem::path path = dir / "preprocessor_config.json";
  if (!std::filesystem::exists(path)) return cfg;
  const ConfigReader c = ConfigReader::load(path);
  const std::string type = c.get_string("image_processor_type", "Gemma3ImageProcessor");
  if (type != "Gemma3ImageProcessor" && type != "Gemma3ImageProcessorFast")
    throw Unsupported(c.where() + ": field \"image_processor_type\": " + type +
                      " is not supported (Gemma3ImageProcessor is)");
  if (const auto size = c.get_object("size")) {
    cfg.height = size->get_int("height");
    cfg.width = size->get_int("width");
    if (cfg.height <= 0 || cfg.width <= 0) c.fail("size", "height and width must be positive");
  }
  if (c.has("resample") && c.get_int("resample") != 2)
    throw Unsupported(c.where() + ": field \"resample\": filter " + std::to_string(c.get_int("resample")) +
                      " is not supported (2, bilinear, is)");
  if (c.has("do_convert_rgb") && !c.get_bool("do_convert_rgb", true))
    throw Unsupported(c.where() + ": field \"do_convert_rgb\": false is not supported (images are always RGB)");
  cfg.do_pan_and_scan = c.get_bool("do_pan_and_scan", false);
  cfg.pan_and_scan_min_crop_size = c.get_int("pan_and_scan_min_crop_size", cfg.pan_and_scan_min_crop_size);
  if (cfg.pan_and_scan_min_crop_size < 1) c.fail("pan_and_scan_min_crop_size", "must be at least 1");
  cfg.pan_and_scan_max_num_crops = c.get_int("pan_and_scan_max_num_crops", cfg.pan_and_scan_max_num_crops);
  if (cfg.pan_and_scan_max_num_crops < 1) c.fail("pan_and_scan_max_num_crops", "must be at least 1");
  cfg.pan_and_scan_min_ratio_to_activate =
      c.get_float("pan_and_scan_min_ratio_to_activate", cfg.pan_and_scan_min_ratio_to_activate);
  if (!(cfg.pan_and_scan_min_ratio_to_activate > 0.0) || !std::isfinite(cfg.pan_and_scan_min_ratio_to_activate))
    c.fail("pan_and_scan_min_ratio_to_activate", "must be finite and positive");
  cfg.do_resize = c.get_bool("do_resize", true);
  cfg.do_rescale = c.get_bool("do_rescale", true);
  cfg.rescale_factor = c.get_float("rescale_factor", 1.0 / 255.0);
  cfg.do_normalize = c.get_bool("do_normalize", true);
  cfg.image_mean = three_floats(c, "image_mean", cfg.image_mean);
  cfg.image_std = three_floats(c, "image_std", cfg.image_std);
  for (double s : cfg.image_std)
    if (!(s != 0.0) || !std::isfinite(s)) c.fail("image_std", "must be finite and non-zero");
  if (!cfg.do_resize)
    throw Unsupported(c.where() + ": field \"do_resize\": false is not supported (the vision tower takes one size)");
  return cfg;
}

std::vector<RgbImage> pan_and_scan_crops(const RgbImage& image, const ImageProcessorConfig& config) {
  const bool wide = image.width >= image.height;
  const int64_t longer = wide ? image.width : image.height, shorter = wide ? image.height : image.width;
  if (shorter <= 0 || double(longer) / double(shorter) < config.pan_and_scan_min_ratio_to_activate) return {};
  // Python's int(floor(x + 0.5)) and int(floor(longer / min_crop_size)) on doubles.
  int64_t n = int64_t(std::floor(double(longer) / double(shorter) + 0.5));
  n = std::min(n, int64_t(std::floor(double(longer) / double(config.pan_and_scan_min_crop_size))));
  n = std::min(std::max<int64_t>(2, n), config.pan_and_scan_max_num_crops);
  const int64_t crop_long = int64_t(std::ceil(double(longer) / double(n)));
  if (std::min(crop_long, shorter) < config.pan_and_scan_min_crop_size) return {};
  std::vector<RgbImage> crops;
  for (int64_t i = 0; i < n; ++i) {
    // numpy's slice [at, at + crop_long) stops at the edge.
    const int64_t at = i * crop_long, len = std::min(crop_long, longer - at);
    if (len <= 0) break;  // a slice past the edge is empty; Python would pass it on and fail later
    RgbImage c;
    c.width = wide ? len : image.width;
    c.height = wide ? image.height : len;
    c.rgb.resize(size_t(c.width * c.height * 3));
    for (int64_t y = 0; y < c.height; ++y) {
      const int64_t sy = wide ? y : at + y, sx = wide ? at : 0;
      std::copy_n(&image.rgb[size_t((sy * image.width + sx) * 3)], size_t(c.width * 3), &c.rgb[size_t(y * c.width * 3)]);
    }
    crops.push_back(std::move(c));
  }
  return crops;
}

Array preprocess_image(const RgbImage& image, const ImageProcessorConfig& config) {
  const RgbImage sized =
      config.do_resize ? resize_bilinear(image, config.width, config.height) : image;
  const int64_t h = sized.height, w = sized.width;
  Array out = Array::empty({3, h, w}, DType::f32);  // channels first
  float* o = out.data<float>();
  for (int c = 0; c < 3; ++c) {
    // transformers: rescale in double, cast to float32; normalize in float32 with the mean
    // and std cast to float32.
    const float mean = float(config.image_mean[size_t(c)]), std = float(config.image_std[size_t(c)]);
    for (int64_t i = 0; i < h * w; ++i) {
      const double v = double(sized.rgb[size_t(i * 3 + c)]);
      float x = config.do_rescale ? float(v * config.rescale_factor) : float(v);
      if (config.do_normalize) x = (x - mean) / std;
      o[c * h * w + i] = x;
    }
  }
  return out;
}

}  // namespace osprey
