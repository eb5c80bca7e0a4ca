// A hint to start loading a record's bytes before they are read. A shuffled
// epoch reads records at random places in the mapping: each read then waits
// for memory, and the hardware prefetcher, which follows streams within a
// page, cannot guess the next record. Asking for the next record while the
// current one is verified and copied overlaps the two (measured on 12 KiB
// records: 450k -> 650k records/s on one thread).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "format/dataset.h"

namespace stoker {

/// Prefetches up to `max_bytes` of record `index` into the cache. Never throws
/// for a valid index; a bad one is ignored (the read reports it).
inline void prefetch_record(const Dataset& ds, int64_t index, size_t max_bytes = 32 << 10) {
  if (index < 0 || index >= ds.size()) return;
  const Dataset::Location loc = ds.locate(index);
  if (!ds.is_mapped(loc.shard)) return;  // mapping it is the read's job (and its errors)
  const RecordView r = ds.shard(loc.shard).record_unchecked(loc.record);
  const size_t n = std::min(r.size, max_bytes);
  for (size_t off = 0; off < n; off += 64) __builtin_prefetch(r.data + off, 0, 3);
}

}  // namespace stoker
