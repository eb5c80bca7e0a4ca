// Full PNG decode to 8-bit RGB with libpng.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "decode/image_info.h"

namespace stoker {

bool is_png(const uint8_t* data, size_t n);
/// Header only. Throws DecodeError.
ImageInfo png_probe(const uint8_t* data, size_t n);
/// Decodes to HWC RGB (rows packed) in `rgb`: palette, gray (any depth), 16-bit (high byte kept)
/// and alpha (dropped, not composited: the colour channels as stored) images all come out as 8-bit
/// RGB.
ImageInfo png_decode(const uint8_t* data, size_t n, int64_t max_pixels, std::vector<uint8_t>& rgb);

}  // namespace stoker
