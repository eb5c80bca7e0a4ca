#include "geometry/canvas_pixels.h"

#include <utility>
#include <vector>

#include "geometry/padding.h"

namespace stoker {

namespace {

std::vector<uint8_t>& spare_buffer(const Canvas& c) {
  thread_local std::vector<uint8_t> buf[2];
  return buf[0].data() == c.pix.data ? buf[1] : buf[0];
}

}  // namespace

void adopt_pixels(Canvas& c, const Pixels& p) {
  c.have_pixels = true;
  c.pending = false;
  c.flip = false;
  c.borrowed = false;
  c.pix = {p.data, p.width, p.height, p.stride};
  c.src_w = p.width;
  c.src_h = p.height;
  c.view = {0, 0, p.width, p.height};
}

Pixels canvas_spare(const Canvas& c, int w, int h) {
  std::vector<uint8_t>& dst = spare_buffer(c);
  dst.resize(static_cast<size_t>(w) * h * 3);
  return packed_pixels(dst.data(), w, h, 3);
}

Pixels canvas_pixels(CanvasOps& ops, Canvas& c, const Fill& fill) {
  ops.ensure_pixels(c);
  const bool whole = c.view == PixelRect{0, 0, c.src_w, c.src_h};
  // Pixels the canvas may not write (a cached image, a raw record) are copied first.
  if (!(whole && !c.flip && !c.borrowed && c.pix.stride == static_cast<size_t>(c.src_w) * 3)) {
    const Pixels src{const_cast<uint8_t*>(c.pix.data), c.src_w, c.src_h, 3, c.pix.stride};
    const Pixels out = canvas_spare(c, c.view.w, c.view.h);
    copy_window(src, c.view.x, c.view.y, out, PadMode::kConstant, fill);
    if (c.flip)
      for (int y = 0; y < out.height; ++y) {
        uint8_t* row = out.row(y);
        for (int i = 0, j = out.width - 1; i < j; ++i, --j)
          for (int k = 0; k < 3; ++k) std::swap(row[3 * i + k], row[3 * j + k]);
      }
    adopt_pixels(c, out);
  }
  return {const_cast<uint8_t*>(c.pix.data), c.src_w, c.src_h, 3, c.pix.stride};
}

}  // namespace stoker
