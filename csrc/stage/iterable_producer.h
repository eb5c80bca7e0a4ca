// Batches of a source read in order whose length is known only at its end: an
// IterableDataset (NOTE [ Iterable datasets ] in python/stoker/_stage/iterable.py).
// The C++ side says which rows of the merged stream batch k holds; the Python
// stage reads them from the dataset's iterators, fills the batch and ends the
// epoch at the first batch with no row left (NOTE [ Open-ended epochs ] in
// pipeline/batch_producer.h), so the core owns the epochs, iterators, skip,
// resume state and stats as for every other source.
//
// Rows are counted from the start of the epoch's stream, globally: at a world
// size W (a loader that splits the stream between ranks), step k is rows
// [offset + k * B * W, offset + (k + 1) * B * W) and rank r's batch k is the r-th
// run of B rows in it. At W = 1 batch k is rows [offset + k * B, offset + (k + 1) * B).
#pragma once

#include <cstdint>
#include <memory>

#include "pipeline/batch_producer.h"

namespace stoker {

class IterableProducer final : public BatchProducer {
 public:
  explicit IterableProducer(int64_t batch_size);

  /// Unknown before the source ends: kUnknownBatches.
  int64_t num_batches(int64_t rank, int64_t world_size) const override;
  int64_t rank_samples(int64_t rank, int64_t world_size) const override;
  int64_t epoch_samples() const override { return kUnknownBatches; }
  /// The rows of the merged stream every rank has gone past after `batches` steps.
  int64_t consumed_after(const EpochKey& key, int64_t batches) const override;
  std::shared_ptr<const EpochPlan> plan_epoch(const EpochKey& key) const override;
  /// A PythonBatch (stage/python_producer.h) whose indices are its rows' numbers.
  std::unique_ptr<BatchWork> plan_batch(const EpochPlan& epoch, int64_t k) const override;

  int64_t batch_size() const { return batch_size_; }

 private:
  int64_t batch_size_;
};

}  // namespace stoker
