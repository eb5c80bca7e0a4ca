#include "decode/warp.h"

#include <cmath>
#include <cstring>

#include "common/error.h"

namespace stoker {

namespace {

inline uint8_t round_u8(float v) {
  v = std::nearbyint(v);  // half to even, as torch.round
  return static_cast<uint8_t>(v < 0.f ? 0.f : v > 255.f ? 255.f : v);
}

// The source point of output pixel (j, i), as a pixel index (centre at .0).
struct Sampler {
  const Transform2D& t;
  bool affine;
  inline void at(double j, double i, double* x, double* y) const {
    const double px = j + 0.5, py = i + 0.5;
    double sx = t[0] * px + t[1] * py + t[2];
    double sy = t[3] * px + t[4] * py + t[5];
    if (!affine) {
      const double z = t[6] * px + t[7] * py + t[8];
      sx /= z;
      sy /= z;
    }
    *x = sx - 0.5;
    *y = sy - 0.5;
  }
};

template <int C>
void warp_nearest(const Pixels& src, const Pixels& dst, const Sampler& s, const Fill* fill) {
  uint8_t outside[C];
  for (int c = 0; c < C; ++c) outside[c] = fill ? fill->v[c] : 0;
  for (int i = 0; i < dst.height; ++i) {
    uint8_t* out = dst.row(i);
    for (int j = 0; j < dst.width; ++j, out += C) {
      double fx, fy;
      s.at(j, i, &fx, &fy);
      const double rx = std::nearbyint(fx), ry = std::nearbyint(fy);
      if (rx >= 0 && rx < src.width && ry >= 0 && ry < src.height) {
        const uint8_t* p = src.row(static_cast<int>(ry)) + static_cast<size_t>(rx) * C;
        for (int c = 0; c < C; ++c) out[c] = p[c];
      } else {
        for (int c = 0; c < C; ++c) out[c] = outside[c];
      }
    }
  }
}

template <int C>
void warp_bilinear(const Pixels& src, const Pixels& dst, const Sampler& s, const Fill* fill) {
  const int w = src.width, h = src.height;
  for (int i = 0; i < dst.height; ++i) {
    uint8_t* out = dst.row(i);
    for (int j = 0; j < dst.width; ++j, out += C) {
      double fx, fy;
      s.at(j, i, &fx, &fy);
      const double x0d = std::floor(fx), y0d = std::floor(fy);
      if (x0d < -1 || y0d < -1 || x0d >= w || y0d >= h) {  // no tap inside
        for (int c = 0; c < C; ++c) out[c] = fill ? fill->v[c] : 0;
        continue;
      }
      const int x0 = static_cast<int>(x0d), y0 = static_cast<int>(y0d);
      const float ax = static_cast<float>(fx - x0d), ay = static_cast<float>(fy - y0d);
      const float wts[4] = {(1 - ax) * (1 - ay), ax * (1 - ay), (1 - ax) * ay, ax * ay};
      const int xs[4] = {x0, x0 + 1, x0, x0 + 1};
      const int ys[4] = {y0, y0, y0 + 1, y0 + 1};
      float acc[C] = {};
      float m = 0;
      for (int k = 0; k < 4; ++k) {
        if (xs[k] < 0 || xs[k] >= w || ys[k] < 0 || ys[k] >= h) continue;
        const uint8_t* p = src.row(ys[k]) + static_cast<size_t>(xs[k]) * C;
        for (int c = 0; c < C; ++c) acc[c] += wts[k] * static_cast<float>(p[c]);
        m += wts[k];
      }
      for (int c = 0; c < C; ++c) {
        float v = acc[c];
        if (fill) {
          const float f = fill->v[c];
          v = (v - f) * m + f;
        }
        out[c] = round_u8(v);
      }
    }
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
  const Sampler s{inv, inv.is_affine()};
  if (interp == Interpolation::kNearest) {
    if (src.channels == 1)
      warp_nearest<1>(src, dst, s, fill);
    else
      warp_nearest<3>(src, dst, s, fill);
  } else {
    if (src.channels == 1)
      warp_bilinear<1>(src, dst, s, fill);
    else
      warp_bilinear<3>(src, dst, s, fill);
  }
}

}  // namespace stoker
