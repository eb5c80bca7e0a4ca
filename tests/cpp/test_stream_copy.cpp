// stream_copy: the same bytes as memcpy for every size around the streaming
// threshold and the 64-byte block, every alignment of source and destination,
// and not one byte written outside [dst, dst + n).
#include <cstdint>
#include <cstring>
#include <vector>

#include "check.h"
#include "common/stream_copy.h"

using namespace stoker;

namespace {

void copies_like_memcpy() {
  const size_t sizes[] = {0,    1,    15,   16,   63,    64,    65,    1000,      4095,
                          4096, 4097, 4111, 4160, 12288, 12345, 65536, 65536 + 77};
  constexpr size_t kGuard = 64;
  std::vector<uint8_t> src(65536 + 256), dst(65536 + 256 + 2 * kGuard);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t n : sizes) {
    for (size_t so = 0; so < 18; ++so) {
      for (size_t d_off = 0; d_off < 18; ++d_off) {
        std::memset(dst.data(), 0xA5, dst.size());
        uint8_t* d = dst.data() + kGuard + d_off;
        stream_copy(d, src.data() + so, n);
        CHECK(std::memcmp(d, src.data() + so, n) == 0);
        for (uint8_t* p = dst.data(); p < d; ++p) CHECK_EQ(*p, 0xA5);
        for (uint8_t* p = d + n; p < dst.data() + dst.size(); ++p) CHECK_EQ(*p, 0xA5);
      }
    }
  }
}

}  // namespace

TEST_MAIN(copies_like_memcpy())
