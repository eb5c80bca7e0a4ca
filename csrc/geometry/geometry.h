// Where the pixels of an op chain's output come from: one composed 3x3 map
// from the coordinates of the decoded image to those of the output, and the
// sizes before and after. Every geometric op moves it as it moves the image
// (OpContext in op_context.h): crops translate, resizes scale, flips mirror,
// warps (rotations, affine maps, perspectives) compose their own map. Targets
// that follow the image go through it once at the end (boxes and keypoints
// mapped, masks resampled: transform_group.h); the image's pixels never read
// it.
//
// Coordinates are continuous (transform2d.h): pixel (row i, column j) covers
// [j, j + 1) x [i, i + 1), so a box [x0, x1) of an image maps to the same
// pixels after a resize. Keypoints follow torchvision and albumentations,
// which treat a keypoint's x as a pixel index under flips: x -> w - 1 - x
// (boxes: w - x); they have their own map for that.
#pragma once

#include "geometry/transform2d.h"

namespace stoker {

class Geometry {
 public:
  Geometry() = default;
  /// The identity on a (w x h) image.
  Geometry(int width, int height) : in_w_(width), in_h_(height), w_(width), h_(height) {}

  /// The window at (x, y) of size (w, h) becomes the output; it may reach past
  /// the edges (what lies outside is padding).
  void crop(int x, int y, int w, int h);
  /// The output is resampled to (w x h).
  void resize(int w, int h);
  /// A left-right mirror of the output.
  void hflip();
  /// A top-bottom mirror of the output.
  void vflip();
  /// A warp whose forward map is `forward`, onto an output of (w x h).
  void warp(const Transform2D& forward, int w, int h);

  int in_width() const { return in_w_; }
  int in_height() const { return in_h_; }
  /// Size of the output so far.
  int width() const { return w_; }
  int height() const { return h_; }
  /// The map of continuous coordinates (boxes, masks).
  const Transform2D& box_map() const { return box_; }
  /// The map of pixel-index coordinates (keypoints in pixels).
  const Transform2D& point_map() const { return point_; }
  /// An odd number of horizontal flips: keypoints' left and right swap.
  bool mirrored() const { return mirrored_; }
  /// Whether any op moved anything (the identity leaves targets untouched).
  bool moved() const { return moved_; }
  /// Where the point (x, y) of the decoded image lands in the output.
  Point2 map(double x, double y) const { return box_.apply({x, y}); }

 private:
  void then(const Transform2D& t) { then(t, t); }
  void then(const Transform2D& box, const Transform2D& point);

  int in_w_ = 0, in_h_ = 0, w_ = 0, h_ = 0;
  Transform2D box_, point_;
  bool mirrored_ = false;
  bool moved_ = false;
};

inline void Geometry::then(const Transform2D& box, const Transform2D& point) {
  box_ = box_.then(box);
  point_ = point_.then(point);
  moved_ = true;
}

inline void Geometry::crop(int x, int y, int w, int h) {
  if (x != 0 || y != 0) then(Transform2D::translation(-x, -y));
  w_ = w;
  h_ = h;
}

inline void Geometry::resize(int w, int h) {
  if (w == w_ && h == h_) return;
  then(Transform2D::scaling(static_cast<double>(w) / w_, static_cast<double>(h) / h_));
  w_ = w;
  h_ = h;
}

inline void Geometry::hflip() {
  then(Transform2D::mirror_x(w_), Transform2D::mirror_x(w_ - 1));
  mirrored_ = !mirrored_;
}

inline void Geometry::vflip() { then(Transform2D::mirror_y(h_), Transform2D::mirror_y(h_ - 1)); }

inline void Geometry::warp(const Transform2D& forward, int w, int h) {
  then(forward);
  w_ = w;
  h_ = h;
}

}  // namespace stoker
