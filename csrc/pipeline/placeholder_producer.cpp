#include "pipeline/placeholder_producer.h"

#include <utility>

#include "common/error.h"

namespace stoker {

namespace {

class PlaceholderWork final : public BatchWork {
 public:
  void run(int /*u*/, uint8_t* /*base*/, WorkerContext& /*ctx*/) override {}
};

}  // namespace

PlaceholderProducer::PlaceholderProducer(std::shared_ptr<const BatchProducer> inner)
    : inner_(std::move(inner)) {
  STOKER_CHECK(inner_ != nullptr, UsageError, "PlaceholderProducer: no producer");
}

int64_t PlaceholderProducer::num_batches(int64_t rank, int64_t world_size) const {
  return inner_->num_batches(rank, world_size);
}

int64_t PlaceholderProducer::rank_samples(int64_t rank, int64_t world_size) const {
  return inner_->rank_samples(rank, world_size);
}

int64_t PlaceholderProducer::epoch_samples() const { return inner_->epoch_samples(); }

int64_t PlaceholderProducer::consumed_after(const EpochKey& key, int64_t batches) const {
  return inner_->consumed_after(key, batches);
}

std::shared_ptr<const EpochPlan> PlaceholderProducer::plan_epoch(const EpochKey& key) const {
  return inner_->plan_epoch(key);
}

std::unique_ptr<BatchWork> PlaceholderProducer::plan_batch(const EpochPlan& epoch,
                                                           int64_t k) const {
  STOKER_CHECK(k >= 0 && k < epoch.num_batches(), UsageError, "batch ", k, " out of range [0, ",
               epoch.num_batches(), ")");
  return std::make_unique<PlaceholderWork>();
}

void PlaceholderProducer::close() const { inner_->close(); }

}  // namespace stoker
