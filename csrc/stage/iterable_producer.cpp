#include "stage/iterable_producer.h"

#include <algorithm>

#include "common/error.h"
#include "stage/python_producer.h"

namespace stoker {

namespace {

class IterableEpoch final : public EpochPlan {
 public:
  explicit IterableEpoch(const EpochKey& key) : key(key) {}
  int64_t num_batches() const override { return kUnknownBatches; }

  const EpochKey key;
};

}  // namespace

IterableProducer::IterableProducer(int64_t batch_size) : batch_size_(batch_size) {
  STOKER_CHECK(batch_size >= 1, UsageError, "batch_size must be >= 1, got ", batch_size);
}

int64_t IterableProducer::num_batches(int64_t, int64_t) const { return kUnknownBatches; }

int64_t IterableProducer::rank_samples(int64_t, int64_t) const { return kUnknownBatches; }

int64_t IterableProducer::consumed_after(const EpochKey& key, int64_t batches) const {
  return key.offset + batches * batch_size_ * std::max<int64_t>(1, key.world_size);
}

std::shared_ptr<const EpochPlan> IterableProducer::plan_epoch(const EpochKey& key) const {
  STOKER_CHECK(key.world_size >= 1 && key.rank >= 0 && key.rank < key.world_size, UsageError,
               "rank ", key.rank, " outside [0, world_size=", key.world_size, ")");
  return std::make_shared<IterableEpoch>(key);
}

std::unique_ptr<BatchWork> IterableProducer::plan_batch(const EpochPlan& epoch, int64_t k) const {
  const EpochKey& key = static_cast<const IterableEpoch&>(epoch).key;
  auto b = std::make_unique<PythonBatch>();
  const int64_t first = key.offset + (k * key.world_size + key.rank) * batch_size_;
  b->indices.resize(static_cast<size_t>(batch_size_));
  for (int64_t i = 0; i < batch_size_; ++i) b->indices[static_cast<size_t>(i)] = first + i;
  b->samples = batch_size_;
  b->units = 1;
  b->bytes = 0;
  b->handoff = true;
  return b;
}

}  // namespace stoker
