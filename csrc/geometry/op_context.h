// What an op's kernel (image_ops.h) sees of the image it transforms: the size
// of the view so far, the random draws of the sample, and the moves it may
// make. Each move changes the pixels (lazily: canvas.h) and the geometry
// (geometry.h) together, so no op can move one without the other, and the
// targets of a transform group (masks, boxes, keypoints) follow every op
// without any op knowing about them.
//
// A context without pixels moves the geometry only: a group whose only
// pixels are masks (transform_group.h) runs its ops that way and resamples
// the masks through the result. Ops that need pixels are refused for such
// groups when they are made, so they never reach one.
//
// The one include of a higher folder (csrc/README.md): augment/color_ops.h, for
// the colour steps the context holds back so that consecutive ones run as one
// pass (NOTE [ Fused colour passes ] in augment/color_ops.cpp).
#pragma once

#include <array>

#include "augment/color_ops.h"
#include "codecs/image_info.h"
#include "common/error.h"
#include "geometry/canvas.h"
#include "geometry/canvas_pixels.h"
#include "geometry/detail/rng.h"
#include "geometry/geometry.h"
#include "geometry/image_ops.h"
#include "geometry/padding.h"
#include "geometry/warp.h"

namespace stoker {

/// Paints every pixel of `p` outside `content` with `fill` (3 channels).
void paint_frame(const Pixels& p, const PixelRect& content, const Fill& fill);

class OpContext {
 public:
  /// On an image. @param rng the draws of this sample's transform group, in op order
  OpContext(CanvasOps& pixels, Canvas& canvas, detail::SplitMix64& rng)
      : pixels_(&pixels), canvas_(&canvas), rng_(rng), geometry_(canvas.view.w, canvas.view.h) {}
  /// On the geometry of a (w x h) image only.
  OpContext(int width, int height, detail::SplitMix64& rng) : rng_(rng), geometry_(width, height) {}

  /// The random draws: the same for the same sample, whatever the thread.
  detail::SplitMix64& rng() { return rng_; }
  /// Size of the image so far.
  int width() const { return geometry_.width(); }
  int height() const { return geometry_.height(); }

  /// Keeps the rectangle `r` of the image as it is now (it may reach past the
  /// edges: zeros there).
  void crop(const PixelRect& r) {
    if (canvas_ && warp_.pending && num_steps_ == 0 && r.x >= 0 && r.y >= 0 &&
        r.x + r.w <= width() && r.y + r.h <= height()) {
      // A crop inside a warp still to run: the warp writes only the crop
      // (the same samples: NOTE [ Lazy warps ] in op_context.cpp).
      warp_.forward = warp_.forward.then(Transform2D::translation(-r.x, -r.y));
      warp_.w = r.w;
      warp_.h = r.h;
      geometry_.crop(r.x, r.y, r.w, r.h);
      return;
    }
    if (canvas_) {
      flush();
      // Past the edges of a view that is a window of its source, the lazy view
      // would reach the source's pixels a crop before removed: make the view
      // its own pixels first (zeros past the source's edges), so that past
      // its edges there is nothing.
      const bool past = r.x < 0 || r.y < 0 || r.x + r.w > width() || r.y + r.h > height();
      if (past && !canvas_->whole_view()) pixels();
      CanvasOps::crop(*canvas_, r);
      border_ = false;
    }
    geometry_.crop(r.x, r.y, r.w, r.h);
  }
  /// Resamples the image to (w x h).
  void resize(int w, int h) {
    if (canvas_) {
      flush();
      pixels_->resize(*canvas_, w, h);
      border_ = false;
    }
    geometry_.resize(w, h);
  }
  /// Mirrors the image left-right.
  void flip() {
    if (canvas_) {
      flush();
      canvas_->flip = !canvas_->flip;
      border_ = false;
    }
    geometry_.hflip();
  }
  /// Mirrors the image top-bottom.
  void vflip();
  /// Keeps the rectangle `r` (which may reach past the edges), what lies
  /// outside the image filled by `mode` (padding.h) and `fill`.
  void window(const PixelRect& r, PadMode mode, const Fill& fill);
  /// Resamples the image through the plane map `forward` (from this image's
  /// coordinates to the new ones) onto (w x h); outside the image, `fill`
  /// blended as torchvision does (null: zero padding, no blend; warp.h).
  void warp(const Transform2D& forward, int w, int h, Interpolation interp, const Fill* fill);
  /// Colour steps (already drawn), run on the pixels with the steps of the
  /// ops around them in one fused pass (augment/color_ops.h) before the next move or
  /// pixel access. Colour ops do not move the image.
  void color(const ColorStep* steps, size_t n);
  /// The image as plain pixels, to change in place (blur, auto-augment): they
  /// do not move it, so the geometry stays.
  Pixels pixels() {
    flush();
    border_ = false;  // the caller may change any pixel
    return canvas_pixels(*pixels_, *canvas_);
  }
  /// Runs `f(Pixels)`, a map of each pixel's colour on its own (HSV jitter), on the
  /// image in place. Where the image is its content framed by one fill colour (just
  /// after a window with a constant fill: Letterbox, Pad), `f` runs on the content
  /// and on one pixel of the fill, which then repaints the frame: a letterbox is
  /// often a third fill.
  template <class F>
  void map_pixels(F&& f);
  /// Runs the warp and the colour steps still pending (before the image is
  /// written, and before any pixel access).
  void flush() {
    if (warp_.pending) run_warp();
    if (num_steps_ == 0) return;
    const size_t n = num_steps_;
    num_steps_ = 0;
    border_ = false;  // the steps change the frame too (some, e.g. contrast, read it)
    apply_color_steps(canvas_pixels(*pixels_, *canvas_), steps_.data(), n);
  }
  /// The output is normalised (written as floats) by `n`.
  void normalize(const ops::Normalize& n) { normalize_ = &n; }
  /// Runs `op` on the written output (RandomErasing), after Normalize.
  void on_output(const ops::RandomErasing& op);
  /// The ops on the output, in order.
  const ops::RandomErasing* const* output_ops() const { return erasing_.data(); }
  int num_output_ops() const { return num_erasing_; }

  /// Where the output's pixels come from in the decoded image.
  const Geometry& geometry() const { return geometry_; }
  const ops::Normalize* normalization() const { return normalize_; }

 private:
  void set_frame(const PixelRect& content, const Fill& fill);

  void run_warp();

  // A warp not yet run (NOTE [ Lazy warps ] in op_context.cpp).
  struct PendingWarp {
    bool pending = false;
    Transform2D forward;
    int w = 0, h = 0;
    Interpolation interp = Interpolation::kNearest;
    bool has_fill = false;
    Fill fill{};
  };

  CanvasOps* pixels_ = nullptr;  // null: geometry only
  PendingWarp warp_;
  Canvas* canvas_ = nullptr;
  detail::SplitMix64& rng_;
  Geometry geometry_;
  std::array<ColorStep, 16> steps_{};  // pending colour steps: no allocation per sample
  size_t num_steps_ = 0;
  const ops::Normalize* normalize_ = nullptr;
  // Whether the pixels are `content_` framed by `fill_` (set by window(), cleared by
  // every other move and by pixels()).
  bool border_ = false;
  PixelRect content_{};
  Fill fill_{};
  std::array<const ops::RandomErasing*, 8> erasing_{};
  int num_erasing_ = 0;
};

inline void OpContext::on_output(const ops::RandomErasing& op) {
  STOKER_CHECK(num_erasing_ < static_cast<int>(erasing_.size()), UsageError,
               "at most 8 RandomErasing ops in a list");
  erasing_[num_erasing_++] = &op;
}

template <class F>
void OpContext::map_pixels(F&& f) {
  if (!canvas_) return;
  flush();
  const Pixels all = canvas_pixels(*pixels_, *canvas_);
  if (!border_ || all.channels != 3) {
    border_ = false;
    f(all);
    return;
  }
  const PixelRect& c = content_;
  if (c.w > 0 && c.h > 0)
    f(Pixels{all.row(c.y) + 3 * static_cast<size_t>(c.x), c.w, c.h, 3, all.stride});
  f(packed_pixels(fill_.v, 1, 1, 3));
  paint_frame(all, c, fill_);
}

inline void OpContext::color(const ColorStep* steps, size_t n) {
  if (!canvas_) return;  // groups of masks refuse colour ops; nothing to colour
  if (num_steps_ + n > steps_.size()) flush();
  if (n > steps_.size()) {  // more than a pass can hold: run them now
    apply_color_steps(pixels(), steps, n);
    return;
  }
  for (size_t i = 0; i < n; ++i) steps_[num_steps_++] = steps[i];
}

}  // namespace stoker
