// Distributions over the per-sample stream (rng.h) for the augmentations:
// normal (RandomErasing's noise), gamma and beta (MixUp/CutMix's lambda).
// Each takes its draws from the stream only, so results depend on the seed
// alone.
#pragma once

#include <cmath>

#include "decode/detail/rng.h"

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
