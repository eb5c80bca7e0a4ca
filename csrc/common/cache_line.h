// Cache-line layout of the lock-free structures: data written by different
// threads goes on different lines (alignas(kCacheLineSize)), so that a store
// on one side does not invalidate the line the other side reads.
#pragma once

#include <cstddef>

namespace stoker {

/// Bytes of a cache line on the CPUs stoker targets (x86-64, and the 64-byte
/// lines of most AArch64 cores). Not std::hardware_destructive_interference_size:
/// its value depends on compiler flags, which would make the layout of a type
/// differ between translation units.
constexpr size_t kCacheLineSize = 64;

}  // namespace stoker
