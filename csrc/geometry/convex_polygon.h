// A convex polygon in continuous image coordinates (transform2d.h), with the
// few operations the targets of a transform group need: clipped to a canvas,
// moved through a plane map, measured.
//
// What a chain of ops leaves of an image is convex: a canvas is a rectangle,
// every op maps it by an affine or projective map (lines stay lines, and the
// maps of stoker's ops keep each canvas on one side of their horizon), and
// each op clips it to its own canvas; an intersection of convex sets is
// convex. The same holds for a box: what is left of it is the convex polygon
// the box becomes, clipped at every stage (geometry.h; NOTE [ Transform
// groups ] in transform_group.cpp).
//
// Fixed capacity, no allocation: clipping a convex n-gon to a rectangle gives
// at most n + 4 vertices, and a chain has at most Geometry::kMaxSteps stages.
#pragma once

#include <array>

#include "geometry/transform2d.h"

namespace stoker {

class ConvexPolygon {
 public:
  static constexpr int kCapacity = 4 + 4 * 40;

  ConvexPolygon() = default;
  /// The rectangle [x1, x2] x [y1, y2] (empty when x2 <= x1 or y2 <= y1).
  static ConvexPolygon rect(double x1, double y1, double x2, double y2);

  int size() const { return n_; }
  /// Fewer than 3 vertices, or no area.
  bool empty() const { return n_ < 3 || area() <= 0; }
  const Point2& operator[](int i) const { return p_[i]; }

  /// Keeps what lies inside [0, w] x [0, h].
  void clip_to_canvas(double w, double h);
  /// Moves every vertex through `t`.
  void map(const Transform2D& t);
  /// Area (>= 0).
  double area() const;
  /// The enclosing axis-aligned box; all zero when there are no vertices.
  void bounds(double* x1, double* y1, double* x2, double* y2) const;
  /// The x range [*lo, *hi] where the horizontal line at `y` crosses the
  /// polygon; false when it misses it.
  bool span_at(double y, double* lo, double* hi) const;

 private:
  // Keeps the side of the line `axis` (0: x, 1: y) = `at` where the
  // coordinate is >= at (`above`) or <= at.
  void clip_axis(int axis, double at, bool above);

  std::array<Point2, kCapacity> p_{};
  int n_ = 0;
};

}  // namespace stoker
