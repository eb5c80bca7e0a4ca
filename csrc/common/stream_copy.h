// Copying records into a batch without pulling the batch through the cache.
//
// A worker reads a record (the checksum pass brings it into cache), then copies
// it into the batch. A plain memcpy to a destination that is not in cache first
// reads every destination line from memory (the store's read-for-ownership),
// then writes it back: three trips over the memory bus per byte delivered where
// two would do. A batch of hundreds of KiB or more is not read again by this
// core soon (the consumer runs on another core, or a DMA engine reads it), so
// keeping it in cache buys nothing: non-temporal stores write it straight to
// memory. On a memory-bound 2-core VM this took shuffled, verified 12 KiB
// records from 1.08x to 1.37x a one-thread NumPy gather of the same records
// (`stoker bench`, 2 threads, medians of 3 interleaved runs).
#pragma once

#include <cstddef>

namespace stoker {

/// Copies below this many bytes use memcpy: their lines are few, and a small
/// batch may well still be in cache when the consumer reads it.
inline constexpr size_t kStreamCopyMin = 4096;

/// memcpy(dst, src, n), with non-temporal stores for n >= kStreamCopyMin where
/// the CPU has them (x86-64; elsewhere a memcpy). The stores are fenced before
/// it returns, so a release store that publishes `dst` afterwards orders them
/// like ordinary stores.
void stream_copy(void* dst, const void* src, size_t n);

}  // namespace stoker
