// Where the pixels of an op chain's output come from: one composed 3x3 map
// from the coordinates of the decoded image to those of the output, the sizes
// before and after, and the chain's stages (each move's map and the canvas it
// leaves), which say what of the image is left. Every geometric op moves it as
// it moves the image (OpContext in op_context.h): crops translate, resizes
// scale, flips mirror, warps (rotations, affine maps, perspectives) compose
// their own map. Targets that follow the image go through it once at the end
// (boxes and keypoints mapped, masks resampled: transform_group.h); the
// image's pixels never read it.
//
// The composed map alone does not say what a crop removed: a rotation after a
// crop brings the cut-off parts back into the canvas, as fill in the image but
// as content under the map. valid_region() is what the image still shows (the
// input clipped to every stage's canvas); follow() clips a box the same way,
// stage by stage, so that no stage's map meets a point past its horizon.
//
// Coordinates are continuous (transform2d.h): pixel (row i, column j) covers
// [j, j + 1) x [i, i + 1), so a box [x0, x1) of an image maps to the same
// pixels after a resize. Keypoints follow torchvision and albumentations,
// which treat a keypoint's x as a pixel index under flips: x -> w - 1 - x
// (boxes: w - x); they have their own map for that.
#pragma once

#include <array>

#include "geometry/convex_polygon.h"
#include "geometry/transform2d.h"

namespace stoker {

class Geometry {
 public:
  /// Stages kept; a chain of more moves folds the last ones together, and
  /// targets can no longer follow it (overflowed()).
  static constexpr int kMaxSteps = 40;

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
  /// Then every move of `next`, whose input is this output (a mosaic's tile
  /// placed on the canvas, then the ops on the canvas).
  void append(const Geometry& next);

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
  /// More moves than kMaxSteps: valid_region() and follow() are not exact.
  bool overflowed() const { return overflow_; }

  /// What the output still shows of the input, in output coordinates: the
  /// input's canvas through every stage, clipped to each stage's canvas.
  ConvexPolygon valid_region() const;
  /// Whether `region` (a valid_region()) is all of the output canvas.
  bool covers_output(const ConvexPolygon& region) const;
  /// `p` (input coordinates) clipped to the input, then moved and clipped
  /// stage by stage: what is left of it in the output.
  ConvexPolygon follow(ConvexPolygon p) const;
  /// Whether the point `p` (input coordinates) stays on every stage's canvas
  /// ([0, w] x [0, h], edges included).
  bool follows(Point2 p) const;

 private:
  struct Step {
    Transform2D map;   // from the previous stage's coordinates
    int w = 0, h = 0;  // the canvas it leaves
  };
  void then(const Transform2D& t) { then(t, t); }
  void then(const Transform2D& box, const Transform2D& point);
  void step(const Transform2D& t, int w, int h);

  int in_w_ = 0, in_h_ = 0, w_ = 0, h_ = 0;
  Transform2D box_, point_;
  bool mirrored_ = false;
  bool moved_ = false;
  bool overflow_ = false;
  int num_steps_ = 0;
  std::array<Step, kMaxSteps> steps_;
};

inline void Geometry::then(const Transform2D& box, const Transform2D& point) {
  box_ = box_.then(box);
  point_ = point_.then(point);
  moved_ = true;
}

inline void Geometry::step(const Transform2D& t, int w, int h) {
  if (num_steps_ == kMaxSteps) {  // fold into the last stage: its clip is lost
    overflow_ = true;
    Step& last = steps_[kMaxSteps - 1];
    last.map = last.map.then(t);
    last.w = w;
    last.h = h;
    return;
  }
  steps_[num_steps_++] = {t, w, h};
}

inline void Geometry::crop(int x, int y, int w, int h) {
  if (x != 0 || y != 0) then(Transform2D::translation(-x, -y));
  // A window inside the canvas cuts what lies outside it; one past the edges
  // adds padding, which the valid region leaves out.
  if (x != 0 || y != 0 || w < w_ || h < h_) step(Transform2D::translation(-x, -y), w, h);
  w_ = w;
  h_ = h;
}

inline void Geometry::resize(int w, int h) {
  if (w == w_ && h == h_) return;
  const Transform2D s =
      Transform2D::scaling(static_cast<double>(w) / w_, static_cast<double>(h) / h_);
  then(s);
  step(s, w, h);
  w_ = w;
  h_ = h;
}

inline void Geometry::hflip() {
  then(Transform2D::mirror_x(w_), Transform2D::mirror_x(w_ - 1));
  step(Transform2D::mirror_x(w_), w_, h_);
  mirrored_ = !mirrored_;
}

inline void Geometry::vflip() {
  then(Transform2D::mirror_y(h_), Transform2D::mirror_y(h_ - 1));
  step(Transform2D::mirror_y(h_), w_, h_);
}

inline void Geometry::warp(const Transform2D& forward, int w, int h) {
  then(forward);
  step(forward, w, h);
  w_ = w;
  h_ = h;
}

inline void Geometry::append(const Geometry& next) {
  if (next.moved_) {
    box_ = box_.then(next.box_);
    point_ = point_.then(next.point_);
    moved_ = true;
  }
  mirrored_ = mirrored_ != next.mirrored_;
  for (int i = 0; i < next.num_steps_; ++i)
    step(next.steps_[i].map, next.steps_[i].w, next.steps_[i].h);
  overflow_ = overflow_ || next.overflow_;
  w_ = next.w_;
  h_ = next.h_;
}

inline ConvexPolygon Geometry::valid_region() const {
  return follow(ConvexPolygon::rect(0, 0, in_w_, in_h_));
}

inline bool Geometry::covers_output(const ConvexPolygon& region) const {
  double x1, y1, x2, y2;
  region.bounds(&x1, &y1, &x2, &y2);
  // Within a millionth of a pixel: crops and flips are exact, resizes nearly.
  constexpr double e = 1e-6;
  return x1 <= e && y1 <= e && x2 >= w_ - e && y2 >= h_ - e &&
         region.area() >= (static_cast<double>(w_) * h_) * (1 - 1e-9);
}

inline ConvexPolygon Geometry::follow(ConvexPolygon p) const {
  p.clip_to_canvas(in_w_, in_h_);
  for (int i = 0; i < num_steps_ && p.size() > 0; ++i) {
    p.map(steps_[i].map);
    p.clip_to_canvas(steps_[i].w, steps_[i].h);
  }
  return p;
}

inline bool Geometry::follows(Point2 p) const {
  if (!(p.x >= 0 && p.x <= in_w_ && p.y >= 0 && p.y <= in_h_)) return false;
  for (int i = 0; i < num_steps_; ++i) {
    p = steps_[i].map.apply(p);
    if (!(p.x >= 0 && p.x <= steps_[i].w && p.y >= 0 && p.y <= steps_[i].h)) return false;
  }
  return true;
}

}  // namespace stoker
