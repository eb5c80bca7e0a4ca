// Full JPEG decode to 8-bit RGB with libjpeg-turbo.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "decode/image_pipeline.h"

namespace stoker {

bool is_jpeg(const uint8_t* data, size_t n);
/// Header only. Throws DecodeError.
ImageInfo jpeg_probe(const uint8_t* data, size_t n);
/// Decodes to HWC RGB in `rgb` (resized to h*w*3). Grayscale, RGB, YCbCr, CMYK and
/// YCCK (Adobe-inverted) all come out as RGB. Refuses images above `max_pixels`.
/// Corrupt or truncated data is an error, never a padded image: libjpeg's
/// warnings (e.g. "premature end of data") are treated as errors.
ImageInfo jpeg_decode(const uint8_t* data, size_t n, int64_t max_pixels,
                      std::vector<uint8_t>& rgb);

}  // namespace stoker
