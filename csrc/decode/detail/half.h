// float -> IEEE binary16 for Normalize(dtype="float16"), without F16C so the
// result is the same on every x86 and ARM machine.
#pragma once

#include <cstdint>
#include <cstring>

namespace stoker::detail {

/// Round to nearest even, with subnormals, infinities and NaN kept.
inline uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t biased = (x >> 23) & 0xFF;
  uint32_t mant = x & 0x7FFFFF;
  if (biased == 0xFF) return static_cast<uint16_t>(sign | 0x7C00 | (mant ? 0x200 : 0));
  const int32_t exp = static_cast<int32_t>(biased) - 127 + 15;
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7C00);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000;
    const int shift = 14 - exp;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // a carry into the exponent is right
  return static_cast<uint16_t>(sign | half);
}

}  // namespace stoker::detail
