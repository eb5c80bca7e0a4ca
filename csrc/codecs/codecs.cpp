#include "codecs/codecs.h"

#include <png.h>

#include <cstdio>  // jpeglib.h needs FILE and size_t first
#include <string>

#include <jpeglib.h>

namespace stoker {

bool have_image_codecs() { return true; }

void require_image_codecs() {}

std::string image_codec_versions() {
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
  constexpr int kJpeg = LIBJPEG_TURBO_VERSION_NUMBER;  // MMMmmmppp
  std::string jpeg = "libjpeg-turbo " + std::to_string(kJpeg / 1000000) + "." +
                     std::to_string(kJpeg / 1000 % 1000) + "." + std::to_string(kJpeg % 1000);
#else
  std::string jpeg = "libjpeg " + std::to_string(JPEG_LIB_VERSION);
#endif
  return jpeg + ", libpng " + png_get_libpng_ver(nullptr);
}

}  // namespace stoker
