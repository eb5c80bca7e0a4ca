// XXH3 compiled for AVX-512; only called after a CPU check (checksum.cpp).
#if defined(__x86_64__)
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX512
// GCC 12 reports its own _mm512_undefined_epi32() (in avx512fintrin.h, inlined
// into xxHash's AVX-512 loop at -O3) as used uninitialized: a known false
// positive of the compiler's header, not of this code or xxHash's.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

#include "common/detail/simd_kernels.h"

namespace stoker::detail {
uint64_t xxh3_avx512(const void* data, size_t n) { return XXH3_64bits(data, n); }
}  // namespace stoker::detail
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif
