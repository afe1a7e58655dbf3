#include "vision/image_decode.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>

#include <gif_lib.h>
#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>

#include "core/error.h"

namespace osprey {
namespace {

[[noreturn]] void malformed(ImageFormat f, const std::string& what) {
  throw InvalidInput(std::string("image: malformed or truncated ") + image_format_name(f) + " data: " + what);
}

void check_size(ImageFormat f, int64_t width, int64_t height, const ImageDecodeLimits& limits) {
  if (width <= 0 || height <= 0)
    malformed(f, "size " + std::to_string(width) + "x" + std::to_string(height));
  if (width > limits.max_pixels / height)
    throw InvalidInput(std::string("image: ") + image_format_name(f) + " of " + std::to_string(width) + "x" +
                       std::to_string(height) + " pixels is too large (at most " + std::to_string(limits.max_pixels) +
                       " pixels)");
}

// RGBA rows [height * width * 4] to RGB, each pixel composited over white.
RgbImage from_rgba(int64_t width, int64_t height, const std::vector<uint8_t>& rgba) {
  RgbImage img{width, height, std::vector<uint8_t>(size_t(width * height * 3))};
  for (int64_t i = 0; i < width * height; ++i) composite_over_white(&rgba[size_t(i * 4)], &img.rgb[size_t(i * 3)]);
  return img;
}

// ---- PNG (libpng; its errors longjmp back here, so this function holds no C++ objects that
// need destructors between setjmp and the return).

struct PngInput {
  const uint8_t* data;
  size_t size, at;
};

void png_read_mem(png_structp png, png_bytep out, png_size_t n) {
  auto* in = static_cast<PngInput*>(png_get_io_ptr(png));
  if (in->size - in->at < n) png_error(png, "the file ends early");
  std::memcpy(out, in->data + in->at, n);
  in->at += n;
}

struct PngState {
  char message[200] = {};
};

void png_on_error(png_structp png, png_const_charp msg) {
  auto* st = static_cast<PngState*>(png_get_error_ptr(png));
  std::snprintf(st->message, sizeof st->message, "%s", msg);
  png_longjmp(png, 1);
}
void png_on_warning(png_structp, png_const_charp) {}

// What the header says, read before any pixels are decoded.
struct PngHeader {
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, color_type = 0;
  bool has_trns = false;
};

// Returns 0 on success (out holds RGBA or RGB rows as `*channels` says), else 1 with
// st->message set. `stage` 0: header only; 1: pixels into `out` (sized by the caller).
int png_run(PngInput* in, PngState* st, PngHeader* h, int stage, uint8_t* out, int* channels) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, st, png_on_error, png_on_warning);
  if (!png) {
    std::snprintf(st->message, sizeof st->message, "libpng could not start");
    return 1;
  }
  png_infop info = png_create_info_struct(png);
  png_bytep* volatile rows = nullptr;
  if (!info || setjmp(png_jmpbuf(png))) {
    std::free(rows);
    png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
    if (!st->message[0]) std::snprintf(st->message, sizeof st->message, "libpng failed");
    return 1;
  }
  png_set_read_fn(png, in, png_read_mem);
  // Pillow decodes past bad CRCs of ancillary chunks only; libpng's defaults agree.
  png_read_info(png, info);
  h->width = png_get_image_width(png, info);
  h->height = png_get_image_height(png, info);
  h->bit_depth = png_get_bit_depth(png, info);
  h->color_type = png_get_color_type(png, info);
  h->has_trns = png_get_valid(png, info, PNG_INFO_tRNS) != 0;
  if (stage == 0) {
    png_destroy_read_struct(&png, &info, nullptr);
    return 0;
  }
  // Pillow: 16-bit samples keep their high byte; grey, grey+alpha and palette images become
  // RGBA (a tRNS chunk as alpha) before the composite; an RGB image ignores tRNS.
  const bool rgb = h->color_type == PNG_COLOR_TYPE_RGB;
  if (h->bit_depth == 16) png_set_strip_16(png);
  if (h->color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (h->color_type == PNG_COLOR_TYPE_GRAY && h->bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (h->color_type == PNG_COLOR_TYPE_GRAY || h->color_type == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  if (!rgb && h->has_trns) png_set_tRNS_to_alpha(png);
  if (!rgb && !(h->color_type & PNG_COLOR_MASK_ALPHA) && !h->has_trns) png_set_add_alpha(png, 0xff, PNG_FILLER_AFTER);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  *channels = png_get_channels(png, info);
  const size_t row_bytes = png_get_rowbytes(png, info);
  if (row_bytes != size_t(h->width) * size_t(*channels) || (*channels != 3 && *channels != 4) ||
      png_get_bit_depth(png, info) != 8)
    png_error(png, "unexpected pixel layout after conversion");
  rows = static_cast<png_bytep*>(std::malloc(sizeof(png_bytep) * h->height));
  if (!rows) png_error(png, "out of memory");
  for (png_uint_32 y = 0; y < h->height; ++y) rows[y] = out + size_t(y) * row_bytes;
  png_read_image(png, rows);
  png_read_end(png, nullptr);
  std::free(rows);
  rows = nullptr;
  png_destroy_read_struct(&png, &info, nullptr);
  return 0;
}

RgbImage decode_png(std::span<const uint8_t> bytes, const ImageDecodeLimits& limits) {
  PngInput in{bytes.data(), bytes.size(), 0};
  PngState st;
  PngHeader h;
  int channels = 0;
  if (png_run(&in, &st, &h, 0, nullptr, &channels) != 0) malformed(ImageFormat::png, st.message);
  check_size(ImageFormat::png, h.width, h.height, limits);
  if (h.bit_depth == 16 && (h.color_type == PNG_COLOR_TYPE_GRAY || h.color_type == PNG_COLOR_TYPE_GRAY_ALPHA))
    throw Unsupported("image: 16-bit greyscale PNG is not supported (8-bit grey, and RGB of 8 or 16 bits, are)");
  const bool rgb = h.color_type == PNG_COLOR_TYPE_RGB;
  std::vector<uint8_t> pixels(size_t(h.width) * h.height * (rgb ? 3 : 4));
  in.at = 0;
  if (png_run(&in, &st, &h, 1, pixels.data(), &channels) != 0) malformed(ImageFormat::png, st.message);
  if (channels == 3) return RgbImage{h.width, h.height, std::move(pixels)};
  return from_rgba(h.width, h.height, pixels);
}

// ---- JPEG (libjpeg-turbo; errors longjmp as PNG's do).

struct JpegError {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_on_error(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}
// Counts warnings (as libjpeg's own does) without printing them.
void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level < 0) ++cinfo->err->num_warnings;
}

enum class JpegOutcome { ok, failed, cmyk };

// stage 0: header (width, height); stage 1: RGB pixels into out. A corrupt-data warning
// (libjpeg goes on with grey blocks) counts as a failure: the file is damaged.
JpegOutcome jpeg_run(const uint8_t* data, size_t size, JpegError* err, int stage, int64_t* w, int64_t* h,
                     uint8_t* out) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&err->mgr);
  err->mgr.error_exit = jpeg_on_error;
  err->mgr.emit_message = jpeg_on_message;
  if (setjmp(err->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return JpegOutcome::failed;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  *w = cinfo.image_width;
  *h = cinfo.image_height;
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    return JpegOutcome::cmyk;
  }
  if (stage == 0) {
    jpeg_destroy_decompress(&cinfo);
    return JpegOutcome::ok;
  }
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  const size_t stride = size_t(cinfo.output_width) * 3;
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out + size_t(cinfo.output_scanline) * stride;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  if (err->mgr.num_warnings > 0) {
    std::snprintf(err->message, sizeof err->message, "corrupt data (libjpeg warned %ld times)", err->mgr.num_warnings);
    jpeg_destroy_decompress(&cinfo);
    return JpegOutcome::failed;
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return JpegOutcome::ok;
}

RgbImage decode_jpeg(std::span<const uint8_t> bytes, const ImageDecodeLimits& limits) {
  JpegError err{};
  int64_t w = 0, h = 0;
  JpegOutcome r = jpeg_run(bytes.data(), bytes.size(), &err, 0, &w, &h, nullptr);
  if (r == JpegOutcome::failed) malformed(ImageFormat::jpeg, err.message);
  if (r == JpegOutcome::cmyk) throw Unsupported("image: CMYK JPEG is not supported (RGB and greyscale JPEG are)");
  check_size(ImageFormat::jpeg, w, h, limits);
  RgbImage img{w, h, std::vector<uint8_t>(size_t(w * h * 3))};
  err = JpegError{};
  r = jpeg_run(bytes.data(), bytes.size(), &err, 1, &w, &h, img.rgb.data());
  if (r != JpegOutcome::ok) malformed(ImageFormat::jpeg, err.message);
  return img;
}

// ---- WebP (libwebp: plain return codes).

RgbImage decode_webp(std::span<const uint8_t> bytes, const ImageDecodeLimits& limits) {
  WebPBitstreamFeatures f;
  const VP8StatusCode st = WebPGetFeatures(bytes.data(), bytes.size(), &f);
  if (st == VP8_STATUS_NOT_ENOUGH_DATA) malformed(ImageFormat::webp, "the file ends early");
  if (st != VP8_STATUS_OK) malformed(ImageFormat::webp, "bad header (libwebp status " + std::to_string(int(st)) + ")");
  if (f.has_animation) throw Unsupported("image: animated WebP is not supported (a still WebP is)");
  check_size(ImageFormat::webp, f.width, f.height, limits);
  const int64_t w = f.width, h = f.height;
  std::vector<uint8_t> pixels(size_t(w * h * (f.has_alpha ? 4 : 3)));
  const int stride = int(w * (f.has_alpha ? 4 : 3));
  const uint8_t* ok = f.has_alpha ? WebPDecodeRGBAInto(bytes.data(), bytes.size(), pixels.data(), pixels.size(), stride)
                                  : WebPDecodeRGBInto(bytes.data(), bytes.size(), pixels.data(), pixels.size(), stride);
  if (!ok) malformed(ImageFormat::webp, "libwebp could not decode the pixels");
  if (!f.has_alpha) return RgbImage{w, h, std::move(pixels)};
  return from_rgba(w, h, pixels);
}

// ---- GIF (giflib: return codes). The first frame only.

struct GifInput {
  const uint8_t* data;
  size_t size, at;
};

int gif_read_mem(GifFileType* gif, GifByteType* out, int n) {
  auto* in = static_cast<GifInput*>(gif->UserData);
  const size_t k = std::min(size_t(n), in->size - in->at);
  std::memcpy(out, in->data + in->at, k);
  in->at += k;
  return int(k);
}

struct GifCloser {
  GifFileType* gif;
  ~GifCloser() {
    int err = 0;
    if (gif) DGifCloseFile(gif, &err);
  }
};

[[noreturn]] void gif_failed(int code) {
  const char* what = GifErrorString(code);
  malformed(ImageFormat::gif, what ? what : "giflib error " + std::to_string(code));
}

RgbImage decode_gif(std::span<const uint8_t> bytes, const ImageDecodeLimits& limits) {
  GifInput in{bytes.data(), bytes.size(), 0};
  int err = 0;
  GifFileType* gif = DGifOpen(&in, gif_read_mem, &err);
  if (!gif) gif_failed(err);
  GifCloser closer{gif};
  check_size(ImageFormat::gif, gif->SWidth, gif->SHeight, limits);
  const int64_t w = gif->SWidth, h = gif->SHeight;
  int transparent = -1;
  for (;;) {
    GifRecordType type;
    if (DGifGetRecordType(gif, &type) == GIF_ERROR) gif_failed(gif->Error);
    if (type == TERMINATE_RECORD_TYPE) malformed(ImageFormat::gif, "no image in the file");
    if (type == EXTENSION_RECORD_TYPE) {
      int code = 0;
      GifByteType* ext = nullptr;
      if (DGifGetExtension(gif, &code, &ext) == GIF_ERROR) gif_failed(gif->Error);
      if (code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] >= 4) {
        GraphicsControlBlock gcb;
        DGifExtensionToGCB(ext[0], ext + 1, &gcb);
        transparent = gcb.TransparentColor;
      }
      while (ext) {
        if (DGifGetExtensionNext(gif, &ext) == GIF_ERROR) gif_failed(gif->Error);
      }
      continue;
    }
    if (type != IMAGE_DESC_RECORD_TYPE) continue;
    if (DGifGetImageDesc(gif) == GIF_ERROR) gif_failed(gif->Error);
    const GifImageDesc& d = gif->Image;
    const ColorMapObject* map = d.ColorMap ? d.ColorMap : gif->SColorMap;
    if (!map) malformed(ImageFormat::gif, "no colour table");
    if (d.Left < 0 || d.Top < 0 || d.Width <= 0 || d.Height <= 0 || d.Left + d.Width > w || d.Top + d.Height > h)
      malformed(ImageFormat::gif, "the first frame lies outside the " + std::to_string(w) + "x" + std::to_string(h) +
                                      " screen");
    // Outside the first frame: transparent where the frame has a transparent colour, else
    // the background colour.
    std::vector<uint8_t> rgba(size_t(w * h * 4), 0);
    if (transparent < 0) {
      const int bg = gif->SBackGroundColor < map->ColorCount ? gif->SBackGroundColor : 0;
      for (int64_t i = 0; i < w * h; ++i) {
        const GifColorType& c = map->Colors[bg];
        uint8_t* p = &rgba[size_t(i * 4)];
        p[0] = c.Red, p[1] = c.Green, p[2] = c.Blue, p[3] = 255;
      }
    }
    std::vector<GifPixelType> line(size_t(d.Width));
    auto put_row = [&](int64_t y) {
      if (DGifGetLine(gif, line.data(), d.Width) == GIF_ERROR) gif_failed(gif->Error);
      for (int64_t x = 0; x < d.Width; ++x) {
        const int idx = line[size_t(x)];
        uint8_t* p = &rgba[size_t(((d.Top + y) * w + d.Left + x) * 4)];
        if (idx == transparent) {
          p[0] = p[1] = p[2] = p[3] = 0;
          continue;
        }
        if (idx >= map->ColorCount) malformed(ImageFormat::gif, "a pixel names colour " + std::to_string(idx) +
                                                                    " of a table of " + std::to_string(map->ColorCount));
        const GifColorType& c = map->Colors[idx];
        p[0] = c.Red, p[1] = c.Green, p[2] = c.Blue, p[3] = 255;
      }
    };
    if (d.Interlace) {
      static constexpr int kStart[4] = {0, 4, 2, 1}, kStep[4] = {8, 8, 4, 2};
      for (int pass = 0; pass < 4; ++pass)
        for (int64_t y = kStart[pass]; y < d.Height; y += kStep[pass]) put_row(y);
    } else {
      for (int64_t y = 0; y < d.Height; ++y) put_row(y);
    }
    return from_rgba(w, h, rgba);
  }
}

}  // namespace

const char* image_format_name(ImageFormat f) {
  switch (f) {
    case ImageFormat::png: return "PNG";
    case ImageFormat::jpeg: return "JPEG";
    case ImageFormat::webp: return "WebP";
    case ImageFormat::gif: return "GIF";
  }
  return "?";
}

void composite_over_white(const uint8_t rgba[4], uint8_t out[3]) {
  // Pillow's AlphaComposite.c with an opaque white destination: 7 bits of extra precision,
  // divisions by 255 as shifts.
  const uint32_t a = rgba[3];
  if (a == 0) {
    out[0] = out[1] = out[2] = 255;
    return;
  }
  constexpr uint32_t kBits = 7;
  const uint32_t blend = 255 * (255 - a);
  const uint32_t outa255 = a * 255 + blend;
  const uint32_t coef1 = a * 255 * 255 * (1u << kBits) / outa255;
  const uint32_t coef2 = 255 * (1u << kBits) - coef1;
  for (int c = 0; c < 3; ++c) {
    const uint32_t t = rgba[c] * coef1 + 255 * coef2 + (0x80u << kBits);
    out[c] = uint8_t((((t >> 8) + t) >> 8) >> kBits);
  }
}

ImageFormat sniff_image_format(std::span<const uint8_t> b) {
  auto starts = [&](const char* magic, size_t at = 0) {
    const size_t n = std::strlen(magic);
    return b.size() >= at + n && std::memcmp(b.data() + at, magic, n) == 0;
  };
  if (starts("\x89PNG\r\n\x1a\n")) return ImageFormat::png;
  if (b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return ImageFormat::jpeg;
  if (starts("RIFF") && starts("WEBP", 8)) return ImageFormat::webp;
  if (starts("GIF87a") || starts("GIF89a")) return ImageFormat::gif;
  if (b.empty()) throw InvalidInput("image: no data (0 bytes)");
  std::string what = "not a PNG, JPEG, WebP or GIF image";
  if (starts("BM")) what += " (it looks like a BMP)";
  else if (starts("II*") || starts("MM")) what += " (it looks like a TIFF)";
  else if (starts("ftyp", 4)) what += " (it looks like HEIF/AVIF)";
  else if (starts("<")) what += " (it looks like text: SVG or HTML?)";
  throw InvalidInput("image: " + what);
}

RgbImage decode_image(std::span<const uint8_t> bytes, const ImageDecodeLimits& limits) {
  switch (sniff_image_format(bytes)) {
    case ImageFormat::png: return decode_png(bytes, limits);
    case ImageFormat::jpeg: return decode_jpeg(bytes, limits);
    case ImageFormat::webp: return decode_webp(bytes, limits);
    case ImageFormat::gif: return decode_gif(bytes, limits);
  }
  throw InvalidInput("image: unknown format");
}

}  // namespace osprey
