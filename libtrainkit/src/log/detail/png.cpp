#include "log/detail/png.h"

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <png.h>

namespace trainkit::log::detail {
namespace {

// libpng reports errors by longjmp; the functions holding setjmp have only trivially destructible
// locals, and every C++ object they touch lives in their caller.

void png_append(png_structp png, png_bytep data, png_size_t n) {
  auto* out = static_cast<std::string*>(png_get_io_ptr(png));
  out->append(reinterpret_cast<const char*>(data), n);
}

void png_no_flush(png_structp /*png*/) {}

struct PngSource {
  const std::string* bytes;
  size_t pos;
};

void png_take(png_structp png, png_bytep data, png_size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (src->bytes->size() - src->pos < n) {
    png_error(png, "unexpected end of data");
  }
  std::memcpy(data, src->bytes->data() + src->pos, n);
  src->pos += n;
}

// Error text of the last libpng failure (per thread, so writers on several threads do not mix them).
thread_local char g_png_error[256];

void png_on_error(png_structp png, png_const_charp message) {
  std::snprintf(g_png_error, sizeof g_png_error, "%s", message);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp /*png*/, png_const_charp /*message*/) {}

bool png_write_rows(const Image& image, png_bytep* rows, std::string* out) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, png_on_error, png_on_warning);
  if (png == nullptr) {
    std::snprintf(g_png_error, sizeof g_png_error, "png_create_write_struct failed");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, info != nullptr ? &info : nullptr);
    if (info == nullptr) {
      std::snprintf(g_png_error, sizeof g_png_error, "png_create_info_struct failed");
    }
    return false;
  }
  const int color_type = image.channels == 1   ? PNG_COLOR_TYPE_GRAY
                         : image.channels == 3 ? PNG_COLOR_TYPE_RGB
                                               : PNG_COLOR_TYPE_RGBA;
  png_set_write_fn(png, out, png_append, png_no_flush);
  png_set_IHDR(png, info, static_cast<png_uint_32>(image.width), static_cast<png_uint_32>(image.height), 8,
               color_type, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  png_write_image(png, rows);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return true;
}

/// Reads the header into `image` (no pixels) and, when `rows` is given, the pixels into those rows.
bool png_read(PngSource* src, Image* image, std::vector<png_bytep>* rows) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, nullptr, png_on_error, png_on_warning);
  if (png == nullptr) {
    std::snprintf(g_png_error, sizeof g_png_error, "png_create_read_struct failed");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr || setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr);
    if (info == nullptr) {
      std::snprintf(g_png_error, sizeof g_png_error, "png_create_info_struct failed");
    }
    return false;
  }
  png_set_read_fn(png, src, png_take);
  png_read_info(png, info);
  const int depth = png_get_bit_depth(png, info);
  const int color = png_get_color_type(png, info);
  const int channels = color == PNG_COLOR_TYPE_GRAY ? 1 : color == PNG_COLOR_TYPE_RGB ? 3 : color == PNG_COLOR_TYPE_RGBA ? 4 : 0;
  if (depth != 8 || channels == 0 || png_get_interlace_type(png, info) != PNG_INTERLACE_NONE) {
    std::snprintf(g_png_error, sizeof g_png_error,
                  "only 8-bit, non-interlaced gray, RGB or RGBA PNGs are supported (bit depth %d, color type %d)",
                  depth, color);
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  image->height = png_get_image_height(png, info);
  image->width = png_get_image_width(png, info);
  image->channels = channels;
  if (rows != nullptr) {
    png_read_image(png, rows->data());
    png_read_end(png, nullptr);
  }
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

void check_image(const Image& image, const char* who) {
  if (image.height < 1 || image.width < 1 || image.height > 0x7fffffff || image.width > 0x7fffffff) {
    throw std::invalid_argument(fmt::format("{}: invalid image size {}x{}", who, image.height, image.width));
  }
  if (image.channels != 1 && image.channels != 3 && image.channels != 4) {
    throw std::invalid_argument(fmt::format("{}: {} channels (need 1, 3 or 4)", who, image.channels));
  }
  const auto expected = static_cast<size_t>(image.height * image.width * image.channels);
  if (image.pixels.size() != expected) {
    throw std::invalid_argument(fmt::format("{}: {} bytes of pixels for a {}x{}x{} image (need {})", who,
                                            image.pixels.size(), image.height, image.width, image.channels,
                                            expected));
  }
}

}  // namespace

std::string encode_png(const Image& image) {
  check_image(image, "encode_png");
  std::vector<png_bytep> rows(static_cast<size_t>(image.height));
  const auto stride = static_cast<size_t>(image.width * image.channels);
  for (size_t r = 0; r < rows.size(); ++r) {
    // libpng's row pointers are not const, but png_write_image only reads them.
    rows[r] = const_cast<png_bytep>(image.pixels.data() + r * stride);  // NOLINT(cppcoreguidelines-pro-type-const-cast)
  }
  std::string out;
  if (!png_write_rows(image, rows.data(), &out)) {
    throw std::runtime_error(fmt::format("encode_png: libpng failed: {}", g_png_error));
  }
  return out;
}

Image decode_png(const std::string& png) {
  Image image;
  PngSource header{&png, 0};
  if (!png_read(&header, &image, nullptr)) {
    throw std::runtime_error(fmt::format("decode_png: {}", g_png_error));
  }
  image.pixels.resize(static_cast<size_t>(image.height * image.width * image.channels));
  std::vector<png_bytep> rows(static_cast<size_t>(image.height));
  for (size_t r = 0; r < rows.size(); ++r) {
    rows[r] = image.pixels.data() + r * static_cast<size_t>(image.width * image.channels);
  }
  PngSource body{&png, 0};
  Image again;
  if (!png_read(&body, &again, &rows)) {
    throw std::runtime_error(fmt::format("decode_png: {}", g_png_error));
  }
  return image;
}

}  // namespace trainkit::log::detail
