// The ceiling a record loader is measured against: reading the records of a
// dataset in a random order with no loader around it, on `threads` threads,
// each record prefetched one ahead, verified (or not) and copied into
// batch-sized buffers that rotate as a loader's slots do. `stoker bench`
// prints the loader's rate against it.
#pragma once

#include <cstdint>

#include "format/dataset.h"

namespace stoker {

/// Records per second over `rounds` passes of a random order of all records
/// (the median pass). Throws DataError for a corrupt record when `verify`.
double random_read_rate(const Dataset& ds, int threads, bool verify, int rounds = 3);

}  // namespace stoker
