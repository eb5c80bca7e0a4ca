// Test images encoded in-process with libjpeg and libpng (no binary files in
// the repository): a photo-like pattern, and JPEG/PNG encoders.
#pragma once

#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <jpeglib.h>

namespace stoker::test {

using Bytes = std::vector<uint8_t>;

// A smooth, photo-like image with edges, so crops and resizes have detail.
inline Bytes photo(int w, int h, int channels, uint32_t seed = 1) {
  Bytes px(static_cast<size_t>(w) * h * channels);
  uint32_t r = seed * 2654435761u + 1;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < channels; ++c) {
        r = r * 1664525u + 1013904223u;
        double v = 128 + 90 * std::sin(x / (7.0 + c) + c) * std::cos(y / 9.0 - c) +
                   ((x / 16 + y / 16) % 2 ? 20 : -20) + static_cast<int>(r >> 28) - 8;
        px[(static_cast<size_t>(y) * w + x) * channels + c] =
            static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
      }
  return px;
}

inline Bytes encode_jpeg(const Bytes& px, int w, int h, J_COLOR_SPACE in_space, int quality = 92,
                         bool subsample = true, bool progressive = false) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* mem = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &mem, &size);
  cinfo.image_width = w;
  cinfo.image_height = h;
  cinfo.in_color_space = in_space;
  cinfo.input_components = in_space == JCS_GRAYSCALE ? 1 : in_space == JCS_CMYK ? 4 : 3;
  jpeg_set_defaults(&cinfo);
  if (in_space == JCS_CMYK) jpeg_set_colorspace(&cinfo, JCS_YCCK);  // writes the Adobe marker
  jpeg_set_quality(&cinfo, quality, TRUE);
  if (!subsample && in_space == JCS_RGB)
    cinfo.comp_info[0].h_samp_factor = cinfo.comp_info[0].v_samp_factor = 1;
  if (progressive) jpeg_simple_progression(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  const size_t stride = static_cast<size_t>(w) * cinfo.input_components;
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(px.data()) + cinfo.next_scanline * stride;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  Bytes out(mem, mem + size);
  jpeg_destroy_compress(&cinfo);
  free(mem);
  return out;
}

inline void png_append(png_structp png, png_bytep data, png_size_t n) {
  auto* out = static_cast<Bytes*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + n);
}

inline Bytes encode_png(const Bytes& px, int w, int h, int color_type, int depth = 8) {
  Bytes out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  png_set_write_fn(png, &out, png_append, nullptr);
  png_set_IHDR(png, info, w, h, depth, color_type, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (color_type == PNG_COLOR_TYPE_PALETTE) {
    png_color pal[256];
    for (int i = 0; i < 256; ++i) pal[i] = {uint8_t(i), uint8_t(255 - i), uint8_t(i / 2)};
    png_set_PLTE(png, info, pal, 256);
  }
  png_write_info(png, info);
  if (depth == 16) png_set_swap(png);  // rows are given little-endian
  const size_t stride = px.size() / h;
  for (int y = 0; y < h; ++y) png_write_row(png, const_cast<uint8_t*>(px.data()) + y * stride);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

}  // namespace stoker::test
