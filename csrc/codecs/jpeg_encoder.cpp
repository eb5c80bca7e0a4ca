#include "codecs/jpeg_encoder.h"

#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE and size_t first
#include <cstdlib>
#include <memory>

#include <jpeglib.h>

#include "common/error.h"

namespace stoker {

namespace {

// JPEG's limit: 16-bit dimensions in the frame header.
constexpr int kMaxSide = 65500;

struct Compressor {
  jpeg_compress_struct cinfo;
  struct Err {
    jpeg_error_mgr pub;
    std::jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
  } err;
  unsigned char* out = nullptr;  // jpeg_mem_dest's buffer (malloc'd by libjpeg)
  unsigned long size = 0;

  Compressor() {
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = [](j_common_ptr c) {
      auto* e = reinterpret_cast<Err*>(c->err);
      (*c->err->format_message)(c, e->message);
      std::longjmp(e->jump, 1);
    };
    err.message[0] = 0;
    jpeg_create_compress(&cinfo);
  }
  ~Compressor() {
    jpeg_destroy_compress(&cinfo);
    std::free(out);
  }
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;
};

// The libjpeg calls, under the setjmp (NOTE [ libjpeg errors ] in jpeg_decoder.cpp):
// nothing with a destructor lives in this frame. False when libjpeg failed.
bool compress(Compressor& c, const uint8_t* pixels, int width, int height, int channels,
              size_t stride, int quality) {
  if (setjmp(c.err.jump)) return false;
  jpeg_mem_dest(&c.cinfo, &c.out, &c.size);
  c.cinfo.image_width = static_cast<JDIMENSION>(width);
  c.cinfo.image_height = static_cast<JDIMENSION>(height);
  c.cinfo.input_components = channels;
  c.cinfo.in_color_space = channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
  jpeg_set_defaults(&c.cinfo);
  jpeg_set_quality(&c.cinfo, quality, TRUE);
  jpeg_start_compress(&c.cinfo, TRUE);
  while (c.cinfo.next_scanline < c.cinfo.image_height) {
    // libjpeg's rows are non-const pointers; it only reads them.
    JSAMPROW row = const_cast<uint8_t*>(pixels) + size_t{c.cinfo.next_scanline} * stride;
    jpeg_write_scanlines(&c.cinfo, &row, 1);
  }
  jpeg_finish_compress(&c.cinfo);
  return true;
}

}  // namespace

std::vector<uint8_t> jpeg_encode(const uint8_t* pixels, int width, int height, int channels,
                                 size_t stride, int quality) {
  STOKER_CHECK(width >= 1 && height >= 1 && width <= kMaxSide && height <= kMaxSide, UsageError,
               "a JPEG is 1 to ", kMaxSide, " pixels on a side, got ", width, "x", height);
  STOKER_CHECK(channels == 1 || channels == 3, UsageError,
               "JPEG encoding takes 1 (grayscale) or 3 (RGB) channels, got ", channels);
  STOKER_CHECK(quality >= 1 && quality <= 100, UsageError, "JPEG quality must be 1 to 100, got ",
               quality);
  STOKER_CHECK(stride >= static_cast<size_t>(width) * static_cast<size_t>(channels), UsageError,
               "rows of ", width, " pixels x ", channels, " channels do not fit a stride of ",
               stride, " bytes");
  auto c = std::make_unique<Compressor>();
  if (!compress(*c, pixels, width, height, channels, stride, quality))
    STOKER_THROW(Error, "JPEG encoding failed: ", c->err.message);
  return std::vector<uint8_t>(c->out, c->out + c->size);
}

}  // namespace stoker
