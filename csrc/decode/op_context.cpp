#include "decode/op_context.h"

#include <algorithm>
#include <cstring>

namespace stoker {

void OpContext::vflip() {
  if (canvas_) {
    const Pixels p = pixels();
    const Pixels out = canvas_spare(*canvas_, p.width, p.height);
    for (int y = 0; y < p.height; ++y)
      std::memcpy(out.row(y), p.row(p.height - 1 - y), p.row_bytes());
    adopt_pixels(*canvas_, out);
  }
  geometry_.vflip();
}

void OpContext::window(const PixelRect& r, PadMode mode, const Fill& fill) {
  const bool inside = r.x >= 0 && r.y >= 0 && r.x + r.w <= width() && r.y + r.h <= height();
  const bool zeros =
      mode == PadMode::kConstant && fill.v[0] == 0 && fill.v[1] == 0 && fill.v[2] == 0;
  if (!canvas_ || inside || zeros) {
    crop(r);  // lazy: zeros past the edges
    return;
  }
  const Pixels src = pixels();
  const Pixels out = canvas_spare(*canvas_, r.w, r.h);
  copy_window(src, r.x, r.y, out, mode, fill);
  adopt_pixels(*canvas_, out);
  geometry_.crop(r.x, r.y, r.w, r.h);
}

void OpContext::warp(const Transform2D& forward, int w, int h, Interpolation interp,
                     const Fill* fill) {
  if (canvas_) {
    const Pixels src = pixels();
    const Pixels out = canvas_spare(*canvas_, w, h);
    warp_pixels(src, out, forward.inverse(), interp, fill);
    adopt_pixels(*canvas_, out);
  }
  geometry_.warp(forward, w, h);
}

}  // namespace stoker
