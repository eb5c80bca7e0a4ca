// A producer's epochs without its batches, for a loader whose batches are made
// elsewhere (python/stoker/service/: Ray actors running the same pipeline).
//
// NOTE [ Placeholder batches ]
// Such a loader still needs everything its core owns (NOTE [ Epochs and
// iterators ]): which epoch an iterator claims, skip(), load_state(), the
// resume state counted from the batches the consumer took, len(), the
// window, the loop's time in next(). So it keeps its core, over this producer:
// every count and every epoch plan is the real producer's, and batch k of a
// segment is a placeholder (no tensor, no memory, one unit that does
// nothing). The consumer reads the segment's key from its iterator and fetches
// batch k from where it is made, then takes the placeholder, which counts it:
// the state moves exactly as the local loader's would, and never past a batch
// the consumer did not get.
#pragma once

#include <cstdint>
#include <memory>

#include "pipeline/batch_producer.h"

namespace stoker {

class PlaceholderProducer final : public BatchProducer {
 public:
  /// @param inner the producer whose epochs, counts and resume positions are kept
  explicit PlaceholderProducer(std::shared_ptr<const BatchProducer> inner);

  int64_t num_batches(int64_t rank, int64_t world_size) const override;
  int64_t rank_samples(int64_t rank, int64_t world_size) const override;
  int64_t epoch_samples() const override;
  int64_t consumed_after(const EpochKey& key, int64_t batches) const override;
  std::shared_ptr<const EpochPlan> plan_epoch(const EpochKey& key) const override;
  /// A batch with no tensor; its key and index are set by the stream.
  std::unique_ptr<BatchWork> plan_batch(const EpochPlan& epoch, int64_t k) const override;
  void close() const override;

 private:
  std::shared_ptr<const BatchProducer> inner_;
};

}  // namespace stoker
