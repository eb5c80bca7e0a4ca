#include "stage/python_producer.h"

#include "common/error.h"

namespace stoker {

namespace {

class PythonEpoch final : public EpochPlan {
 public:
  explicit PythonEpoch(EpochOrder order) : order(std::move(order)) {}
  int64_t num_batches() const override { return order.num_batches(); }

  const EpochOrder order;
};

}  // namespace

PythonProducer::PythonProducer(int64_t num_records, const SamplerOptions& opts)
    : opts_(opts), n_(num_records), shard_records_{num_records} {
  STOKER_CHECK(num_records >= 0, UsageError, "a dataset of ", num_records, " samples");
  STOKER_CHECK(opts.shard_window == 0, UsageError,
               "shard_window needs a stoker dataset (a map-style dataset has no shards)");
  if (!sampler_batches(opts_))  // validates the options
    EpochOrder(shard_records_, counting_options(opts_), 0, 0, 1, 0);
}

PythonProducer::PythonProducer(std::shared_ptr<const Dataset> ds, const SamplerOptions& opts)
    : ds_(std::move(ds)), opts_(opts) {
  STOKER_CHECK(ds_ != nullptr, UsageError, "PythonProducer: no dataset");
  n_ = ds_->size();
  shard_records_.reserve(ds_->num_shards());
  for (size_t s = 0; s < ds_->num_shards(); ++s)
    shard_records_.push_back(ds_->shard_info(s).num_records);
  if (!sampler_batches(opts_)) EpochOrder(shard_records_, counting_options(opts_), 0, 0, 1, 0);
}

int64_t PythonProducer::num_batches(int64_t rank, int64_t world_size) const {
  if (sampler_batches(opts_)) return opts_.listed->num_batches();
  return EpochOrder(n_, counting_options(opts_), 0, rank, world_size, 0).num_batches();
}

int64_t PythonProducer::rank_samples(int64_t rank, int64_t world_size) const {
  if (sampler_batches(opts_)) return opts_.listed->num_samples();
  return EpochOrder(n_, counting_options(opts_), 0, rank, world_size, 0).num_samples();
}

int64_t PythonProducer::consumed_after(const EpochKey& key, int64_t batches) const {
  return EpochOrder(n_, counting_options(opts_), key.epoch, key.rank, key.world_size, key.offset,
                    key.pad_from)
      .consumed_after(batches);
}

EpochOrder PythonProducer::epoch_order(const EpochKey& key) const {
  return EpochOrder(shard_records_, opts_, key.epoch, key.rank, key.world_size, key.offset,
                    key.pad_from);
}

std::vector<size_t> PythonProducer::shard_schedule(uint64_t epoch, int64_t world_size,
                                                   int64_t from_position, size_t max_shards) const {
  EpochKey key;
  key.epoch = epoch;
  key.world_size = world_size;
  return epoch_order(key).shard_schedule(from_position, max_shards);
}

std::shared_ptr<const EpochPlan> PythonProducer::plan_epoch(const EpochKey& key) const {
  return std::make_shared<PythonEpoch>(epoch_order(key));
}

std::unique_ptr<BatchWork> PythonProducer::plan_batch(const EpochPlan& epoch, int64_t k) const {
  const auto& e = static_cast<const PythonEpoch&>(epoch);
  auto b = std::make_unique<PythonBatch>();
  const int64_t len = e.order.batch_length(k);
  b->indices.resize(static_cast<size_t>(len));
  e.order.batch_indices(k, b->indices.data());
  // A URL's shards not local yet: the first batch's records are asked for by
  // range now, together (NOTE [ Records by range ] in format/record_ranges.h).
  if (k == 0 && ds_) ds_->want_records(b->indices.data(), b->indices.size());
  b->samples = len;
  b->units = 1;
  b->bytes = 0;
  b->handoff = true;
  return b;
}

}  // namespace stoker
