// Hints to start loading a record before it is read. A shuffled epoch reads
// records at random places in the mapping: each read first misses the cache on
// its record-table entry, then misses the TLB and the cache on every page of
// the record; the hardware prefetcher streams lines within a page once a read
// walks it, but cannot guess the next record. The sample writer asks for the
// table entry a few records ahead and for the next record's pages one ahead.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "format/dataset.h"

namespace stoker {

/// Prefetches the pages of up to `max_bytes` of record `index`: the first line
/// of each page. The prefetch takes the TLB miss and starts the memory access;
/// the hardware prefetcher streams the rest of each page once the read walks
/// it. (A prefetch of every line, measured on 12 KiB records, was slower: its
/// hundreds of loads fill the core's miss buffers and stall the work it was to
/// overlap.) Never throws; a bad index is ignored (the read reports it).
inline void prefetch_record(const Dataset& ds, int64_t index, size_t max_bytes = 32 << 10) {
  if (index < 0 || index >= ds.size()) return;
  const Dataset::Location loc = ds.locate(index);
  if (!ds.is_mapped(loc.shard)) return;  // mapping it is the read's job (and its errors)
  const RecordView r = ds.shard(loc.shard).record_unchecked(loc.record);
  const uintptr_t end = reinterpret_cast<uintptr_t>(r.data) + std::min(r.size, max_bytes);
  for (uintptr_t p = reinterpret_cast<uintptr_t>(r.data); p < end; p = (p | 4095) + 1)
    __builtin_prefetch(reinterpret_cast<const void*>(p), 0, 3);
}

/// Prefetches record `index`'s entry in its shard's record table: a shuffled
/// read misses the cache on the entry before it can start on the record, so
/// this runs a few records ahead of prefetch_record. Never throws.
inline void prefetch_record_entry(const Dataset& ds, int64_t index) {
  if (index < 0 || index >= ds.size()) return;
  const Dataset::Location loc = ds.locate(index);
  if (ds.is_mapped(loc.shard)) ds.shard(loc.shard).prefetch_entry(loc.record);
}

}  // namespace stoker
