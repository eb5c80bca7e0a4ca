#include "common/checksum.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/cpu.h"
#include "common/detail/simd_kernels.h"
#include "common/error.h"

namespace stoker {

uint64_t detail::xxh3_baseline(const void* data, size_t n) { return XXH3_64bits(data, n); }

uint32_t checksum32(const void* data, size_t n) {
#if defined(__x86_64__)
  // Every path computes the same XXH3 value; on long records AVX2 is about twice as
  // fast as SSE2, and AVX-512 faster again (bench/RESULTS.md).
  if (n >= 256) {
    if (cpu_has_avx512f()) return static_cast<uint32_t>(detail::xxh3_avx512(data, n));
    if (cpu_has_avx2()) return static_cast<uint32_t>(detail::xxh3_avx2(data, n));
  }
#endif
  return static_cast<uint32_t>(detail::xxh3_baseline(data, n));
}

struct StreamingChecksum::State {
  XXH3_state_t s;
};

StreamingChecksum::StreamingChecksum() : state_(std::make_unique<State>()) {
  XXH3_64bits_reset(&state_->s);
}

StreamingChecksum::~StreamingChecksum() = default;

void StreamingChecksum::update(const void* data, size_t n) {
  if (XXH3_64bits_update(&state_->s, data, n) != XXH_OK)
    STOKER_THROW(Error, "checksum update failed");
}

uint32_t StreamingChecksum::digest() const {
  return static_cast<uint32_t>(XXH3_64bits_digest(&state_->s));
}

}  // namespace stoker
