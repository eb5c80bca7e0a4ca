// stream_copy: the same bytes as memcpy for every size around the streaming
// threshold and the 64-byte block, every alignment of source and destination,
// with and without a region to prefetch, and not one byte written outside
// [dst, dst + n). Each vector variant the CPU runs is checked on its own too.
#include <cstdint>
#include <cstring>
#include <vector>

#include "check.h"
#include "common/cpu.h"
#include "common/detail/simd_kernels.h"
#include "common/stream_copy.h"

using namespace stoker;

namespace {

using Copy = void (*)(uint8_t*, const uint8_t*, size_t, const uint8_t*, size_t);

void copies_like_memcpy(Copy copy, size_t min_size) {
  const size_t sizes[] = {0,    1,    15,   16,   63,   64,   65,    127,   128,   129,
                          1000, 4095, 4096, 4097, 4111, 4160, 12288, 12345, 65536, 65536 + 77};
  constexpr size_t kGuard = 64;
  std::vector<uint8_t> src(65536 + 256), dst(65536 + 256 + 2 * kGuard), next(70000, 1);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t n : sizes) {
    if (n < min_size) continue;
    for (size_t so = 0; so < 18; ++so) {
      for (size_t d_off = 0; d_off < 18; ++d_off) {
        for (int with_ahead = 0; with_ahead < 2; ++with_ahead) {
          std::memset(dst.data(), 0xA5, dst.size());
          uint8_t* d = dst.data() + kGuard + d_off;
          // `ahead` as the sample writer passes it: another record, of any size
          const uint8_t* ahead = with_ahead ? next.data() + so : nullptr;
          const size_t ahead_n = with_ahead ? n / 2 + 100 : 0;
          copy(d, src.data() + so, n, ahead, ahead_n);
          CHECK(std::memcmp(d, src.data() + so, n) == 0);
          for (uint8_t* p = dst.data(); p < d; ++p) CHECK_EQ(*p, 0xA5);
          for (uint8_t* p = d + n; p < dst.data() + dst.size(); ++p) CHECK_EQ(*p, 0xA5);
        }
      }
    }
  }
}

void dispatched(uint8_t* d, const uint8_t* s, size_t n, const uint8_t* a, size_t an) {
  stream_copy(d, s, n, a, an);
}

void every_variant() {
  copies_like_memcpy(dispatched, 0);
#if defined(__x86_64__)
  copies_like_memcpy(detail::stream_copy_sse2, 64);  // the variants take n >= 64
  if (cpu_has_avx512f()) copies_like_memcpy(detail::stream_copy_avx512, 64);
#endif
}

}  // namespace

TEST_MAIN(every_variant())
