// stream_copy's loop with 64-byte non-temporal stores; only called after a CPU
// check (stream_copy.cpp). One store fills a whole write-combining buffer, so
// each line leaves the core in one piece instead of four.
#if defined(__x86_64__)
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/detail/simd_kernels.h"

namespace stoker::detail {

void stream_copy_avx512(uint8_t* d, const uint8_t* s, size_t n, const uint8_t* ahead,
                        size_t ahead_n) {
  // Plain stores up to the destination's first 64-byte boundary.
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
  std::memcpy(d, s, head);
  size_t i = head, k = 0;
  for (; i + 128 <= n; i += 128) {
    if (k < ahead_n) {  // two lines of `ahead` per two copied (a prefetch never faults)
      _mm_prefetch(reinterpret_cast<const char*>(ahead + k), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(ahead + k + 64), _MM_HINT_T0);
      k += 128;
    }
    const __m512i a = _mm512_loadu_si512(s + i);
    const __m512i b = _mm512_loadu_si512(s + i + 64);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i), a);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i + 64), b);
  }
  for (; i + 64 <= n; i += 64)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i), _mm512_loadu_si512(s + i));
  std::memcpy(d + i, s + i, n - i);
  _mm_sfence();  // see stream_copy_sse2
}

}  // namespace stoker::detail
#endif
