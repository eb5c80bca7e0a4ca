// The shard format's checksum: the low 32 bits of XXH3-64 (xxHash).
//
// Every record is verified on every read, so the checksum must cost well under
// a copy of the same bytes. CRC-32C runs at ~7 GB/s on the CRC instruction of
// common x86 cores (throughput-bound, so interleaving does not help), slower
// than the memcpy it protects; XXH3 runs at tens of GB/s with SSE2/AVX2/AVX-512.
// xxHash is used header-only (XXH_INLINE_ALL), so it adds no runtime library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace stoker {

/// Checksum of `n` bytes at `data`.
uint32_t checksum32(const void* data, size_t n);

/// Incremental form: update() over consecutive pieces gives checksum32 of the whole.
class StreamingChecksum {
 public:
  StreamingChecksum();
  ~StreamingChecksum();
  StreamingChecksum(const StreamingChecksum&) = delete;
  StreamingChecksum& operator=(const StreamingChecksum&) = delete;
  void update(const void* data, size_t n);
  uint32_t digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace stoker
