// checksum32's vector variants give the same XXH3 as the portable code, for
// every length around the vectors' block sizes and the dispatch threshold, at
// every alignment: a shard written on one machine verifies on another.
#include <cstdint>
#include <vector>

#include "check.h"
#include "common/checksum.h"
#include "common/cpu.h"
#include "common/detail/simd_kernels.h"

using namespace stoker;

namespace {

void variants_agree() {
  std::vector<uint8_t> data(20000);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (uint8_t& b : data) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
  std::vector<size_t> sizes;
  for (size_t n = 0; n <= 1100; ++n) sizes.push_back(n);
  for (size_t n : {2047, 2048, 2049, 4095, 4096, 12288, 12345, 19000}) sizes.push_back(n);
  int checked = 0;
  for (size_t n : sizes) {
    for (size_t off = 0; off < 8; ++off) {
      const uint8_t* p = data.data() + off;
      const uint64_t want = detail::xxh3_baseline(p, n);
      CHECK_EQ(static_cast<uint64_t>(checksum32(p, n)), want & 0xFFFFFFFFu);
#if defined(__x86_64__)
      if (cpu_has_avx2()) CHECK_EQ(detail::xxh3_avx2(p, n), want);
      if (cpu_has_avx512f()) CHECK_EQ(detail::xxh3_avx512(p, n), want);
#endif
      ++checked;
    }
  }
  CHECK(checked > 8000);
  // and the hash is not constant
  CHECK(detail::xxh3_baseline(data.data(), 100) != detail::xxh3_baseline(data.data() + 1, 100));
}

}  // namespace

TEST_MAIN(variants_agree())
