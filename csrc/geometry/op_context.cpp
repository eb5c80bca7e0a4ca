#include "geometry/op_context.h"

#include <algorithm>
#include <cstring>

namespace stoker {

void paint_frame(const Pixels& p, const PixelRect& c, const Fill& fill) {
  const auto paint = [&](uint8_t* px, int n) {
    for (int i = 0; i < n; ++i, px += 3) std::memcpy(px, fill.v, 3);
  };
  const bool empty = c.w <= 0 || c.h <= 0;
  for (int y = 0; y < p.height; ++y) {
    uint8_t* row = p.row(y);
    if (empty || y < c.y || y >= c.y + c.h) {
      paint(row, p.width);
    } else {
      paint(row, c.x);
      paint(row + 3 * static_cast<size_t>(c.x + c.w), p.width - c.x - c.w);
    }
  }
}

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
  // What of the window the image covers, in the window's coordinates.
  const int x0 = std::max(0, -r.x), y0 = std::max(0, -r.y);
  const int x1 = std::min(r.w, width() - r.x), y1 = std::min(r.h, height() - r.y);
  if (!canvas_ || inside || zeros) {
    crop(r);  // lazy: zeros past the edges
    if (canvas_ && !inside) set_frame({x0, y0, std::max(0, x1 - x0), std::max(0, y1 - y0)}, fill);
    return;
  }
  flush();
  const bool frames_all = r.x <= 0 && r.y <= 0 && r.x + r.w >= width() && r.y + r.h >= height();
  if (mode == PadMode::kConstant && frames_all && canvas_->pending && canvas_->whole_view()) {
    // A resize then a frame around all of it (Letterbox): the resize runs straight
    // into the framed image, not into a buffer copied into it.
    const Pixels out = canvas_spare(*canvas_, r.w, r.h);
    const PixelRect content{-r.x, -r.y, width(), height()};
    paint_frame(out, content, fill);
    pixels_->try_resize_into(*canvas_, out.row(content.y) + 3 * static_cast<size_t>(content.x),
                             out.stride);
    adopt_pixels(*canvas_, out);
    geometry_.crop(r.x, r.y, r.w, r.h);
    set_frame(content, fill);
    return;
  }
  const Pixels src = pixels();
  const Pixels out = canvas_spare(*canvas_, r.w, r.h);
  copy_window(src, r.x, r.y, out, mode, fill);
  adopt_pixels(*canvas_, out);
  geometry_.crop(r.x, r.y, r.w, r.h);
  if (mode == PadMode::kConstant)
    set_frame({x0, y0, std::max(0, x1 - x0), std::max(0, y1 - y0)}, fill);
}

void OpContext::set_frame(const PixelRect& content, const Fill& fill) {
  border_ = true;
  content_ = content;
  fill_ = fill;
}

// NOTE [ Lazy warps ]
// A warp (RandomRotation, RandomAffine, RandomPerspective) runs when something
// needs its pixels, not when it is asked for, so that a crop inside its output
// right after it (YOLO's affine on a mosaic's canvas, then the centre crop
// back to the training size) makes it write only the crop: output pixel (j,
// i) of the crop samples the source at the point the uncropped warp's pixel
// (j + x, i + y) samples, so the bytes are the same, for a quarter of the work
// on a mosaic. Colour steps queued after the warp run after it (flush()).
void OpContext::warp(const Transform2D& forward, int w, int h, Interpolation interp,
                     const Fill* fill) {
  if (canvas_) {
    flush();  // an earlier warp, colour steps
    warp_.pending = true;
    warp_.forward = forward;
    warp_.w = w;
    warp_.h = h;
    warp_.interp = interp;
    warp_.has_fill = fill != nullptr;
    if (fill) warp_.fill = *fill;
    border_ = false;
  }
  geometry_.warp(forward, w, h);
}

void OpContext::run_warp() {
  warp_.pending = false;
  const Pixels src = canvas_pixels(*pixels_, *canvas_);
  const Pixels out = canvas_spare(*canvas_, warp_.w, warp_.h);
  warp_pixels(src, out, warp_.forward.inverse(), warp_.interp,
              warp_.has_fill ? &warp_.fill : nullptr);
  adopt_pixels(*canvas_, out);
  border_ = false;
}

}  // namespace stoker
