// CPU features checked at run time, for kernels built with -mavx2 in files of
// their own (checksum_avx2.cpp, geometry/resize_avx2.cpp) next to a portable version.
#pragma once

namespace stoker {

inline bool cpu_has_avx2() {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
#else
  return false;
#endif
}

inline bool cpu_has_avx512f() {
#if defined(__x86_64__)
  static const bool avx512f = __builtin_cpu_supports("avx512f");
  return avx512f;
#else
  return false;
#endif
}

}  // namespace stoker
