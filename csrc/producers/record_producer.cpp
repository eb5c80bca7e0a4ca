#include "producers/record_producer.h"

#include <algorithm>

#include "common/error.h"
#include "producers/batch_planner.h"

namespace stoker {

namespace {

class RecordEpoch final : public EpochPlan {
 public:
  RecordEpoch(EpochOrder order, uint64_t sample_seed)
      : order(std::move(order)), sample_seed(sample_seed) {}
  int64_t num_batches() const override { return order.num_batches(); }

  const EpochOrder order;
  const uint64_t sample_seed;
};

}  // namespace

std::shared_ptr<RecordSource> make_record_source(std::shared_ptr<const Dataset> ds,
                                                 const RecordOptions& opts) {
  STOKER_CHECK(ds != nullptr, UsageError, "RecordProducer: no dataset");
  auto source = std::make_shared<RecordSource>();
  const Schema& schema = ds->schema();
  auto image_field = [&](const std::string& name, const char* what) {
    const size_t f = schema.index_of(name);
    STOKER_CHECK(schema.fields[f].kind == FieldKind::kImage, UsageError, "field '", name,
                 "' is not an image field; ", what, " apply to stoker.image() fields only");
    return f;
  };
  for (const auto& [name, spec] : opts.images) image_field(name, "image options");
  // NOTE [ Random draws ]: each field is keyed by its group.
  std::vector<const TransformSpec*> group_of(schema.fields.size(), nullptr);
  source->draw_keys.resize(schema.fields.size());
  for (size_t f = 0; f < schema.fields.size(); ++f) source->draw_keys[f] = f;
  for (const TransformSpec& t : opts.transforms) {
    STOKER_CHECK(!t.fields.empty(), UsageError, "a transform names no field");
    // Groups need targets that follow the image (masks, boxes); until those
    // exist a group is one image field.
    STOKER_CHECK(t.fields.size() == 1, UsageError, "transforms of a group of fields (",
                 t.fields.size(), " fields, '", t.fields[0],
                 "', ...) are not supported: give each image field its own ops");
    for (const std::string& name : t.fields) {
      const size_t f = image_field(name, "image ops");
      STOKER_CHECK(group_of[f] == nullptr, UsageError, "field '", name,
                   "' has two lists of transforms");
      group_of[f] = &t;
      source->draw_keys[f] = schema.index_of(t.fields[0]);
    }
  }
  for (size_t f = 0; f < schema.fields.size(); ++f) {
    if (schema.fields[f].kind != FieldKind::kImage) {
      source->pipelines.emplace_back();
      continue;
    }
    auto it = opts.images.find(schema.fields[f].name);
    source->pipelines.push_back(
        std::make_unique<ImagePipeline>(it != opts.images.end() ? it->second : ImageFieldSpec{},
                                        group_of[f] ? group_of[f]->ops : std::vector<ImageOp>{}));
  }
  source->ds = std::move(ds);
  source->skip_errors = opts.skip_errors;
  return source;
}

RecordProducer::RecordProducer(std::shared_ptr<const Dataset> ds, RecordOptions opts)
    : source_(make_record_source(ds, opts)), opts_(std::move(opts)) {
  const Dataset& d = *source_->ds;
  shard_records_.reserve(d.num_shards());
  for (size_t s = 0; s < d.num_shards(); ++s) shard_records_.push_back(d.shard_info(s).num_records);
  // Validates the sampling options once, here, rather than at the first epoch.
  EpochOrder(shard_records_, opts_.sampler, 0, 0, 1, 0);
  // NOTE [ Warm mappings ]: the shards of epoch 0, in the whole job's order.
  const size_t budget = opts_.warm_bytes < 0 ? MappingWarmer::default_budget()
                                             : static_cast<size_t>(opts_.warm_bytes);
  std::vector<size_t> order;
  if (budget > 0 && !source_->ds->deferred())
    order = shard_schedule(0, 1, 0, source_->ds->num_shards());
  warmer_ = std::make_unique<MappingWarmer>(source_->ds, std::move(order), budget);
}

// Counts do not depend on the order, so they need no shard layout.
int64_t RecordProducer::num_batches(int64_t rank, int64_t world_size) const {
  return EpochOrder(source_->ds->size(), opts_.sampler, 0, rank, world_size, 0).num_batches();
}

int64_t RecordProducer::consumed_after(const EpochKey& key, int64_t batches) const {
  return EpochOrder(source_->ds->size(), opts_.sampler, key.epoch, key.rank, key.world_size,
                    key.offset, key.pad_from)
      .consumed_after(batches);
}

EpochOrder RecordProducer::epoch_order(const EpochKey& key) const {
  return EpochOrder(shard_records_, opts_.sampler, key.epoch, key.rank, key.world_size, key.offset,
                    key.pad_from);
}

std::vector<size_t> RecordProducer::shard_schedule(uint64_t epoch, int64_t world_size,
                                                   int64_t from_position, size_t max_shards) const {
  EpochKey key;
  key.epoch = epoch;
  key.world_size = world_size;  // rank 0: the schedule is the whole job's
  return epoch_order(key).shard_schedule(from_position, max_shards);
}

std::shared_ptr<const EpochPlan> RecordProducer::plan_epoch(const EpochKey& key) const {
  return std::make_shared<RecordEpoch>(epoch_order(key),
                                       hash_combine(opts_.sampler.seed, key.epoch));
}

std::unique_ptr<BatchWork> RecordProducer::plan_batch(const EpochPlan& epoch, int64_t k) const {
  const auto& e = static_cast<const RecordEpoch&>(epoch);
  const int64_t len = e.order.batch_length(k);
  std::vector<int64_t> indices(static_cast<size_t>(len));
  e.order.batch_indices(k, indices.data());
  // A URL's shards not local yet: the first batch's records are asked for by range
  // now, together (NOTE [ Records by range ] in format/record_ranges.h).
  if (k == 0) source_->ds->want_records(indices.data(), indices.size());
  // About four units per thread, so the first batch is ready after 1/T of its work.
  int64_t unit = opts_.unit_samples;
  if (unit <= 0) {
    const int64_t parts = 4 * std::max(1, opts_.threads_hint);
    unit = std::max<int64_t>(1, (opts_.sampler.batch_size + parts - 1) / parts);
  }
  unit = std::max<int64_t>(unit, (len + 65534) / 65535);  // at most 65535 units
  auto b = std::make_unique<RecordBatch>(source_, e.sample_seed);
  plan_record_batch(*source_, std::move(indices), unit, *b);
  b->handoff = opts_.handoff;
  return b;
}

}  // namespace stoker
