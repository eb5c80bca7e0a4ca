// What an op's kernel (image_ops.h) sees of the image it transforms: the size
// of the view so far, the random draws of the sample, and the moves it may
// make. Each move changes the pixels (lazily: canvas.h) and the geometry
// (geometry.h) together, so no op can move one without the other.
#pragma once

#include "decode/canvas.h"
#include "decode/detail/rng.h"
#include "decode/geometry.h"
#include "decode/image_info.h"
#include "decode/image_ops.h"

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

  /// Where the output's pixels come from in the decoded image.
  const Geometry& geometry() const { return geometry_; }
  const ops::Normalize* normalization() const { return normalize_; }

 private:
  CanvasOps& pixels_;
  Canvas& canvas_;
  detail::SplitMix64& rng_;
  Geometry geometry_;
  const ops::Normalize* normalize_ = nullptr;
};

}  // namespace stoker
