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

/// Prefetches the pages of up to `max_bytes` of the record at `loc`: the
/// first line of each page. The prefetch takes the TLB miss and starts the
/// memory access; the hardware prefetcher streams the rest of each page once
/// the read walks it. (A prefetch of every line, measured on 12 KiB records,
/// was slower: its hundreds of loads fill the core's miss buffers and stall the
/// work it was to overlap.) Never throws; a shard not mapped yet is left alone
/// (mapping it is the read's job, and its errors), so is a bad entry (the read
/// reports it).
inline void prefetch_record(const Dataset& ds, Dataset::Location loc,
                            size_t max_bytes = 32 << 10) noexcept {
  const ShardReader* r = ds.mapped_reader(loc.shard);
  if (!r) return;
  const RecordView v = r->record_unchecked_or_empty(loc.record);
  const uintptr_t end = reinterpret_cast<uintptr_t>(v.data) + std::min(v.size, max_bytes);
  for (uintptr_t p = reinterpret_cast<uintptr_t>(v.data); p < end; p = (p | 4095) + 1)
    __builtin_prefetch(reinterpret_cast<const void*>(p), 0, 3);
}

/// Prefetches the table entry of the record at `loc`: a shuffled read misses
/// the cache on the entry before it can start on the record, so this runs a
/// few records ahead of prefetch_record. Never throws.
inline void prefetch_record_entry(const Dataset& ds, Dataset::Location loc) noexcept {
  if (const ShardReader* r = ds.mapped_reader(loc.shard)) r->prefetch_entry(loc.record);
}

/// The same, by dataset index (a bad index is ignored).
inline void prefetch_record(const Dataset& ds, int64_t index, size_t max_bytes = 32 << 10) {
  if (index >= 0 && index < ds.size()) prefetch_record(ds, ds.locate(index), max_bytes);
}
inline void prefetch_record_entry(const Dataset& ds, int64_t index) {
  if (index >= 0 && index < ds.size()) prefetch_record_entry(ds, ds.locate(index));
}

}  // namespace stoker
