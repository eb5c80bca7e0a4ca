// Batches whose samples are made by the Python stage (NOTE [ Python stage ] in
// python/stoker/_stage/__init__.py): `map=` over a stoker dataset, or any
// map-style dataset. The C++ side only decides which samples make batch k:
// the same sampler as for records (permutation or shard windows, rank share,
// padding, resume offset), so ranks, epochs, len(loader) and resume are those
// of every other loader. The batch is handed off (pipeline/batch_handoff.h)
// with its sample indices and fills nothing itself.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "format/dataset.h"
#include "pipeline/batch_producer.h"
#include "sampler/sampler.h"

namespace stoker {

/// A planned batch of the Python stage: which samples, and which batch it is.
class PythonBatch final : public BatchWork {
 public:
  void run(int, uint8_t*, WorkerContext&) override {}

  std::vector<int64_t> indices;  ///< dataset index of each sample, in batch order
};

class PythonProducer final : public BatchProducer {
 public:
  /// Over `num_records` samples of an object without shards (a map-style dataset).
  PythonProducer(int64_t num_records, const SamplerOptions& opts);
  /// Over a stoker dataset: its shard layout (shard windows, the remote
  /// fetcher's schedule) and its records by range for a cold first batch.
  PythonProducer(std::shared_ptr<const Dataset> ds, const SamplerOptions& opts);

  int64_t num_batches(int64_t rank, int64_t world_size) const override;
  int64_t rank_samples(int64_t rank, int64_t world_size) const override;
  int64_t epoch_samples() const override {
    return sampler_batches(opts_) ? opts_.listed->num_samples() : n_;
  }
  int64_t consumed_after(const EpochKey& key, int64_t batches) const override;
  std::shared_ptr<const EpochPlan> plan_epoch(const EpochKey& key) const override;
  std::unique_ptr<BatchWork> plan_batch(const EpochPlan& epoch, int64_t k) const override;

  /// As RecordProducer::shard_schedule (a single "shard" without a dataset).
  std::vector<size_t> shard_schedule(uint64_t epoch, int64_t world_size, int64_t from_position,
                                     size_t max_shards) const;
  /// As RecordProducer::epoch_order: a remote dataset's fetch plan follows it.
  EpochOrder epoch_order(const EpochKey& key) const;

 private:
  std::shared_ptr<const Dataset> ds_;  // null for a map-style dataset
  SamplerOptions opts_;
  int64_t n_ = 0;
  std::vector<int64_t> shard_records_;
};

}  // namespace stoker
