// Running a producer's batches without the loader core: the Python checks of
// a producer against its reference, and the benchmarks that time a producer
// alone. The core (loader_core.h) is what loaders use; this has no ring, no
// pool and no order, only the same units on plain threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "pipeline/batch_producer.h"

namespace stoker {

/// A 64-byte aligned buffer for one batch (what a loader's slot is).
class BatchBuffer {
 public:
  explicit BatchBuffer(size_t bytes);
  ~BatchBuffer();
  BatchBuffer(const BatchBuffer&) = delete;
  BatchBuffer& operator=(const BatchBuffer&) = delete;
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_;
  size_t size_;
};

/// Runs every unit of `w` into `base` on `threads` threads (the calling one
/// included). Rethrows the error of the lowest failing unit, as the core does.
void run_units(BatchWork& w, uint8_t* base, int threads);

struct RunBatchesResult {
  int64_t batches = 0;
  int64_t bytes = 0;  ///< output bytes
  double seconds = 0;
};

/// Batches [first, first + count) of `plan` (those that exist), `threads`
/// threads taking whole batches in turn, each into its own reused buffer.
/// Rethrows the first error; the other threads stop at their next batch.
RunBatchesResult run_batches(const BatchProducer& producer, const EpochPlan& plan, int64_t first,
                             int64_t count, int threads);

}  // namespace stoker
