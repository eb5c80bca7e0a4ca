// JPEG encoding with libjpeg-turbo: 8-bit RGB or grayscale pixels to a baseline
// JPEG, for what writes images without Pillow (the docs' example data, large
// arrays of stoker.image(storage="smart")).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace stoker {

/// Encodes `height` rows of `width` pixels (`channels` 3: interleaved RGB, or 1:
/// grayscale), rows `stride` bytes apart, as a baseline JPEG at `quality` (1-100,
/// libjpeg's scale, as Pillow's `quality=`; RGB with 4:2:0 chroma subsampling,
/// Pillow's default). Throws UsageError for a size, channel count or quality out
/// of range, and, in a build without image support, the Error of
/// require_image_codecs().
std::vector<uint8_t> jpeg_encode(const uint8_t* pixels, int width, int height, int channels,
                                 size_t stride, int quality);

}  // namespace stoker
