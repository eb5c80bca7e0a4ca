// Built instead of jpeg_decoder.cpp, jpeg_encoder.cpp, png_decoder.cpp and codecs.cpp when
// STOKER_WITH_IMAGES=OFF: the same functions, each refusing with the reason.
// The signature checks still work, so an image is recognised as one and the
// error names the missing support rather than calling the data corrupt.
#include <cstring>

#include "codecs/codecs.h"
#include "codecs/jpeg_decoder.h"
#include "codecs/jpeg_encoder.h"
#include "codecs/png_decoder.h"
#include "common/error.h"

namespace stoker {

bool have_image_codecs() { return false; }

void require_image_codecs() {
  STOKER_THROW(Error,
               "this build of stoker has no image support (built with -DSTOKER_WITH_IMAGES=OFF), "
               "so stoker.image() fields cannot be decoded; install the stoker wheel, or build "
               "from source with libjpeg-turbo and libpng (the default)");
}

std::string image_codec_versions() { return "none"; }

bool is_jpeg(const uint8_t* data, size_t n) {
  return n >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
}

ImageInfo jpeg_probe(const uint8_t*, size_t) {
  require_image_codecs();
  return {};
}

struct JpegDecoder::State {};

JpegDecoder::JpegDecoder() : s_(std::make_unique<State>()) {}
JpegDecoder::~JpegDecoder() = default;

ImageInfo JpegDecoder::open(const uint8_t*, size_t, int64_t) {
  require_image_codecs();
  return {};
}

void JpegDecoder::decode_scaled(int, uint8_t*, size_t) { require_image_codecs(); }

int JpegDecoder::choose_scale(int, int, int, int) { return 8; }

RgbView JpegDecoder::decode_region(const PixelRect&, int, std::vector<uint8_t>&, int*, int*) {
  require_image_codecs();
  return {};
}

std::vector<uint8_t> jpeg_encode(const uint8_t*, int, int, int, size_t, int) {
  require_image_codecs();
  return {};
}

bool is_png(const uint8_t* data, size_t n) {
  static constexpr uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  return n >= 8 && std::memcmp(data, kSignature, 8) == 0;
}

ImageInfo png_probe(const uint8_t*, size_t) {
  require_image_codecs();
  return {};
}

ImageInfo png_decode(const uint8_t*, size_t, int64_t, std::vector<uint8_t>&) {
  require_image_codecs();
  return {};
}

ImageInfo png_decode_gray(const uint8_t*, size_t, int64_t, std::vector<uint8_t>&,
                          std::vector<uint8_t>&) {
  require_image_codecs();
  return {};
}

}  // namespace stoker
