#include "geometry/convex_polygon.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace stoker {

ConvexPolygon ConvexPolygon::rect(double x1, double y1, double x2, double y2) {
  ConvexPolygon r;
  if (!(x2 > x1 && y2 > y1)) return r;  // NaN too
  r.p_[0] = {x1, y1};
  r.p_[1] = {x2, y1};
  r.p_[2] = {x2, y2};
  r.p_[3] = {x1, y2};
  r.n_ = 4;
  return r;
}

void ConvexPolygon::clip_axis(int axis, double at, bool above) {
  if (n_ == 0) return;
  auto coord = [axis](const Point2& q) { return axis == 0 ? q.x : q.y; };
  auto inside = [&](const Point2& q) { return above ? coord(q) >= at : coord(q) <= at; };
  std::array<Point2, kCapacity> out;
  int m = 0;
  auto push = [&](Point2 q) {
    if (m > 0 && out[m - 1].x == q.x && out[m - 1].y == q.y) return;
    STOKER_CHECK(m < kCapacity, UsageError,
                 "a transform group's region has too many vertices: fewer geometric ops");
    out[m++] = q;
  };
  for (int i = 0; i < n_; ++i) {
    const Point2 a = p_[i], b = p_[(i + 1) % n_];
    const bool ia = inside(a), ib = inside(b);
    if (ia) push(a);
    if (ia != ib) {
      const double t = (at - coord(a)) / (coord(b) - coord(a));
      Point2 q{a.x + t * (b.x - a.x), a.y + t * (b.y - a.y)};
      (axis == 0 ? q.x : q.y) = at;  // exactly on the line
      push(q);
    }
  }
  if (m > 1 && out[m - 1].x == out[0].x && out[m - 1].y == out[0].y) --m;
  std::copy(out.begin(), out.begin() + m, p_.begin());
  n_ = m;
}

void ConvexPolygon::clip_to_canvas(double w, double h) {
  clip_axis(0, 0.0, true);
  clip_axis(0, w, false);
  clip_axis(1, 0.0, true);
  clip_axis(1, h, false);
}

void ConvexPolygon::map(const Transform2D& t) {
  for (int i = 0; i < n_; ++i) p_[i] = t.apply(p_[i]);
}

double ConvexPolygon::area() const {
  double a = 0;
  for (int i = 0; i < n_; ++i) {
    const Point2 &p = p_[i], &q = p_[(i + 1) % n_];
    a += p.x * q.y - q.x * p.y;
  }
  return std::isfinite(a) ? 0.5 * std::abs(a) : 0.0;
}

void ConvexPolygon::bounds(double* x1, double* y1, double* x2, double* y2) const {
  if (n_ == 0) {
    *x1 = *y1 = *x2 = *y2 = 0;
    return;
  }
  *x1 = *x2 = p_[0].x;
  *y1 = *y2 = p_[0].y;
  for (int i = 1; i < n_; ++i) {
    *x1 = std::min(*x1, p_[i].x), *x2 = std::max(*x2, p_[i].x);
    *y1 = std::min(*y1, p_[i].y), *y2 = std::max(*y2, p_[i].y);
  }
}

bool ConvexPolygon::span_at(double y, double* lo, double* hi) const {
  double a = INFINITY, b = -INFINITY;
  for (int i = 0; i < n_; ++i) {
    const Point2 p = p_[i], q = p_[(i + 1) % n_];
    if ((p.y < y && q.y < y) || (p.y > y && q.y > y)) continue;
    if (p.y == q.y) {  // the edge lies on the line
      a = std::min({a, p.x, q.x});
      b = std::max({b, p.x, q.x});
      continue;
    }
    const double x = p.x + (y - p.y) / (q.y - p.y) * (q.x - p.x);
    a = std::min(a, x);
    b = std::max(b, x);
  }
  *lo = a;
  *hi = b;
  return a <= b;
}

}  // namespace stoker
