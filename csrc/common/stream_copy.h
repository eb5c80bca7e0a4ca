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
///
/// `ahead` (optional): up to `ahead_n` bytes to start loading into cache while
/// copying, one line per 64 bytes copied: the next record, whose checksum pass
/// then reads it from cache. Spread over the copy, the loads overlap its stores
/// without filling the core's miss buffers at once (which a burst of a whole
/// record's prefetches did, and was slower). Measured on 12 KiB records: +8-10%
/// with 1 and 2 threads (bench/RESULTS.md).
void stream_copy(void* dst, const void* src, size_t n, const void* ahead = nullptr,
                 size_t ahead_n = 0);

}  // namespace stoker
