// A mutable window of 8-bit pixels with 1 or 3 interleaved channels: what the
// augmentation kernels (colour, blur, warp, pad) read and write. Masks are the
// 1-channel case.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stoker {

/// Rows of `width * channels` bytes, `stride` bytes apart.
struct Pixels {
  uint8_t* data = nullptr;
  int width = 0;
  int height = 0;
  int channels = 3;
  size_t stride = 0;

  uint8_t* row(int y) const { return data + static_cast<size_t>(y) * stride; }
  size_t row_bytes() const { return static_cast<size_t>(width) * channels; }
  bool empty() const { return width <= 0 || height <= 0; }
};

/// Packed pixels over `data` (stride = width * channels).
inline Pixels packed_pixels(uint8_t* data, int width, int height, int channels) {
  return {data, width, height, channels, static_cast<size_t>(width) * channels};
}

/// A fill colour for pixels that come from outside an image (padding, warps).
/// Values are per channel (a 1-channel image uses v[0]).
struct Fill {
  uint8_t v[3] = {0, 0, 0};
};

}  // namespace stoker
