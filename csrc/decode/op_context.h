// What an op's kernel (image_ops.h) sees of the image it transforms: the size
// of the view so far, the random draws of the sample, and the moves it may
// make. Each move changes the pixels (lazily: canvas.h) and the geometry
// (geometry.h) together, so no op can move one without the other.
#pragma once

#include <array>

#include "common/error.h"
#include "decode/canvas.h"
#include "decode/canvas_pixels.h"
#include "decode/detail/rng.h"
#include "decode/geometry.h"
#include "decode/image_info.h"
#include "decode/image_ops.h"
#include "decode/padding.h"

namespace stoker {

class OpContext {
 public:
  /// @param rng the draws of this sample's transform group, in op order
  OpContext(CanvasOps& pixels, Canvas& canvas, detail::SplitMix64& rng)
      : pixels_(pixels),
        canvas_(canvas),
        rng_(rng),
        geometry_(Geometry::identity(canvas.view.w, canvas.view.h)) {}

  /// The random draws: the same for the same sample, whatever the thread.
  detail::SplitMix64& rng() { return rng_; }
  /// Size of the image so far.
  int width() const { return canvas_.view.w; }
  int height() const { return canvas_.view.h; }

  /// Keeps the rectangle `r` of the image as it is now (it may reach past the
  /// edges: zeros there).
  void crop(const PixelRect& r) {
    CanvasOps::crop(canvas_, r);
    geometry_.crop(r.x, r.y, r.w, r.h);
  }
  /// Resamples the image to (w x h).
  void resize(int w, int h) {
    pixels_.resize(canvas_, w, h);
    geometry_.resize(w, h);
  }
  /// Mirrors the image left-right.
  void flip() {
    canvas_.flip = !canvas_.flip;
    geometry_.flip();
  }
  /// The output is normalised (written as floats) by `n`.
  void normalize(const ops::Normalize& n) { normalize_ = &n; }
  /// Keeps the rectangle `r` (which may reach past the edges), what lies
  /// outside the image filled by `mode` (padding.h) and `fill`.
  void window(const PixelRect& r, PadMode mode, const Fill& fill) {
    const bool inside = r.x >= 0 && r.y >= 0 && r.x + r.w <= width() && r.y + r.h <= height();
    const bool zeros =
        mode == PadMode::kConstant && fill.v[0] == 0 && fill.v[1] == 0 && fill.v[2] == 0;
    if (inside || zeros) {
      crop(r);  // lazy: zeros past the edges
      return;
    }
    const Pixels src = pixels();
    const Pixels out = canvas_spare(canvas_, r.w, r.h);
    copy_window(src, r.x, r.y, out, mode, fill);
    adopt_pixels(canvas_, out);
    geometry_.crop(r.x, r.y, r.w, r.h);
  }
  /// The image as plain pixels, to change in place (colour ops, blur,
  /// auto-augment): they do not move it, so the geometry stays.
  Pixels pixels() { return canvas_pixels(pixels_, canvas_); }
  /// Runs `op` on the written output (RandomErasing), after Normalize.
  void on_output(const ops::RandomErasing& op);
  /// The ops on the output, in order.
  const ops::RandomErasing* const* output_ops() const { return erasing_.data(); }
  int num_output_ops() const { return num_erasing_; }

  /// Where the output's pixels come from in the decoded image.
  const Geometry& geometry() const { return geometry_; }
  const ops::Normalize* normalization() const { return normalize_; }

 private:
  CanvasOps& pixels_;
  Canvas& canvas_;
  detail::SplitMix64& rng_;
  Geometry geometry_;
  const ops::Normalize* normalize_ = nullptr;
  std::array<const ops::RandomErasing*, 8> erasing_{};  // no allocation per sample
  int num_erasing_ = 0;
};

inline void OpContext::on_output(const ops::RandomErasing& op) {
  STOKER_CHECK(num_erasing_ < static_cast<int>(erasing_.size()), UsageError,
               "at most 8 RandomErasing ops in a list");
  erasing_[num_erasing_++] = &op;
}

}  // namespace stoker
