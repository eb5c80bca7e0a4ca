// Full PNG decode to 8-bit RGB with libpng.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "codecs/image_info.h"

namespace stoker {

bool is_png(const uint8_t* data, size_t n);
/// Header only. Throws DecodeError.
ImageInfo png_probe(const uint8_t* data, size_t n);
/// Decodes to HWC RGB (rows packed) in `rgb`: palette, gray (any depth), 16-bit (high byte kept)
/// and alpha (dropped, not composited: the colour channels as stored) images all come out as 8-bit
/// RGB.
ImageInfo png_decode(const uint8_t* data, size_t n, int64_t max_pixels, std::vector<uint8_t>& rgb);
/// One channel per pixel, as a mask is read (PIL's np.asarray(Image.open(f))
/// for modes L and P): a grayscale PNG's values (16 bits: the high byte), a
/// palette PNG's indices, and PIL's convert("L") of anything else
/// (L = (19595 R + 38470 G + 7471 B + 32768) >> 16). Alpha is dropped.
ImageInfo png_decode_gray(const uint8_t* data, size_t n, int64_t max_pixels,
                          std::vector<uint8_t>& gray, std::vector<uint8_t>& rgb_scratch);

}  // namespace stoker
