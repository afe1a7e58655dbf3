#pragma once
// Image files to RGB pixels: PNG (libpng), JPEG (libjpeg-turbo), WebP (libwebp) and the first
// frame of a GIF (giflib), the format told by the file's first bytes, never by a name or a
// declared media type.
//
// The pixels are what transformers' image processors see after `convert_to_rgb` of the image
// Pillow opens: an RGB file as it is; any other (grey, palette, with alpha) composited over
// white as Pillow's alpha_composite does. Exif orientation is not applied (Pillow's open does
// not either).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace osprey {

enum class ImageFormat { png, jpeg, webp, gif };
const char* image_format_name(ImageFormat f);

// 8-bit RGB pixels, row-major: rgb[(y * width + x) * 3 + c].
struct RgbImage {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> rgb;
};

struct ImageDecodeLimits {
  // width * height above this is refused before any pixel is decoded (the header's size).
  int64_t max_pixels = 50'000'000;
};

// The format the bytes start with; throws InvalidInput naming what they look like otherwise
// ("not a PNG, JPEG, WebP or GIF image").
ImageFormat sniff_image_format(std::span<const uint8_t> bytes);

// Decodes `bytes`. Throws InvalidInput for malformed or truncated data, a size past
// `limits.max_pixels` or a zero size, and Unsupported for a well-formed image of a kind this
// does not decode (a CMYK JPEG, an animated WebP, 16-bit grey PNG); each message names the
// format and the problem.
RgbImage decode_image(std::span<const uint8_t> bytes, const ImageDecodeLimits& limits = {});

// Pillow's alpha_composite of an RGBA pixel over opaque white, as convert_to_rgb applies it:
// the RGB written to out[0..2].
void composite_over_white(const uint8_t rgba[4], uint8_t out[3]);

}  // namespace osprey
