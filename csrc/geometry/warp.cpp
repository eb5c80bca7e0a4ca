#include "geometry/warp.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/cpu.h"
#include "common/detail/rounding.h"
#include "common/error.h"

namespace stoker {

namespace detail {
#if defined(__x86_64__)
// warp_avx2.cpp, built with -mavx2.
int warp_bilinear_row_avx2(const uint8_t* src, size_t stride, double x0, double dx, double y0,
                           double dy, int j0, int j1, const float* fill, uint8_t* out);
#endif
}  // namespace detail

namespace {

// nearbyint(x) (half to even) as an index into [0, n), or -1 outside; the
// range test first keeps NaN and huge values away from the conversion.
inline int nearest_index(double x, int n) {
  if (!(x > -1.0 && x < n)) return -1;
  const int i = detail::round_even(x);
  return i >= 0 && i < n ? i : -1;
}

// The source point of output pixel (j, i), as a pixel index (centre at .0):
// for an affine map, x = x0 + j * dx along a row.
struct Row {
  double x0, dx, y0, dy, z0, dz;
  bool affine;
  Row(const Transform2D& t, int i) {
    const double py = i + 0.5;
    // column j: px = j + 0.5
    x0 = t[0] * 0.5 + t[1] * py + t[2];
    y0 = t[3] * 0.5 + t[4] * py + t[5];
    z0 = t[6] * 0.5 + t[7] * py + t[8];
    dx = t[0], dy = t[3], dz = t[6];
    affine = t.is_affine();
  }
  inline void at(int j, double* x, double* y) const {
    double sx = x0 + dx * j, sy = y0 + dy * j;
    if (!affine) {
      const double z = z0 + dz * j;
      sx /= z;
      sy /= z;
    }
    *x = sx - 0.5;
    *y = sy - 0.5;
  }
};

template <int C>
void warp_nearest(const Pixels& src, const Pixels& dst, const Transform2D& t,
                  const uint8_t* outside) {
  const int w = src.width, h = src.height;
  for (int i = 0; i < dst.height; ++i) {
    const Row row(t, i);
    uint8_t* out = dst.row(i);
    int j = 0;
    if (row.affine) {
      // The span of the row whose samples are inside (with a pixel of margin
      // left to the checked loop): no tests per pixel in it.
      double lo = 0, hi = dst.width;
      auto clip = [&](double a0, double da, double n) {  // a0 + j da in [0.5, n - 1.5]
        if (da == 0) {
          if (!(a0 >= 0.5 && a0 <= n - 1.5)) hi = lo;
          return;
        }
        double j0 = (0.5 - a0) / da, j1 = (n - 1.5 - a0) / da;
        if (j0 > j1) std::swap(j0, j1);
        lo = std::max(lo, std::ceil(j0));
        hi = std::min(hi, std::floor(j1) + 1);
      };
      clip(row.x0 - 0.5, row.dx, w);
      clip(row.y0 - 0.5, row.dy, h);
      lo = std::min(lo, static_cast<double>(dst.width));  // a span outside the row is empty
      hi = std::clamp(hi, lo, static_cast<double>(dst.width));
      const int j_lo = static_cast<int>(lo), j_hi = static_cast<int>(hi);
      for (; j < j_lo; ++j, out += C) {
        double fx, fy;
        row.at(j, &fx, &fy);
        const int x = nearest_index(fx, w), y = nearest_index(fy, h);
        const uint8_t* p = (x | y) >= 0 ? src.row(y) + static_cast<size_t>(x) * C : outside;
        for (int c = 0; c < C; ++c) out[c] = p[c];
      }
      for (; j < j_hi; ++j, out += C) {
        const int x = detail::round_even(row.x0 - 0.5 + row.dx * j);
        const int y = detail::round_even(row.y0 - 0.5 + row.dy * j);
        const uint8_t* p = src.row(y) + static_cast<size_t>(x) * C;
        for (int c = 0; c < C; ++c) out[c] = p[c];
      }
    }
    for (; j < dst.width; ++j, out += C) {
      double fx, fy;
      row.at(j, &fx, &fy);
      const int x = nearest_index(fx, w), y = nearest_index(fy, h);
      const uint8_t* p = (x | y) >= 0 ? src.row(y) + static_cast<size_t>(x) * C : outside;
      for (int c = 0; c < C; ++c) out[c] = p[c];
    }
  }
}

// Output pixel j of `row`: the four taps, those outside counting as 0, and
// `fill` blended in by the weight outside (warp.h).
template <int C>
inline void bilinear_pixel(const Pixels& src, const Row& row, int j, const Fill* fill,
                           const float* fv, uint8_t* out) {
  const int w = src.width, h = src.height;
  double fx, fy;
  row.at(j, &fx, &fy);
  if (!(fx > -1.0 && fx < w && fy > -1.0 && fy < h)) {  // no tap inside (NaN too)
    for (int c = 0; c < C; ++c) out[c] = static_cast<uint8_t>(fv[c]);
    return;
  }
  // floor, for x > -1: truncation, one lower when x < 0
  const int x0 = static_cast<int>(fx) - (fx < 0), y0 = static_cast<int>(fy) - (fy < 0);
  const float ax = static_cast<float>(fx - x0), ay = static_cast<float>(fy - y0);
  const float bx = 1.0f - ax, by = 1.0f - ay;
  // Taps outside count as 0 (weight and value): clamp their index, zero their weight.
  const bool in_x0 = x0 >= 0, in_x1 = x0 + 1 < w, in_y0 = y0 >= 0, in_y1 = y0 + 1 < h;
  const float w00 = in_x0 && in_y0 ? bx * by : 0.0f;
  const float w01 = in_x1 && in_y0 ? ax * by : 0.0f;
  const float w10 = in_x0 && in_y1 ? bx * ay : 0.0f;
  const float w11 = in_x1 && in_y1 ? ax * ay : 0.0f;
  const uint8_t* r0 = src.row(in_y0 ? y0 : y0 + 1);
  const uint8_t* r1 = src.row(in_y1 ? y0 + 1 : y0);
  const size_t c0 = static_cast<size_t>(in_x0 ? x0 : x0 + 1) * C;
  const size_t c1 = static_cast<size_t>(in_x1 ? x0 + 1 : x0) * C;
  const float m = ((w00 + w01) + w10) + w11;
  for (int c = 0; c < C; ++c) {
    float v = ((w00 * r0[c0 + c] + w01 * r0[c1 + c]) + w10 * r1[c0 + c]) + w11 * r1[c1 + c];
    if (fill) v = (v - fv[c]) * m + fv[c];
    out[c] = detail::round_u8(v);
  }
}

// For an affine row: the span [*j0, *j1) of output columns whose source
// point (x, y) has x in [0, xmax) and y in [0, ymax), checked exactly at both
// ends (the points move monotonically along a row, and so do their roundings).
void inner_span(const Row& row, int n, double xmax, double ymax, int* j0, int* j1) {
  double lo = 0, hi = n;
  auto clip = [&](double a0, double da, double amax) {  // a0 + j da in [0, amax)
    if (da == 0) {
      if (!(a0 >= 0 && a0 < amax)) hi = lo;
      return;
    }
    double ja = (0 - a0) / da, jb = (amax - a0) / da;
    if (ja > jb) std::swap(ja, jb);
    lo = std::max(lo, std::ceil(ja));
    hi = std::min(hi, std::floor(jb) + 1);
  };
  clip(row.x0 - 0.5, row.dx, xmax);
  clip(row.y0 - 0.5, row.dy, ymax);
  if (!(lo < hi)) {
    *j0 = *j1 = 0;
    return;
  }
  int a = static_cast<int>(lo), b = static_cast<int>(hi);
  auto inside = [&](int j) {
    double x, y;
    row.at(j, &x, &y);
    return x >= 0 && x < xmax && y >= 0 && y < ymax;
  };
  while (a < b && !inside(a)) ++a;
  while (b > a && !inside(b - 1)) --b;
  *j0 = a;
  *j1 = b;
}

template <int C>
void warp_bilinear(const Pixels& src, const Pixels& dst, const Transform2D& t, const Fill* fill) {
  const int w = src.width, h = src.height;
  float fv[C];
  for (int c = 0; c < C; ++c) fv[c] = fill ? fill->v[c] : 0.0f;
#if defined(__x86_64__)
  // All four taps inside, each read as 4 bytes (a spare byte right of the
  // right-hand ones), offsets within int32: the vector loop.
  const bool simd = C == 3 && t.is_affine() && w >= 3 && h >= 2 && cpu_has_avx2() &&
                    static_cast<double>(h) * src.stride < 2147483647.0 - 64;
#endif
  for (int i = 0; i < dst.height; ++i) {
    const Row row(t, i);
    uint8_t* out = dst.row(i);
    int skip0 = dst.width, skip1 = dst.width;  // columns written by the vector loop
#if defined(__x86_64__)
    if (simd) {
      int a = 0, b = 0;
      inner_span(row, dst.width, w - 2, h - 1, &a, &b);
      const int done = detail::warp_bilinear_row_avx2(src.data, src.stride, row.x0, row.dx, row.y0,
                                                      row.dy, a, b, fill ? fv : nullptr, out);
      skip0 = a;
      skip1 = a + done;
    }
#endif
    for (int j = 0; j < skip0; ++j) bilinear_pixel<C>(src, row, j, fill, fv, out + j * C);
    for (int j = skip1; j < dst.width; ++j) bilinear_pixel<C>(src, row, j, fill, fv, out + j * C);
  }
}

}  // namespace

void warp_pixels(const Pixels& src, const Pixels& dst, const Transform2D& inv, Interpolation interp,
                 const Fill* fill) {
  STOKER_CHECK(src.channels == dst.channels && (src.channels == 1 || src.channels == 3), UsageError,
               "warp: 1 or 3 channels, the same in and out");
  if (dst.empty()) return;
  if (src.empty()) {
    for (int i = 0; i < dst.height; ++i) {
      uint8_t* out = dst.row(i);
      for (int j = 0; j < dst.width; ++j)
        for (int c = 0; c < dst.channels; ++c) out[j * dst.channels + c] = fill ? fill->v[c] : 0;
    }
    return;
  }
  if (interp == Interpolation::kNearest) {
    const uint8_t outside[3] = {fill ? fill->v[0] : uint8_t{0}, fill ? fill->v[1] : uint8_t{0},
                                fill ? fill->v[2] : uint8_t{0}};
    if (src.channels == 1)
      warp_nearest<1>(src, dst, inv, outside);
    else
      warp_nearest<3>(src, dst, inv, outside);
  } else {
    if (src.channels == 1)
      warp_bilinear<1>(src, dst, inv, fill);
    else
      warp_bilinear<3>(src, dst, inv, fill);
  }
}

void warp_nearest_elements(const Pixels& src, const Pixels& dst, const Transform2D& inv,
                           const uint8_t* fill) {
  const int e = src.channels;
  STOKER_CHECK(dst.channels == e && (e == 1 || e == 2 || e == 4 || e == 8), UsageError,
               "warp: elements of 1, 2, 4 or 8 bytes, the same in and out");
  if (dst.empty()) return;
  if (src.empty()) {
    for (int i = 0; i < dst.height; ++i)
      for (int j = 0; j < dst.width; ++j)
        std::memcpy(dst.row(i) + static_cast<size_t>(j) * e, fill, e);
    return;
  }
  switch (e) {
    case 1:
      return warp_nearest<1>(src, dst, inv, fill);
    case 2:
      return warp_nearest<2>(src, dst, inv, fill);
    case 4:
      return warp_nearest<4>(src, dst, inv, fill);
    default:
      return warp_nearest<8>(src, dst, inv, fill);
  }
}

}  // namespace stoker
