#include "geometry/transform2d.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>

#include "common/error.h"

namespace stoker {

namespace {
double radians(double deg) { return deg * std::numbers::pi / 180.0; }
}  // namespace

Transform2D Transform2D::translation(double dx, double dy) {
  return Transform2D({1, 0, dx, 0, 1, dy, 0, 0, 1});
}

Transform2D Transform2D::scaling(double sx, double sy) {
  return Transform2D({sx, 0, 0, 0, sy, 0, 0, 0, 1});
}

Transform2D Transform2D::mirror_x(double w) { return Transform2D({-1, 0, w, 0, 1, 0, 0, 0, 1}); }

Transform2D Transform2D::mirror_y(double h) { return Transform2D({1, 0, 0, 0, -1, h, 0, 0, 1}); }

Transform2D Transform2D::affine(double angle_deg, double tx, double ty, double scale,
                                double shear_x_deg, double shear_y_deg, Point2 center) {
  // RotateScaleShear = R(a) S(s) SHy(sy) SHx(sx), about the centre, then T.
  const double rot = radians(angle_deg);
  const double sx = radians(shear_x_deg), sy = radians(shear_y_deg);
  const double a = std::cos(rot - sy) / std::cos(sy);
  const double b = -(a * std::tan(sx) + std::sin(rot));
  const double c = std::sin(rot - sy) / std::cos(sy);
  const double d = std::cos(rot) - c * std::tan(sx);
  const double m0 = a * scale, m1 = b * scale, m3 = c * scale, m4 = d * scale;
  const double m2 = center.x + tx - m0 * center.x - m1 * center.y;
  const double m5 = center.y + ty - m3 * center.x - m4 * center.y;
  return Transform2D({m0, m1, m2, m3, m4, m5, 0, 0, 1});
}

Transform2D Transform2D::from_perspective_coeffs(const std::array<double, 8>& c) {
  return Transform2D({c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], 1}).inverse();
}

Transform2D Transform2D::then(const Transform2D& next) const {
  std::array<double, 9> r{};
  const auto& a = next.m_;
  const auto& b = m_;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      r[3 * i + j] = a[3 * i] * b[j] + a[3 * i + 1] * b[3 + j] + a[3 * i + 2] * b[6 + j];
  return Transform2D(r);
}

Transform2D Transform2D::inverse() const {
  const auto& m = m_;
  const double c0 = m[4] * m[8] - m[5] * m[7];
  const double c1 = m[5] * m[6] - m[3] * m[8];
  const double c2 = m[3] * m[7] - m[4] * m[6];
  const double det = m[0] * c0 + m[1] * c1 + m[2] * c2;
  STOKER_CHECK(det != 0 && std::isfinite(det), UsageError, "a geometric transform is singular");
  const double k = 1.0 / det;
  std::array<double, 9> r = {
      c0 * k, (m[2] * m[7] - m[1] * m[8]) * k, (m[1] * m[5] - m[2] * m[4]) * k,
      c1 * k, (m[0] * m[8] - m[2] * m[6]) * k, (m[2] * m[3] - m[0] * m[5]) * k,
      c2 * k, (m[1] * m[6] - m[0] * m[7]) * k, (m[0] * m[4] - m[1] * m[3]) * k,
  };
  if (is_affine()) {  // keep the last row exact, so that is_affine() still holds
    r[6] = r[7] = 0;
    r[8] = 1;
  }
  return Transform2D(r);
}

Point2 Transform2D::apply(Point2 p) const {
  const auto& m = m_;
  const double x = m[0] * p.x + m[1] * p.y + m[2];
  const double y = m[3] * p.x + m[4] * p.y + m[5];
  if (is_affine()) return {x, y};
  const double z = m[6] * p.x + m[7] * p.y + m[8];
  return {x / z, y / z};
}

std::array<double, 8> perspective_coeffs(const std::array<Point2, 4>& start,
                                         const std::array<Point2, 4>& end) {
  // A c = b with rows [ex, ey, 1, 0, 0, 0, -sx ex, -sx ey] and
  // [0, 0, 0, ex, ey, 1, -sy ex, -sy ey]; Gaussian elimination, partial pivoting.
  double a[8][9];
  for (int i = 0; i < 4; ++i) {
    const Point2 e = end[i], s = start[i];
    const double r0[9] = {e.x, e.y, 1, 0, 0, 0, -s.x * e.x, -s.x * e.y, s.x};
    const double r1[9] = {0, 0, 0, e.x, e.y, 1, -s.y * e.x, -s.y * e.y, s.y};
    std::copy(r0, r0 + 9, a[2 * i]);
    std::copy(r1, r1 + 9, a[2 * i + 1]);
  }
  for (int col = 0; col < 8; ++col) {
    int piv = col;
    for (int r = col + 1; r < 8; ++r)
      if (std::abs(a[r][col]) > std::abs(a[piv][col])) piv = r;
    STOKER_CHECK(std::abs(a[piv][col]) > 1e-12, UsageError,
                 "perspective: the corner points are degenerate");
    if (piv != col)
      for (int k = 0; k < 9; ++k) std::swap(a[piv][k], a[col][k]);
    for (int r = 0; r < 8; ++r) {
      if (r == col) continue;
      const double f = a[r][col] / a[col][col];
      for (int k = col; k < 9; ++k) a[r][k] -= f * a[col][k];
    }
  }
  std::array<double, 8> c{};
  for (int i = 0; i < 8; ++i) c[i] = static_cast<float>(a[i][8] / a[i][i]);
  return c;
}

void rotated_canvas_size(double angle_deg, int w, int h, int* out_w, int* out_h) {
  const double rot = radians(angle_deg);
  const double cs = std::cos(rot), sn = std::sin(rot);
  const double hw = 0.5 * w, hh = 0.5 * h;
  double lo[2] = {1e300, 1e300}, hi[2] = {-1e300, -1e300};
  for (const auto& [x, y] : {std::pair{-hw, -hh}, {-hw, hh}, {hw, hh}, {hw, -hh}}) {
    const double px = cs * x - sn * y + hw, py = sn * x + cs * y + hh;
    lo[0] = std::min(lo[0], px);
    lo[1] = std::min(lo[1], py);
    hi[0] = std::max(hi[0], px);
    hi[1] = std::max(hi[1], py);
  }
  // float32, as torchvision computes it: 25.000000000000004 must ceil to 25
  auto trunc4 = [](double v) {
    return static_cast<double>(std::trunc(static_cast<float>(v) * 10000.0f) * 1e-4f);
  };
  *out_w = static_cast<int>(std::ceil(trunc4(hi[0])) - std::floor(trunc4(lo[0])));
  *out_h = static_cast<int>(std::ceil(trunc4(hi[1])) - std::floor(trunc4(lo[1])));
}

}  // namespace stoker
