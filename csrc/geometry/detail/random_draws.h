// Distributions over the per-sample stream (rng.h) for the ops: normal
// (RandomErasing's noise), gamma and beta (MixUp/CutMix's and DetectionMixUp's lambda).
// Each takes its draws from the stream only, so results depend on the seed
// alone.
#pragma once

#include <cmath>
#include <cstdint>

#include "geometry/detail/rng.h"

namespace stoker::detail {

/// A standard normal draw (Marsaglia's polar method; the second value of the
/// pair is not kept, so the stream's position depends only on the draws).
inline double normal(SplitMix64& rng) {
  for (;;) {
    const double u = rng.uniform(-1, 1), v = rng.uniform(-1, 1);
    const double s = u * u + v * v;
    if (s > 0 && s < 1) return u * std::sqrt(-2.0 * std::log(s) / s);
  }
}

/// Marsaglia and Tsang's ziggurat for the standard normal (128 layers):
/// nearly every draw is one 64-bit number, a table lookup and a multiply, as
/// against a logarithm and a square root per pair for the polar method.
/// RandomErasing's noise draws one per element.
class NormalZiggurat {
 public:
  NormalZiggurat() {
    constexpr double r = 3.442619855899, v = 9.91256303526217e-3, m = 2147483648.0;
    double dn = r, tn = r;
    const double q = v / std::exp(-0.5 * dn * dn);
    k_[0] = static_cast<uint32_t>(dn / q * m);
    k_[1] = 0;
    w_[0] = q / m;
    w_[127] = dn / m;
    f_[0] = 1.0;
    f_[127] = std::exp(-0.5 * dn * dn);
    for (int i = 126; i >= 1; --i) {
      dn = std::sqrt(-2.0 * std::log(v / dn + std::exp(-0.5 * dn * dn)));
      k_[i + 1] = static_cast<uint32_t>(dn / tn * m);
      tn = dn;
      f_[i] = std::exp(-0.5 * dn * dn);
      w_[i] = dn / m;
    }
  }

  double operator()(SplitMix64& rng) const {
    for (;;) {
      const uint64_t bits = rng.next();
      const int32_t hz = static_cast<int32_t>(bits);  // signed 32 bits
      const int iz = static_cast<int>((bits >> 32) & 127);
      const uint32_t az =
          hz < 0 ? static_cast<uint32_t>(-static_cast<int64_t>(hz)) : static_cast<uint32_t>(hz);
      if (az < k_[iz]) return hz * w_[iz];
      if (iz == 0) {  // the tail beyond r
        constexpr double r = 3.442619855899;
        double x, y;
        do {
          x = -std::log(rng.uniform(0x1p-53, 1)) / r;
          y = -std::log(rng.uniform(0x1p-53, 1));
        } while (y + y < x * x);
        return hz > 0 ? r + x : -r - x;
      }
      const double x = hz * w_[iz];
      if (f_[iz] + rng.uniform(0, 1) * (f_[iz - 1] - f_[iz]) < std::exp(-0.5 * x * x)) return x;
    }
  }

 private:
  uint32_t k_[128];
  double w_[128];
  double f_[128];
};

/// The shared table (built once).
inline const NormalZiggurat& normal_ziggurat() {
  static const NormalZiggurat z;
  return z;
}

/// Gamma(shape, 1) (Marsaglia and Tsang 2000; shape < 1 by the boost
/// Gamma(shape + 1) * U^(1 / shape)).
inline double gamma(SplitMix64& rng, double shape) {
  if (shape < 1) {
    const double g = gamma(rng, shape + 1);
    double u = rng.uniform(0, 1);
    while (u <= 0) u = rng.uniform(0, 1);
    return g * std::pow(u, 1.0 / shape);
  }
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x, v;
    do {
      x = normal(rng);
      v = 1.0 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const double u = rng.uniform(0, 1);
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (u > 0 && std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

/// Beta(a, b) as X / (X + Y) of two gammas.
inline double beta(SplitMix64& rng, double a, double b) {
  const double x = gamma(rng, a), y = gamma(rng, b);
  return x + y > 0 ? x / (x + y) : 0.5;
}

}  // namespace stoker::detail
