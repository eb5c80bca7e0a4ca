#include "decode/jpeg_decoder.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>

// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>

#include "common/error.h"

namespace stoker {

namespace {

struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings (level -1) are corrupt or truncated data that libjpeg would paper
// over with grey; a loader must not hand that on silently.
void on_message(j_common_ptr cinfo, int level) {
  if (level < 0) on_error(cinfo);
}

// Holds a decompressor; C++ objects with destructors must not live between
// setjmp and longjmp, so everything the decode needs is allocated beforehand.
struct Decompressor {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  Decompressor() {
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    jpeg_create_decompress(&cinfo);
  }
  ~Decompressor() { jpeg_destroy_decompress(&cinfo); }
};

void check_pixels(int w, int h, int64_t max_pixels) {
  if (w <= 0 || h <= 0) STOKER_THROW(DecodeError, "JPEG declares an empty image (", w, "x", h, ")");
  const int64_t px = int64_t{w} * h;
  if (px > max_pixels)
    STOKER_THROW(DecodeError, "image declares ", w, "x", h, " = ", px,
                 " pixels, above the limit of ", max_pixels);
}

}  // namespace

bool is_jpeg(const uint8_t* data, size_t n) {
  return n >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
}

ImageInfo jpeg_probe(const uint8_t* data, size_t n) {
  Decompressor d;
  if (setjmp(d.err.jump)) STOKER_THROW(DecodeError, "corrupt JPEG header: ", d.err.message);
  jpeg_mem_src(&d.cinfo, data, static_cast<unsigned long>(n));
  jpeg_read_header(&d.cinfo, TRUE);
  return {static_cast<int>(d.cinfo.image_width), static_cast<int>(d.cinfo.image_height)};
}

ImageInfo jpeg_decode(const uint8_t* data, size_t n, int64_t max_pixels,
                      std::vector<uint8_t>& rgb) {
  Decompressor d;
  ImageInfo info;
  // Sized before setjmp: no allocation may happen between setjmp and a longjmp.
  std::vector<uint8_t> cmyk_row;
  volatile bool failed_header = true;
  if (setjmp(d.err.jump)) {
    STOKER_THROW(DecodeError, failed_header ? "corrupt JPEG header: " : "corrupt JPEG data: ",
                 d.err.message);
  }
  jpeg_mem_src(&d.cinfo, data, static_cast<unsigned long>(n));
  jpeg_read_header(&d.cinfo, TRUE);
  failed_header = false;
  info = {static_cast<int>(d.cinfo.image_width), static_cast<int>(d.cinfo.image_height)};
  check_pixels(info.width, info.height, max_pixels);  // throws outside libjpeg's frames
  const bool cmyk =
      d.cinfo.jpeg_color_space == JCS_CMYK || d.cinfo.jpeg_color_space == JCS_YCCK;
  d.cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  d.cinfo.dct_method = JDCT_ISLOW;  // the accurate IDCT, as Pillow uses
  rgb.resize(static_cast<size_t>(info.width) * info.height * 3);
  if (cmyk) cmyk_row.resize(static_cast<size_t>(info.width) * 4);
  const bool adobe = d.cinfo.saw_Adobe_marker;
  jpeg_start_decompress(&d.cinfo);
  const size_t stride = static_cast<size_t>(info.width) * 3;
  while (d.cinfo.output_scanline < d.cinfo.output_height) {
    uint8_t* dst = rgb.data() + d.cinfo.output_scanline * stride;
    JSAMPROW row = cmyk ? cmyk_row.data() : dst;
    jpeg_read_scanlines(&d.cinfo, &row, 1);
    if (cmyk) {
      // Adobe writes CMYK inverted; either way R = (255 - C)(255 - K) / 255 on true values.
      for (int x = 0; x < info.width; ++x) {
        int c = row[4 * x], m = row[4 * x + 1], y = row[4 * x + 2], k = row[4 * x + 3];
        if (!adobe) c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
        dst[3 * x] = static_cast<uint8_t>((c * k + 127) / 255);
        dst[3 * x + 1] = static_cast<uint8_t>((m * k + 127) / 255);
        dst[3 * x + 2] = static_cast<uint8_t>((y * k + 127) / 255);
      }
    }
  }
  jpeg_finish_decompress(&d.cinfo);
  return info;
}

}  // namespace stoker
