// What the decoders report about an encoded image, and the pixel rectangles
// the ops and decoders exchange.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stoker {

/// Header facts of an encoded image.
struct ImageInfo {
  int width = 0;
  int height = 0;
};

/// An integer pixel rectangle. In the ops it may extend past the image (a
/// center crop larger than the image): the pixels out there are zeros.
struct PixelRect {
  int x = 0, y = 0, w = 0, h = 0;
  bool operator==(const PixelRect& o) const { return x == o.x && y == o.y && w == o.w && h == o.h; }
};

/// Read-only view of 8-bit RGB pixels (3 bytes a pixel, rows `stride` bytes apart).
struct RgbView {
  const uint8_t* data = nullptr;
  int width = 0;
  int height = 0;
  size_t stride = 0;
};

}  // namespace stoker
