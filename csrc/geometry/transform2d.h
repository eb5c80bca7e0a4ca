// Plane transforms in continuous image coordinates: pixel (row i, column j)
// covers [j, j + 1) x [i, i + 1), so its centre is (j + 0.5, i + 0.5) and an
// image of width w spans [0, w]. torchvision's tensor kernels use this
// convention for warps (grid_sample with align_corners=False) and for boxes.
//
// A Transform2D is a 3x3 projective matrix acting on (x, y, 1) columns; an
// affine map has (0, 0, 1) as its last row. Geometric ops compose their maps
// into one, which moves boxes and keypoints, and whose inverse samples pixels.
#pragma once

#include <array>

namespace stoker {

struct Point2 {
  double x = 0, y = 0;
};

class Transform2D {
 public:
  /// The identity.
  Transform2D() : m_{1, 0, 0, 0, 1, 0, 0, 0, 1} {}
  explicit Transform2D(const std::array<double, 9>& m) : m_(m) {}

  static Transform2D translation(double dx, double dy);
  static Transform2D scaling(double sx, double sy);
  /// x -> w - x (a horizontal mirror of an image of width w).
  static Transform2D mirror_x(double w);
  /// y -> h - y.
  static Transform2D mirror_y(double h);

  /// torchvision's affine (functional affine, `_get_inverse_affine_matrix` with
  /// inverted=False): about `center`, rotation by `angle_deg` (clockwise on
  /// screen for positive angles, as F.affine; F.rotate turns the other way and
  /// passes -angle), uniform `scale`, shears in degrees along x then y, then a
  /// translation. The forward map.
  static Transform2D affine(double angle_deg, double tx, double ty, double scale,
                            double shear_x_deg, double shear_y_deg, Point2 center);

  /// The forward map of torchvision's F.perspective with PIL-style coefficients
  /// (c0..c7 map output points to input points): the inverse of that homography.
  static Transform2D from_perspective_coeffs(const std::array<double, 8>& c);

  /// this after `first`: (a.then(b))(p) = b(a(p)).
  Transform2D then(const Transform2D& next) const;
  /// The inverse; throws UsageError for a singular map.
  Transform2D inverse() const;
  Point2 apply(Point2 p) const;
  bool is_affine() const { return m_[6] == 0 && m_[7] == 0 && m_[8] == 1; }

  const std::array<double, 9>& m() const { return m_; }
  double operator[](int i) const { return m_[i]; }

 private:
  std::array<double, 9> m_;
};

/// torchvision's `_get_perspective_coeffs(startpoints, endpoints)`: the 8
/// coefficients of the homography that maps each end point to its start point
/// (solved in double, rounded to float32 as torchvision returns them).
std::array<double, 8> perspective_coeffs(const std::array<Point2, 4>& start,
                                         const std::array<Point2, 4>& end);

/// torchvision's `_compute_affine_output_size` for rotate(expand=True): the
/// (w, h) of the canvas that holds a (w x h) image rotated by `angle_deg`
/// (corners rounded outwards after truncating to 1e-4, as torchvision).
void rotated_canvas_size(double angle_deg, int w, int h, int* out_w, int* out_h);

}  // namespace stoker
