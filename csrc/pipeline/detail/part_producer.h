// The stream of a part (LoaderCore::run_part): the producer's segments cut to
// the part's length, so the workers plan nothing past the part's last batch
// (a part ends its iterator; work planned beyond it would be thrown away).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>

#include "pipeline/batch_producer.h"

namespace stoker::detail {

class PartProducer final : public BatchProducer {
 public:
  PartProducer(std::shared_ptr<const BatchProducer> inner, int64_t batches)
      : inner_(std::move(inner)), batches_(batches) {}

  int64_t num_batches(int64_t rank, int64_t world_size) const override {
    return inner_->num_batches(rank, world_size);
  }
  int64_t rank_samples(int64_t rank, int64_t world_size) const override {
    return inner_->rank_samples(rank, world_size);
  }
  int64_t epoch_samples() const override { return inner_->epoch_samples(); }
  int64_t consumed_after(const EpochKey& key, int64_t batches) const override {
    return inner_->consumed_after(key, batches);
  }
  std::shared_ptr<const EpochPlan> plan_epoch(const EpochKey& key) const override {
    return std::make_shared<const Plan>(inner_->plan_epoch(key), batches_);
  }
  std::unique_ptr<BatchWork> plan_batch(const EpochPlan& epoch, int64_t k) const override {
    return inner_->plan_batch(*static_cast<const Plan&>(epoch).inner, k);
  }
  void close() const override { inner_->close(); }

 private:
  struct Plan final : EpochPlan {
    Plan(std::shared_ptr<const EpochPlan> p, int64_t limit)
        : inner(std::move(p)), batches(std::min(limit, inner->num_batches())) {}
    int64_t num_batches() const override { return batches; }
    const std::shared_ptr<const EpochPlan> inner;
    const int64_t batches;
  };

  const std::shared_ptr<const BatchProducer> inner_;
  const int64_t batches_;
};

}  // namespace stoker::detail
