#include "common/stream_copy.h"

#include <cstdint>
#include <cstring>

#include "common/cpu.h"
#include "common/detail/simd_kernels.h"

#if defined(__x86_64__)
#include <emmintrin.h>  // SSE2: every x86-64 CPU has it, no dispatch needed
#include <xmmintrin.h>  // _mm_prefetch
#endif

namespace stoker {

#if defined(__x86_64__)
void detail::stream_copy_sse2(uint8_t* d, const uint8_t* s, size_t n, const uint8_t* ahead,
                              size_t ahead_n) {
  // Plain stores up to the destination's first 16-byte boundary (the
  // streaming store needs it); the source may stay unaligned.
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  std::memcpy(d, s, head);
  size_t i = head, k = 0;
  for (; i + 64 <= n; i += 64) {
    if (k < ahead_n) {  // (a prefetch never faults, wherever it points)
      _mm_prefetch(reinterpret_cast<const char*>(ahead + k), _MM_HINT_T0);
      k += 64;
    }
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + i, s + i, n - i);
  // Streaming stores are weakly ordered: without the fence, a consumer that
  // acquires the batch could still read stale bytes of it.
  _mm_sfence();
}
#endif

void stream_copy(void* dst, const void* src, size_t n, const void* ahead, size_t ahead_n) {
#if defined(__x86_64__)
  if (n >= kStreamCopyMin) {
    auto* d = static_cast<uint8_t*>(dst);
    const auto* s = static_cast<const uint8_t*>(src);
    const auto* a = static_cast<const uint8_t*>(ahead);
    if (cpu_has_avx512f())
      detail::stream_copy_avx512(d, s, n, a, ahead_n);
    else
      detail::stream_copy_sse2(d, s, n, a, ahead_n);
    return;
  }
#endif
  (void)ahead;
  (void)ahead_n;
  std::memcpy(dst, src, n);
}

}  // namespace stoker
