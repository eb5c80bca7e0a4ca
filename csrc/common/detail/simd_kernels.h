// The vector variants behind checksum32 and stream_copy, each built for its
// instruction set in a file of its own and chosen at run time
// (common/cpu.h). Declared here so that tests can hold every variant the CPU
// runs to the portable one.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stoker::detail {

/// XXH3-64 of `n` bytes: SSE2 (or the target's baseline), AVX2, AVX-512F.
/// All three give the same value.
uint64_t xxh3_baseline(const void* data, size_t n);
#if defined(__x86_64__)
uint64_t xxh3_avx2(const void* data, size_t n);    // checksum_avx2.cpp, -mavx2
uint64_t xxh3_avx512(const void* data, size_t n);  // checksum_avx512.cpp, -mavx512f

/// stream_copy's loop (n >= 64): 16-byte streaming stores (SSE2) or 64-byte
/// ones (AVX-512F), prefetching `ahead` as stream_copy.h says.
void stream_copy_sse2(uint8_t* d, const uint8_t* s, size_t n, const uint8_t* ahead, size_t ahead_n);
void stream_copy_avx512(uint8_t* d, const uint8_t* s, size_t n, const uint8_t* ahead,
                        size_t ahead_n);  // stream_copy_avx512.cpp
#endif

}  // namespace stoker::detail
