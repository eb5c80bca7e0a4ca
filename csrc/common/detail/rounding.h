// Round half to even (torch.round, numpy.rint) to an int without a library
// call: below SSE4.1, std::nearbyint is a call into libm, which costs more
// than the arithmetic around it and stops loops from vectorising. SSE2's
// conversions round in the current mode, round-to-nearest-even unless a
// program changes it (none does here). Other machines use std::nearbyint.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace stoker::detail {

/// nearbyint(v) for |v| < 2^31.
inline int32_t round_even(float v) {
#if defined(__SSE2__)
  return _mm_cvtss_si32(_mm_set_ss(v));
#else
  return static_cast<int32_t>(std::nearbyint(v));
#endif
}

/// nearbyint(v) for |v| < 2^31.
inline int32_t round_even(double v) {
#if defined(__SSE2__)
  return _mm_cvtsd_si32(_mm_set_sd(v));
#else
  return static_cast<int32_t>(std::nearbyint(v));
#endif
}

/// round_even(v) clamped to [0, 255].
inline uint8_t round_u8(float v) {
  v = v < -1.0f ? -1.0f : v > 256.0f ? 256.0f : v;  // keeps the conversion in range
  const int32_t q = round_even(v);
  return static_cast<uint8_t>(q < 0 ? 0 : q > 255 ? 255 : q);
}

}  // namespace stoker::detail
