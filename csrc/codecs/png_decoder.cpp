#include "codecs/png_decoder.h"

#include <png.h>

#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "common/error.h"

namespace stoker {

namespace {

struct Source {
  const uint8_t* data;
  size_t size;
  size_t pos;
  char message[256];
};

constexpr char kTruncated[] = "truncated PNG data";

void read_fn(png_structp png, png_bytep out, png_size_t n) {
  auto* src = static_cast<Source*>(png_get_io_ptr(png));
  if (n > src->size - src->pos) png_error(png, kTruncated);
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}

void error_fn(png_structp png, png_const_charp msg) {
  auto* src = static_cast<Source*>(png_get_error_ptr(png));
  std::snprintf(src->message, sizeof src->message, "%s", msg);
  png_longjmp(png, 1);
}

void warning_fn(png_structp, png_const_charp) {}  // ancillary-chunk issues do not touch pixels

// Called in the function that did setjmp, after libpng's frames are gone
// (see NOTE [ libjpeg errors ] in jpeg_decoder.cpp: the same scheme).
[[noreturn]] void fail(const Source& src, bool header) {
  if (std::strcmp(src.message, kTruncated) == 0)
    STOKER_THROW(DecodeError, header ? "truncated PNG header" : kTruncated);
  STOKER_THROW(DecodeError, header ? "corrupt PNG header: " : "corrupt PNG data: ", src.message);
}

// Owns the read structs; nothing with a destructor is created between setjmp and longjmp.
struct Reader {
  Source src;
  png_structp png = nullptr;
  png_infop info = nullptr;
  Reader(const uint8_t* data, size_t n) : src{data, n, 0, {0}} {
    png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, error_fn, warning_fn);
    if (!png) throw std::bad_alloc();
    info = png_create_info_struct(png);
    if (!info) {
      png_destroy_read_struct(&png, nullptr, nullptr);
      throw std::bad_alloc();
    }
    png_set_read_fn(png, &src, read_fn);
  }
  ~Reader() { png_destroy_read_struct(&png, &info, nullptr); }
};

}  // namespace

bool is_png(const uint8_t* data, size_t n) { return n >= 8 && png_sig_cmp(data, 0, 8) == 0; }

ImageInfo png_probe(const uint8_t* data, size_t n) {
  Reader r(data, n);
  if (setjmp(png_jmpbuf(r.png))) fail(r.src, true);
  png_read_info(r.png, r.info);
  return {static_cast<int>(png_get_image_width(r.png, r.info)),
          static_cast<int>(png_get_image_height(r.png, r.info))};
}

ImageInfo png_decode(const uint8_t* data, size_t n, int64_t max_pixels, std::vector<uint8_t>& rgb) {
  Reader r(data, n);
  thread_local std::vector<png_bytep> rows;  // reused: no allocation per image
  ImageInfo info;
  volatile bool header = true;
  if (setjmp(png_jmpbuf(r.png))) fail(r.src, header);
  png_read_info(r.png, r.info);
  header = false;
  info = {static_cast<int>(png_get_image_width(r.png, r.info)),
          static_cast<int>(png_get_image_height(r.png, r.info))};
  const int64_t px = int64_t{info.width} * info.height;
  if (info.width <= 0 || info.height <= 0)
    STOKER_THROW(DecodeError, "PNG declares an empty image (", info.width, "x", info.height, ")");
  if (px > max_pixels) {
    // Leave libpng's frames by returning from setjmp's scope first: throw is fine
    // here because no longjmp can follow.
    STOKER_THROW(DecodeError, "image declares ", info.width, "x", info.height, " = ", px,
                 " pixels, above the limit of ", max_pixels);
  }
  const int color = png_get_color_type(r.png, r.info);
  png_set_expand(r.png);  // palette -> RGB, gray < 8 bits -> 8, tRNS -> alpha
  png_set_strip_16(r.png);
  png_set_strip_alpha(r.png);
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA)
    png_set_gray_to_rgb(r.png);
  png_set_interlace_handling(r.png);
  png_read_update_info(r.png, r.info);
  if (png_get_channels(r.png, r.info) != 3 || png_get_bit_depth(r.png, r.info) != 8)
    STOKER_THROW(DecodeError, "unsupported PNG pixel format");
  rgb.resize(static_cast<size_t>(px) * 3);
  rows.resize(static_cast<size_t>(info.height));
  for (int y = 0; y < info.height; ++y)
    rows[static_cast<size_t>(y)] = rgb.data() + static_cast<size_t>(y) * info.width * 3;
  png_read_image(r.png, rows.data());
  png_read_end(r.png, nullptr);
  return info;
}

ImageInfo png_decode_gray(const uint8_t* data, size_t n, int64_t max_pixels,
                          std::vector<uint8_t>& gray, std::vector<uint8_t>& rgb_scratch) {
  int color = 0;
  {
    Reader r(data, n);
    if (setjmp(png_jmpbuf(r.png))) fail(r.src, true);
    png_read_info(r.png, r.info);
    color = png_get_color_type(r.png, r.info);
  }
  if (color != PNG_COLOR_TYPE_GRAY && color != PNG_COLOR_TYPE_GRAY_ALPHA &&
      color != PNG_COLOR_TYPE_PALETTE) {
    const ImageInfo info = png_decode(data, n, max_pixels, rgb_scratch);
    const size_t px = static_cast<size_t>(info.width) * info.height;
    gray.resize(px);
    const uint8_t* p = rgb_scratch.data();
    for (size_t i = 0; i < px; ++i, p += 3)
      gray[i] =
          static_cast<uint8_t>((p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u) >> 16);
    return info;
  }
  Reader r(data, n);
  thread_local std::vector<png_bytep> rows;
  ImageInfo info;
  volatile bool header = true;
  if (setjmp(png_jmpbuf(r.png))) fail(r.src, header);
  png_read_info(r.png, r.info);
  header = false;
  info = {static_cast<int>(png_get_image_width(r.png, r.info)),
          static_cast<int>(png_get_image_height(r.png, r.info))};
  const int64_t px = int64_t{info.width} * info.height;
  if (info.width <= 0 || info.height <= 0)
    STOKER_THROW(DecodeError, "PNG declares an empty image (", info.width, "x", info.height, ")");
  if (px > max_pixels)
    STOKER_THROW(DecodeError, "image declares ", info.width, "x", info.height, " = ", px,
                 " pixels, above the limit of ", max_pixels);
  if (color == PNG_COLOR_TYPE_PALETTE)
    png_set_packing(r.png);  // indices of 1, 2 or 4 bits as bytes; no expansion to colours
  else
    png_set_expand_gray_1_2_4_to_8(r.png);
  png_set_strip_16(r.png);
  png_set_strip_alpha(r.png);
  png_set_interlace_handling(r.png);
  png_read_update_info(r.png, r.info);
  if (png_get_channels(r.png, r.info) != 1 || png_get_bit_depth(r.png, r.info) != 8)
    STOKER_THROW(DecodeError, "unsupported PNG pixel format for a one-channel image");
  gray.resize(static_cast<size_t>(px));
  rows.resize(static_cast<size_t>(info.height));
  for (int y = 0; y < info.height; ++y)
    rows[static_cast<size_t>(y)] = gray.data() + static_cast<size_t>(y) * info.width;
  png_read_image(r.png, rows.data());
  png_read_end(r.png, nullptr);
  return info;
}

}  // namespace stoker
