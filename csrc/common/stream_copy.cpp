#include "common/stream_copy.h"

#include <cstdint>
#include <cstring>

#include "common/cpu.h"

#if defined(__x86_64__)
#include <emmintrin.h>  // SSE2: every x86-64 CPU has it, no dispatch needed
#endif

namespace stoker {

namespace detail {
#if defined(__x86_64__)
void stream_copy_avx512(uint8_t* d, const uint8_t* s, size_t n);  // stream_copy_avx512.cpp
#endif
}  // namespace detail

void stream_copy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  if (n >= kStreamCopyMin) {
    if (cpu_has_avx512f()) {
      detail::stream_copy_avx512(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n);
      return;
    }
    auto* d = static_cast<uint8_t*>(dst);
    const auto* s = static_cast<const uint8_t*>(src);
    // Plain stores up to the destination's first 16-byte boundary (the
    // streaming store needs it); the source may stay unaligned.
    const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
    std::memcpy(d, s, head);
    size_t i = head;
    for (; i + 64 <= n; i += 64) {
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
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

}  // namespace stoker
