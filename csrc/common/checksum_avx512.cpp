// XXH3 compiled for AVX-512; only called after a CPU check (checksum.cpp).
#if defined(__x86_64__)
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX512
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

#include "common/detail/simd_kernels.h"

namespace stoker::detail {
uint64_t xxh3_avx512(const void* data, size_t n) { return XXH3_64bits(data, n); }
}  // namespace stoker::detail
#endif
